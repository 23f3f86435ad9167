#include "tools/local_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <google/protobuf/text_format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/auth.h"
#include "common/config.h"
#include "common/idx_reader.h"
#include "common/log.h"
#include "common/tls.h"
#include "worker/dataset.h"
#include "worker/ps_client.h"

namespace monsoon::tools {

std::string ExecutablePath() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  return n > 0 ? std::string(path, static_cast<size_t>(n)) : "";
}

std::string DefaultBinDir() {
  const std::string exe = ExecutablePath();
  if (exe.empty()) return ".";
  const std::string dir = exe.substr(0, exe.rfind('/'));
  return dir.substr(0, dir.rfind('/'));
}
absl::Status MakeThrowawayCerts(const std::string& dir) {
  const std::string script =
      ExecutablePath() + ".runfiles/monsoon/tools/make_certs.sh";
  if (access(script.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(
        script,
        " not found: make certificates with tools/make_certs.sh DIR "
        "and pass --tls_dir=DIR"));
  }
  std::string output;
  absl::StatusOr<int> code = RunCommand({script, dir}, &output);
  if (!code.ok()) return code.status();
  if (*code != 0) {
    return absl::InternalError(absl::StrCat(
        "tools/make_certs.sh ", dir, " failed (exit ", *code, "): ", output));
  }
  return absl::OkStatus();
}

namespace {

bool ReadFile(const std::string& path, std::string* text) {
  std::ifstream in(path);
  if (!in) return false;
  std::stringstream buffer;
  buffer << in.rdbuf();
  *text = buffer.str();
  return true;
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// A child that exited while it should not have: the run cannot go on.
absl::Status ChildFailed(const ProcessSupervisor& s, int id) {
  return absl::InternalError(absl::StrCat(
      s.role(id), " exited with code ", s.exit_code(id),
      " (its log lines above say why); command: ", s.command_line(id)));
}

// The examples the workers trained, the time from the first step to the
// last and where the steps' time went, from the report each process wrote as it
// stopped (a worker killed by SIGKILL writes none: its steps are not counted).
absl::Status ReadWorkerReports(const std::vector<std::string>& paths,
                               RunMetrics* metrics) {
  double first = 0, last = 0;
  for (const std::string& path : paths) {
    std::string text;
    WorkerReport report;
    if (!ReadFile(path, &text) ||
        !google::protobuf::TextFormat::ParseFromString(text, &report)) {
      return absl::InternalError(
          absl::StrCat("a worker left no readable report in ", path));
    }
    metrics->trained_samples += report.samples();
    AddWorkerPhases(report, metrics);
    if (report.steps() == 0) continue;
    if (first == 0 || report.first_step_unix_s() < first) {
      first = report.first_step_unix_s();
    }
    last = std::max(last, report.last_step_unix_s());
  }
  metrics->train_time_s = std::max(0.0, last - first);
  return absl::OkStatus();
}

// The examples one epoch of every worker trains: each worker does the
// smallest partition's whole batches (worker/training_loop.h). Reads only
// the training labels' header and bytes; 0 when they cannot be read.
int64_t ExamplesPerEpoch(const TrainingConfig& config, int workers) {
  for (const char* name :
       {"/train-labels-idx1-ubyte.gz", "/train-labels-idx1-ubyte"}) {
    absl::StatusOr<common::IdxArray> labels =
        common::ReadIdxFile(config.data_dir() + name);
    if (!labels.ok() || labels->dims.empty()) continue;
    const int64_t batch = std::max(1, config.batch_size());
    return workers *
           (worker::SmallestPartition(labels->dims[0], workers) / batch) *
           batch;
  }
  return 0;
}

// Reads a run's progress from its daemons about once a second on a thread
// of its own (started by the constructor, joined by the destructor): the
// shards' Stats through a client of its own, and the evaluator's curve
// file. A shard that does not answer holds up only this thread, never the
// supervisor's loop. Take() is safe from any one other thread.
class ProgressPoller {
 public:
  ProgressPoller(worker::PsClientOptions client_options, std::string curve_path,
                 absl::Time start, int64_t examples_per_epoch, int epochs)
      : client_options_(std::move(client_options)),
        curve_path_(std::move(curve_path)),
        start_(start),
        examples_per_epoch_(examples_per_epoch),
        epochs_(epochs),
        thread_([this] { Loop(); }) {}

  ~ProgressPoller() {
    stop_.Notify();
    thread_.join();
  }

  // The newest sample since the last call, if there is one.
  std::optional<RunProgressSample> Take() {
    absl::MutexLock lock(&mu_);
    std::optional<RunProgressSample> sample = std::move(latest_);
    latest_.reset();
    return sample;
  }

 private:
  void Loop() {
    worker::PsClientOptions client_options = client_options_;
    client_options.stop = &stop_;  // the destructor ends a Connect's wait
    std::unique_ptr<worker::PsClient> client;
    RunProgressSample sample;
    sample.epochs = epochs_;
    if (examples_per_epoch_ > 0) sample.epoch = 1;
    absl::Time last_stats;  // when `sample.samples` was read
    bool have_stats = false;
    int curve_points = 0;  // in the last curve read whole
    while (!stop_.HasBeenNotified()) {
      if (client == nullptr) {
        // A shard may be down (a fault at the start): retried next time.
        absl::StatusOr<std::unique_ptr<worker::PsClient>> connected =
            worker::PsClient::Connect(client_options);
        if (connected.ok()) client = *std::move(connected);
      }
      if (client != nullptr) {
        absl::StatusOr<std::vector<StatsResponse>> stats =
            client->Stats(absl::Seconds(1));
        const absl::Time now = absl::Now();
        if (stats.ok() && !stats->empty()) {
          const StatsResponse& shard0 = (*stats)[0];
          // A shard restarted from a checkpoint may count fewer examples
          // than before: no rate across that.
          if (have_stats && now > last_stats &&
              shard0.samples() >= sample.samples) {
            sample.samples_per_s = (shard0.samples() - sample.samples) /
                                   absl::ToDoubleSeconds(now - last_stats);
          }
          have_stats = true;
          last_stats = now;
          sample.samples = shard0.samples();
          sample.version = shard0.version();
          if (examples_per_epoch_ > 0) {
            sample.epoch = static_cast<int>(std::min<int64_t>(
                epochs_, sample.samples / examples_per_epoch_ + 1));
          }
        } else {
          // A shard that does not answer in a second (stopped, restarting)
          // holds up the workers too. The next answer's rate spans the gap.
          sample.samples_per_s = 0;
        }
      }
      // The evaluator rewrites the file after every point, so it may be
      // missing or caught half written. A truncated point leaves a brace
      // open and does not parse; a file cut between points parses with
      // fewer points than already seen: both are skipped.
      std::string text;
      EvalCurve curve;
      if (ReadFile(curve_path_, &text) &&
          google::protobuf::TextFormat::ParseFromString(text, &curve) &&
          curve.points_size() > 0 && curve.points_size() >= curve_points) {
        curve_points = curve.points_size();
        const EvalPoint& last = curve.points(curve.points_size() - 1);
        sample.evaluated = true;
        sample.test_accuracy = last.test_accuracy();
        sample.eval_time_s = last.time_s();
      }
      sample.time_s = absl::ToDoubleSeconds(absl::Now() - start_);
      {
        absl::MutexLock lock(&mu_);
        latest_ = sample;
      }
      stop_.WaitForNotificationWithTimeout(absl::Seconds(1));
    }
  }

  // Constant after construction.
  const worker::PsClientOptions client_options_;
  const std::string curve_path_;
  const absl::Time start_;
  const int64_t examples_per_epoch_;
  const int epochs_;

  absl::Notification stop_;
  absl::Mutex mu_;
  std::optional<RunProgressSample> latest_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: it uses the members above
};

// One server or worker of the run, across its restarts.
struct Daemon {
  std::string role;               // "server 1"
  std::vector<std::string> argv;  // of the next start
  std::vector<std::string> env;
  int id = -1;  // the supervisor's id of the current process
  int restarts = 0;
  bool restart_pending = false;
  absl::Time restart_at;
  bool finished = false;  // a worker that is done
  bool stopped = false;   // SIGSTOPped by a fault
  absl::Time continue_at;
  std::string report;  // a worker's --report_out for the current process
};

// Replaces the argument that starts with `prefix` ("--listen=") by `arg`.
void SetArg(std::vector<std::string>* argv, const std::string& prefix,
            const std::string& arg) {
  for (std::string& a : *argv) {
    if (a.rfind(prefix, 0) == 0) {
      a = arg;
      return;
    }
  }
  argv->push_back(arg);
}

// `argv` run through `prefix` (e.g. ip netns exec HOST).
std::vector<std::string> Placed(const std::vector<std::string>& prefix,
                                const std::vector<std::string>& argv) {
  std::vector<std::string> placed = prefix;
  placed.insert(placed.end(), argv.begin(), argv.end());
  return placed;
}

}  // namespace

absl::StatusOr<int> FreePortRange(int count) {
  auto bind_loopback = [](int port) -> int {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      close(fd);
      return -1;
    }
    return fd;
  };
  for (int attempt = 0; attempt < 200; ++attempt) {
    // The kernel's pick of a free port, then the ones after it.
    const int probe = bind_loopback(0);
    if (probe < 0) break;
    sockaddr_in bound{};
    socklen_t length = sizeof(bound);
    getsockname(probe, reinterpret_cast<sockaddr*>(&bound), &length);
    close(probe);
    const int first = ntohs(bound.sin_port);
    if (first + count > 65536) continue;
    std::vector<int> held;
    for (int port = first; port < first + count; ++port) {
      const int fd = bind_loopback(port);
      if (fd < 0) break;
      held.push_back(fd);
    }
    const bool all = static_cast<int>(held.size()) == count;
    for (int fd : held) close(fd);
    if (all) return first;
  }
  return absl::UnavailableError(
      absl::StrCat("found no ", count,
                   " consecutive free ports on 127.0.0.1 for metrics; "
                   "give --metrics_port=PORT, or 0 for no metrics"));
}

absl::StatusOr<RunMetrics> RunLocalCluster(const LocalClusterOptions& options,
                                           ProcessSupervisor* supervisor) {
  ProcessSupervisor& sup = *supervisor;
  const bool placed = options.placement != nullptr;
  if (placed && options.metrics_port != 0) {
    return absl::InvalidArgumentError(
        "metrics are served on 127.0.0.1, which the emulated hosts of --link "
        "do not share with this machine: leave --metrics_port off with "
        "--link");
  }
  const std::string config_path = options.work_dir + "/config.textproto";
  if (auto s = WriteFile(config_path, common::ConfigToText(options.config));
      !s.ok()) {
    return s;
  }
  // A fresh secret per run: a process of another run, or anyone else on
  // the machine, cannot join or read this one.
  absl::StatusOr<std::string> token = common::NewToken();
  if (!token.ok()) return token.status();
  const std::string token_path = options.work_dir + "/auth_token";
  {
    std::remove(token_path.c_str());
    const int fd = open(token_path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || write(fd, token->data(), token->size()) !=
                      static_cast<ssize_t>(token->size())) {
      if (fd >= 0) close(fd);
      return absl::InternalError(absl::StrCat("cannot write ", token_path));
    }
    close(fd);
  }
  const std::string token_flag = "--auth_token_file=" + token_path;
  // Mutual TLS: the servers' and the clients' certificates from one CA.
  std::vector<std::string> server_tls, client_tls;
  common::TlsFiles launcher_tls;
  if (!options.tls_dir.empty()) {
    const std::string& d = options.tls_dir;
    server_tls = {"--tls_cert=" + d + "/server.pem",
                  "--tls_key=" + d + "/server.key",
                  "--tls_ca=" + d + "/ca.pem"};
    client_tls = {"--tls_cert=" + d + "/client.pem",
                  "--tls_key=" + d + "/client.key",
                  "--tls_ca=" + d + "/ca.pem"};
    launcher_tls = {d + "/client.pem", d + "/client.key", d + "/ca.pem"};
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
      launcher_credentials = common::ChannelCredentialsFrom(launcher_tls);
  if (!launcher_credentials.ok()) return launcher_credentials.status();
  const std::string S = absl::StrCat(options.servers);
  const std::string W = absl::StrCat(options.workers);
  const bool restarts = options.max_restarts > 0;
  const std::string checkpoint_dir = options.work_dir + "/checkpoints";
  if (restarts) {
    // A new run: no shard may resume from an earlier run's checkpoints.
    std::error_code error;
    std::filesystem::remove_all(checkpoint_dir, error);
    std::filesystem::create_directories(checkpoint_dir, error);
    if (error) {
      return absl::InternalError(absl::StrCat("cannot create ", checkpoint_dir,
                                              ": ", error.message()));
    }
  }

  // The daemons log as the launcher does.
  const bool json_logs = common::CurrentLogFormat() == common::LogFormat::kJson;

  // Metrics ports, and the targets file Prometheus can watch.
  auto metrics_flag = [&](int offset) {
    return absl::StrCat("--metrics_listen=127.0.0.1:",
                        options.metrics_port + offset);
  };
  if (options.metrics_port != 0) {
    std::string targets = "[\n";
    auto add = [&](int offset, const std::string& role, int index, bool last) {
      absl::StrAppend(&targets, "  {\"targets\": [\"127.0.0.1:",
                      options.metrics_port + offset,
                      "\"], \"labels\": {\"role\": \"", role, "\"");
      if (index >= 0) absl::StrAppend(&targets, ", \"index\": \"", index, "\"");
      absl::StrAppend(&targets, "}}", last ? "\n" : ",\n");
    };
    for (int s = 0; s < options.servers; ++s) add(s, "shard", s, false);
    for (int r = 0; r < options.workers; ++r) {
      add(options.servers + r, "worker", r, false);
    }
    add(options.servers + options.workers, "evaluator", -1, true);
    targets += "]\n";
    const std::string path = options.work_dir + "/metrics_targets.json";
    std::ofstream out(path);
    out << targets;
    if (!out.good()) {
      return absl::InternalError(absl::StrCat("cannot write ", path));
    }
  }

  // 1. Servers on free ports; each writes its port once it listens.
  std::vector<int> servers;
  std::vector<Daemon> server_daemons(options.servers);
  std::vector<std::string> port_files;
  for (int s = 0; s < options.servers; ++s) {
    port_files.push_back(
        absl::StrCat(options.work_dir, "/server-", s, ".port"));
    std::remove(port_files.back().c_str());
    std::vector<std::string> argv = {
        options.bin_dir + "/server/ps_server",
        absl::StrCat("--shard=", s),
        "--num_shards=" + S,
        "--num_workers=" + W,
        "--listen=" + (placed ? options.placement->server_listen[s]
                              : std::string("127.0.0.1:0")),
        "--port_file=" + port_files.back(),
        "--config=" + config_path,
        absl::StrCat("--lease_s=", options.lease_s),
        token_flag};
    argv.insert(argv.end(), server_tls.begin(), server_tls.end());
    if (options.metrics_port != 0) argv.push_back(metrics_flag(s));
    if (json_logs) argv.push_back("--log_format=json");
    if (restarts) {
      argv.push_back("--checkpoint_dir=" + checkpoint_dir);
      argv.push_back(absl::StrCat("--checkpoint_interval_s=",
                                  options.checkpoint_interval_s));
    }
    if (placed) argv = Placed(options.placement->server_prefix[s], argv);
    Daemon& daemon = server_daemons[s];
    daemon.role = absl::StrCat("server ", s);
    daemon.argv = argv;
    absl::StatusOr<int> id = sup.Start(daemon.role, argv);
    if (!id.ok()) return id.status();
    daemon.id = *id;
    servers.push_back(*id);
  }
  std::vector<std::string> addresses(options.servers);
  absl::Status failed;
  auto servers_ready = [&] {
    bool all = true;
    for (int s = 0; s < options.servers; ++s) {
      if (!sup.running(servers[s])) {
        failed = ChildFailed(sup, servers[s]);
        return true;
      }
      std::string text;
      int port = 0;
      if (addresses[s].empty() && ReadFile(port_files[s], &text) &&
          absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port)) {
        addresses[s] = absl::StrCat("127.0.0.1:", port);
      }
      all = all && !addresses[s].empty();
    }
    return all;
  };
  absl::Status status =
      sup.Pump(servers_ready, absl::Seconds(options.start_timeout_s));
  if (status.ok()) status = failed;
  if (status.code() == absl::StatusCode::kDeadlineExceeded) {
    status = absl::DeadlineExceededError(
        absl::StrCat("the servers did not start listening within ",
                     options.start_timeout_s, " s"));
  }
  if (!status.ok()) return status;
  if (!placed) {
    // A restarted server listens where its workers look for it.
    for (int s = 0; s < options.servers; ++s) {
      SetArg(&server_daemons[s].argv, "--listen=", "--listen=" + addresses[s]);
    }
  }
  if (placed) addresses = options.placement->control_addresses;
  const std::string server_list = absl::StrJoin(addresses, ",");
  const std::string worker_server_list =
      placed ? absl::StrJoin(options.placement->worker_addresses, ",")
             : server_list;
  common::Log("launch: %d servers up at %s", options.servers,
              worker_server_list);
  // What each worker dials: the servers, or where the kernel cannot delay
  // the links, a delay proxy per server on the worker's host.
  std::vector<std::string> worker_lists(options.workers, worker_server_list);
  if (placed && options.placement->proxy_delay_ms > 0) {
    std::vector<std::string> proxy_files;
    std::vector<int> proxies;
    for (int r = 0; r < options.workers; ++r) {
      for (int s = 0; s < options.servers; ++s) {
        proxy_files.push_back(
            absl::StrCat(options.work_dir, "/proxy-", r, "-", s, ".port"));
        std::remove(proxy_files.back().c_str());
        absl::StatusOr<int> id = sup.Start(
            absl::StrCat("proxy ", r, "-", s),
            Placed(
                options.placement->worker_prefix[r],
                {options.bin_dir + "/tools/delay_proxy", "--listen=127.0.0.1:0",
                 "--target=" + options.placement->worker_addresses[s],
                 absl::StrCat("--delay_ms=", options.placement->proxy_delay_ms),
                 "--port_file=" + proxy_files.back()}));
        if (!id.ok()) return id.status();
        proxies.push_back(*id);
      }
    }
    std::vector<std::string> ports(proxies.size());
    absl::Status proxy_failed;
    auto proxies_ready = [&] {
      bool all = true;
      for (size_t i = 0; i < proxies.size(); ++i) {
        if (!sup.running(proxies[i])) {
          proxy_failed = ChildFailed(sup, proxies[i]);
          return true;
        }
        std::string text;
        int port = 0;
        if (ports[i].empty() && ReadFile(proxy_files[i], &text) &&
            absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port)) {
          ports[i] = absl::StrCat("127.0.0.1:", port);
        }
        all = all && !ports[i].empty();
      }
      return all;
    };
    absl::Status status = sup.Pump(proxies_ready, absl::Seconds(30));
    if (status.ok()) status = proxy_failed;
    if (!status.ok()) return status;
    for (int r = 0; r < options.workers; ++r) {
      worker_lists[r] =
          absl::StrJoin(ports.begin() + r * options.servers,
                        ports.begin() + (r + 1) * options.servers, ",");
    }
    common::Log(
        "launch: delay proxies on the workers' hosts add %g ms each "
        "way",
        options.placement->proxy_delay_ms);
  }

  // 2. The evaluator and the workers, started together: the curve's time 0
  // is the start of training.
  const std::string curve_path = options.work_dir + "/curve.textproto";
  std::remove(curve_path.c_str());
  const absl::Time start = absl::Now();
  std::vector<std::string> evaluator_argv = {
      options.bin_dir + "/worker/ps_evaluator",
      "--servers=" + server_list,
      "--config=" + config_path,
      "--device=" + options.device,
      absl::StrCat("--interval_s=", options.eval_interval_s),
      "--curve_out=" + curve_path,
      token_flag};
  evaluator_argv.insert(evaluator_argv.end(), client_tls.begin(),
                        client_tls.end());
  if (options.metrics_port != 0) {
    evaluator_argv.push_back(metrics_flag(options.servers + options.workers));
  }
  if (json_logs) evaluator_argv.push_back("--log_format=json");
  absl::StatusOr<int> evaluator = sup.Start("eval", evaluator_argv);
  if (!evaluator.ok()) return evaluator.status();
  std::vector<Daemon> worker_daemons(options.workers);
  std::vector<std::string> report_paths;  // of the workers that stopped
  for (int r = 0; r < options.workers; ++r) {
    Daemon& daemon = worker_daemons[r];
    daemon.role = absl::StrCat("worker ", r);
    daemon.report = absl::StrCat(options.work_dir, "/worker-", r, ".report");
    std::remove(daemon.report.c_str());
    daemon.argv = {options.bin_dir + "/worker/ps_worker",
                   absl::StrCat("--rank=", r),
                   "--num_workers=" + W,
                   "--servers=" + worker_lists[r],
                   "--config=" + config_path,
                   "--device=" + options.device,
                   "--report_out=" + daemon.report,
                   token_flag};
    daemon.argv.insert(daemon.argv.end(), client_tls.begin(), client_tls.end());
    if (options.metrics_port != 0) {
      daemon.argv.push_back(metrics_flag(options.servers + r));
      if (options.metrics_linger_s > 0) {
        daemon.argv.push_back(
            absl::StrCat("--metrics_linger_s=", options.metrics_linger_s));
      }
    }
    if (json_logs) daemon.argv.push_back("--log_format=json");
    if (auto it = options.slowdown.find(r); it != options.slowdown.end()) {
      daemon.argv.push_back(absl::StrCat("--slowdown=", it->second));
    }
    if (placed) {
      daemon.argv = Placed(options.placement->worker_prefix[r], daemon.argv);
    }
    daemon.env = {"OPENBLAS_NUM_THREADS=1"};
    absl::StatusOr<int> id = sup.Start(daemon.role, daemon.argv, daemon.env);
    if (!id.ok()) return id.status();
    daemon.id = *id;
  }

  // The launcher's own client of the shards: the progress poller's, and the
  // one that reads their counters at the end.
  worker::PsClientOptions client_options;
  client_options.server_addresses = addresses;
  client_options.config = options.config;
  client_options.worker_rank = -1;
  client_options.connect_timeout = absl::Seconds(10);
  client_options.auth_token = *token;
  client_options.credentials = *launcher_credentials;
  std::unique_ptr<ProgressPoller> poller;
  if (options.on_progress) {
    worker::PsClientOptions poller_options = client_options;
    // Short, so that stopping the poller never waits long for a shard that
    // is down; it tries again a second later.
    poller_options.connect_timeout = absl::Seconds(1);
    poller = std::make_unique<ProgressPoller>(
        poller_options, curve_path, start,
        ExamplesPerEpoch(options.config, options.workers),
        options.config.epochs());
  }

  // 3. Training: until every worker is done. A daemon that dies is started
  // again after a pause (1 s, doubling per restart), up to max_restarts
  // times; after that, or with restarts off, the run fails.
  bool limit_reached = false;
  const int kStoppedBySigterm = 128 + SIGTERM;
  constexpr int kConfigError = 2;
  RunMetrics metrics;
  size_t next_fault = 0;
  auto event = [&](const std::string& what) {
    const double t = absl::ToDoubleSeconds(absl::Now() - start);
    common::Log("launch: %.1f s: %s", t, what);
    metrics.events.push_back({t, what});
  };
  auto daemon_of = [&](const Fault& fault) -> Daemon& {
    return fault.server ? server_daemons[fault.index]
                        : worker_daemons[fault.index];
  };
  // Whether `daemon`, no longer running, may go on: a worker that finished,
  // or one to restart. Sets `failed` when the run cannot go on.
  auto handle_exit = [&](Daemon& daemon, bool worker) {
    const int code = sup.exit_code(daemon.id);
    daemon.stopped = false;
    if (worker) {
      if (code == 0 || code == kStoppedBySigterm) {
        report_paths.push_back(daemon.report);
      }
      if (code == 0 || limit_reached) {
        daemon.finished = true;
        return true;
      }
      if (code == kConfigError && daemon.restarts > 0) {
        // The same flags as a start that ran: the shards hold every step
        // of this rank (the others finished the run without it).
        event(absl::StrCat(daemon.role, " (restarted) has nothing left"));
        daemon.finished = true;
        return true;
      }
    }
    if (code == kConfigError || daemon.restarts >= options.max_restarts) {
      failed = ChildFailed(sup, daemon.id);
      if (daemon.restarts > 0) {
        failed = absl::InternalError(absl::StrCat(
            failed.message(), "; it was restarted ", daemon.restarts,
            " times, the most --max_restarts allows"));
      }
      return false;
    }
    ++daemon.restarts;
    ++metrics.restarts;
    const absl::Duration pause =
        std::min(absl::Seconds(1) * (1 << std::min(daemon.restarts - 1, 4)),
                 absl::Seconds(10));
    daemon.restart_pending = true;
    daemon.restart_at = absl::Now() + pause;
    event(absl::StrCat(daemon.role, " exited with code ", code,
                       "; restarting it in ", absl::FormatDuration(pause),
                       " (restart ", daemon.restarts, " of at most ",
                       options.max_restarts, ")"));
    return true;
  };
  auto restart = [&](Daemon& daemon, bool worker) {
    daemon.restart_pending = false;
    if (worker) {
      daemon.report = absl::StrCat(options.work_dir, "/", "worker-",
                                   &daemon - worker_daemons.data(), "-restart-",
                                   daemon.restarts, ".report");
      std::remove(daemon.report.c_str());
      SetArg(&daemon.argv, "--report_out=", "--report_out=" + daemon.report);
    }
    absl::StatusOr<int> id = sup.Start(daemon.role, daemon.argv, daemon.env);
    if (!id.ok()) {
      failed = id.status();
      return false;
    }
    daemon.id = *id;
    if (!worker) servers[&daemon - server_daemons.data()] = *id;
    event(absl::StrCat("restarted ", daemon.role));
    return true;
  };
  auto training_done = [&] {
    if (poller != nullptr) {
      if (std::optional<RunProgressSample> sample = poller->Take()) {
        options.on_progress(*sample);
      }
    }
    const absl::Time now = absl::Now();
    const double t = absl::ToDoubleSeconds(now - start);
    if (options.time_limit_s > 0 && !limit_reached &&
        t > options.time_limit_s) {
      limit_reached = true;
      common::Log("launch: time limit of %g s reached; stopping the workers",
                  options.time_limit_s);
      for (Daemon& daemon : worker_daemons) sup.Signal(daemon.id, SIGTERM);
    }
    for (; next_fault < options.faults.size() &&
           options.faults[next_fault].at_s <= t;
         ++next_fault) {
      const Fault& fault = options.faults[next_fault];
      Daemon& daemon = daemon_of(fault);
      if (!sup.running(daemon.id)) {
        event(absl::StrCat(fault.text, ": ", daemon.role,
                           " is not running; nothing done"));
      } else if (fault.kind == Fault::Kind::kKill) {
        sup.Signal(daemon.id, SIGKILL);
        event(absl::StrCat("kill ", daemon.role, " (SIGKILL)"));
      } else {
        sup.Signal(daemon.id, SIGSTOP);
        daemon.stopped = true;
        daemon.continue_at = now + absl::Seconds(fault.for_s);
        event(absl::StrCat("stop ", daemon.role, " (SIGSTOP) for ", fault.for_s,
                           " s"));
      }
    }
    bool all_done = true;
    for (bool worker : {false, true}) {
      for (Daemon& daemon : worker ? worker_daemons : server_daemons) {
        if (daemon.stopped && now >= daemon.continue_at) {
          sup.Signal(daemon.id, SIGCONT);
          daemon.stopped = false;
          event(absl::StrCat("continue ", daemon.role, " (SIGCONT)"));
        }
        if (daemon.restart_pending) {
          if (now >= daemon.restart_at && !restart(daemon, worker)) {
            return true;
          }
        } else if (!daemon.finished && !sup.running(daemon.id) &&
                   !handle_exit(daemon, worker)) {
          return true;
        }
        if (worker && !daemon.finished) all_done = false;
      }
    }
    return all_done;
  };
  status = sup.Pump(training_done, absl::InfiniteDuration());
  poller.reset();  // its client's channels close before the servers stop
  if (status.ok()) status = failed;
  if (!status.ok()) return status;
  for (Daemon& daemon : server_daemons) {
    if (daemon.stopped) {
      sup.Signal(daemon.id, SIGCONT);  // stopping it needs it running
      daemon.stopped = false;
      event(
          absl::StrCat("continue ", daemon.role, " (SIGCONT; training ended)"));
    }
  }
  metrics.config = options.config;
  metrics.servers = options.servers;
  metrics.workers = options.workers;
  metrics.wall_time_s = absl::ToDoubleSeconds(absl::Now() - start);
  metrics.stopped_by_time_limit = limit_reached;
  absl::Status reported = ReadWorkerReports(report_paths, &metrics);
  if (!reported.ok()) return reported;
  common::Log(
      "launch: training done in %.1f s (%.1f s of steps, %.0f samples/s); "
      "final evaluation",
      metrics.wall_time_s, metrics.train_time_s,
      metrics.train_time_s > 0 ? metrics.trained_samples / metrics.train_time_s
                               : 0.0);

  // 4. The shards' counters, while they still run.
  {
    absl::StatusOr<std::unique_ptr<worker::PsClient>> client =
        worker::PsClient::Connect(client_options);
    if (!client.ok()) return client.status();
    absl::StatusOr<std::vector<StatsResponse>> stats =
        (*client)->Stats(absl::Seconds(10));
    if (!stats.ok()) return stats.status();
    metrics.shard_stats = *stats;
  }  // closes the channel before the servers shut down

  // 5. The evaluator's last point (on SIGTERM it evaluates once more), then
  // the servers.
  sup.Signal(*evaluator, SIGTERM);
  status =
      sup.Pump([&] { return !sup.running(*evaluator); }, absl::Seconds(120));
  if (!status.ok()) return status;
  if (sup.exit_code(*evaluator) != 0) return ChildFailed(sup, *evaluator);
  for (int id : servers) sup.Signal(id, SIGTERM);
  status = sup.Pump(
      [&] {
        for (int id : servers) {
          if (sup.running(id)) return false;
        }
        return true;
      },
      absl::Seconds(30));
  if (!status.ok()) return status;
  for (int id : servers) {
    if (sup.exit_code(id) != 0) return ChildFailed(sup, id);
  }

  std::string curve_text;
  if (!ReadFile(curve_path, &curve_text) ||
      !google::protobuf::TextFormat::ParseFromString(curve_text,
                                                     &metrics.curve) ||
      metrics.curve.points_size() == 0) {
    return absl::InternalError(
        absl::StrCat("the evaluator left no curve in ", curve_path));
  }
  return metrics;
}

}  // namespace monsoon::tools
