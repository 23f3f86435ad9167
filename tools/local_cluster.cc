#include "tools/local_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <google/protobuf/text_format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/auth.h"
#include "common/config.h"
#include "common/daemon.h"
#include "common/log.h"
#include "common/model_layout.h"
#include "common/temp_dir.h"
#include "common/tls.h"
#include "tools/progress_poller.h"
#include "tools/script_workers.h"
#include "worker/ps_client.h"

namespace monsoon::tools {

std::string ExecutablePath() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  return n > 0 ? std::string(path, static_cast<size_t>(n)) : "";
}

int RunRanks(const LocalClusterOptions& options) {
  return options.config.elastic()
             ? std::max(options.workers, options.max_workers)
             : options.workers;
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
          absl::StrCat("a worker left no readable report in ", path,
                       ": it ended without finishing (killed, or a script "
                       "that failed before its end; its log says why)"));
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

// One server or worker of the run, across its restarts.
struct Daemon {
  std::string role;               // "server 1"
  std::vector<std::string> argv;  // of the next start
  std::vector<std::string> env;
  int id = -1;  // the supervisor's id of the current process
  int restarts = 0;
  bool restart_pending = false;
  absl::Time restart_at;
  bool finished = false;  // a worker that is done (or not started)
  bool removed = false;   // a worker a remove fault told to leave
  absl::Time added_at = absl::InfinitePast();  // started by an add fault
  bool stopped = false;   // SIGSTOPped by a fault
  absl::Time continue_at;
  // SIGKILLed by a fault and not yet seen gone: a server killed as the last
  // step ends must be restarted before the final evaluation, even when its
  // exit is noticed only after the workers'.
  bool killed = false;
  std::string report;  // a worker's --report_out for the current process
  // A worker's --session for the current process: its launcher draws each
  // process's, so that a process started in place of one that died can
  // name the dead one's (--replaces_session) and take its rank at once.
  uint64_t session = 0;
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

// One run of RunLocalCluster, step by step: its files, the servers, the
// delay proxies, the evaluator and the workers, the training under
// supervision, and the results. Everything runs on the caller's thread (the
// supervisor's callbacks too).
class ClusterRun {
 public:
  ClusterRun(const LocalClusterOptions& options, ProcessSupervisor* supervisor)
      : options_(options),
        sup_(*supervisor),
        placed_(options.placement != nullptr),
        elastic_(options.config.elastic()),
        ranks_(RunRanks(options)),
        restarts_(options.max_restarts > 0),
        json_logs_(common::CurrentLogFormat() == common::LogFormat::kJson),
        config_path_(options.work_dir + "/config.textproto"),
        checkpoint_dir_(options.work_dir + "/checkpoints"),
        curve_path_(options.work_dir + "/curve.textproto") {}
  ~ClusterRun() {
    if (!socket_dir_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(socket_dir_, ignored);
    }
  }

  absl::StatusOr<RunMetrics> Run();

 private:
  // Before any process starts: the config, the token, TLS, the checkpoint
  // folder and the metrics targets.
  absl::Status PrepareFiles();
  absl::Status WriteToken();
  absl::Status WriteMetricsTargets() const;
  // --metrics_listen for the daemon `offset` places after the first shard.
  std::string MetricsFlag(int offset) const;

  // 1. Servers on free ports; each writes its port once it listens.
  absl::Status StartServers();
  absl::Status WaitForServers();
  absl::Status StartDelayProxies();

  // 2. The evaluator and the workers, started together.
  // Starts a daemon: `argv` and `env`, or `script` (a --worker_cmd, for a
  // worker or the evaluator) with argv's flags as its environment.
  absl::StatusOr<int> StartClient(const std::string& role,
                                  const std::vector<std::string>& argv,
                                  std::vector<std::string> env,
                                  const std::string& script);
  absl::Status StartEvaluator();
  absl::Status StartWorkers();
  absl::Status StartWorker(int rank);
  void StartProgressPoller();

  // 3. Training: until every worker is done.
  absl::Status Train();
  bool TrainingDone();
  bool TrainingBegun(absl::Time now);
  void InjectFaults(absl::Time now, double t);
  bool HandleExit(Daemon& daemon, bool worker);
  bool Restart(Daemon& daemon, bool worker);
  bool LoseServer(Daemon& daemon);
  // An elastic run's worker that died: its session ended on every shard
  // now, as its Leave would have (PsClient::EndSessionOf), not once its
  // lease runs out; logged either way.
  void EndSessionOfDead(const Daemon& daemon);
  void Event(const std::string& what);

  // 4. and 5. The results, and the end of the evaluator and the servers.
  absl::Status CollectTraining();
  absl::Status ReadShardStats();
  // The shards' counters now, through a client of its own (its channels
  // closed on return), connecting and asking within `timeout` each.
  absl::StatusOr<std::vector<StatsResponse>> StatsNow(absl::Duration timeout);
  // An elastic run's data shards not trained yet, from shard 0's queue;
  // -1 before any worker asked for one.
  absl::StatusOr<int64_t> UntrainedDataShards();
  absl::Status StopEvaluatorAndServers();
  absl::Status ReadCurve();

  // Constant after construction.
  const LocalClusterOptions& options_;
  ProcessSupervisor& sup_;
  const bool placed_;
  const bool elastic_;
  const int ranks_;  // RunRanks
  const bool restarts_;
  const bool json_logs_;  // the daemons log as the launcher does
  const std::string config_path_;
  const std::string checkpoint_dir_;
  const std::string curve_path_;

  // Set by PrepareFiles.
  std::string token_;
  std::string token_flag_;
  std::vector<std::string> server_tls_, client_tls_;
  std::shared_ptr<grpc::ChannelCredentials> launcher_credentials_;

  // The daemons, and where the servers are.
  std::vector<Daemon> server_daemons_;
  std::vector<Daemon> worker_daemons_;
  std::vector<std::string> port_files_;
  // With unix_sockets: the folder of the servers' sockets.
  std::string socket_dir_;
  std::vector<std::string> addresses_;     // what the launcher dials, per shard
  std::string server_list_;                // what the evaluator dials
  std::vector<std::string> worker_lists_;  // what each worker dials
  int evaluator_ = -1;
  absl::Time start_;  // of training

  // The launcher's own client of the shards: the progress poller's, and the
  // one that reads their counters at the end.
  worker::PsClientOptions client_options_;
  std::unique_ptr<ProgressPoller> poller_;

  // The run so far.
  RunMetrics metrics_;
  std::vector<std::string> report_paths_;  // of the workers that stopped
  absl::Status failed_;                    // why the run cannot go on
  bool limit_reached_ = false;
  size_t next_fault_ = 0;
  // Where --chaos counts from: the first push a shard applied (unset until
  // then), asked of the shards at most every kBegunCheckEvery through a
  // client kept meanwhile.
  std::optional<absl::Time> faults_from_;
  absl::Time next_begun_check_ = absl::InfinitePast();
  std::unique_ptr<worker::PsClient> begun_client_;
};

absl::StatusOr<RunMetrics> ClusterRun::Run() {
  if (absl::Status s = PrepareFiles(); !s.ok()) return s;
  if (absl::Status s = StartServers(); !s.ok()) return s;
  if (absl::Status s = WaitForServers(); !s.ok()) return s;
  if (absl::Status s = StartDelayProxies(); !s.ok()) return s;
  // The curve's time 0 is the start of training.
  std::remove(curve_path_.c_str());
  start_ = absl::Now();
  if (absl::Status s = StartEvaluator(); !s.ok()) return s;
  if (absl::Status s = StartWorkers(); !s.ok()) return s;
  StartProgressPoller();
  if (absl::Status s = Train(); !s.ok()) return s;
  if (absl::Status s = CollectTraining(); !s.ok()) return s;
  if (absl::Status s = ReadShardStats(); !s.ok()) return s;
  if (absl::Status s = StopEvaluatorAndServers(); !s.ok()) return s;
  if (absl::Status s = ReadCurve(); !s.ok()) return s;
  return std::move(metrics_);
}

absl::Status ClusterRun::PrepareFiles() {
  if (placed_ && elastic_) {
    return absl::InvalidArgumentError(
        "elastic runs are not built for --link yet: run them on loopback");
  }
  if (placed_ && options_.unix_sockets) {
    return absl::InvalidArgumentError(
        "the emulated hosts of --link reach each other over TCP: leave "
        "--unix_sockets off with --link");
  }
  if (options_.unix_sockets) {
    absl::StatusOr<std::string> dir = common::MakeTempDir("monsoon");
    if (!dir.ok()) return dir.status();
    socket_dir_ = *std::move(dir);
  }
  if (placed_ && options_.metrics_port != 0) {
    return absl::InvalidArgumentError(
        "metrics are served on 127.0.0.1, which the emulated hosts of --link "
        "do not share with this machine: leave --metrics_port off with "
        "--link");
  }
  if (auto s = WriteFile(config_path_, common::ConfigToText(options_.config));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = WriteToken(); !s.ok()) return s;
  // Mutual TLS: the servers' and the clients' certificates from one CA.
  common::TlsFiles launcher_tls;
  if (!options_.tls_dir.empty()) {
    const std::string& d = options_.tls_dir;
    server_tls_ = {"--tls_cert=" + d + "/server.pem",
                   "--tls_key=" + d + "/server.key",
                   "--tls_ca=" + d + "/ca.pem",
                   // With replicas the shards dial each other as clients.
                   "--peer_tls_cert=" + d + "/client.pem",
                   "--peer_tls_key=" + d + "/client.key"};
    client_tls_ = {"--tls_cert=" + d + "/client.pem",
                   "--tls_key=" + d + "/client.key",
                   "--tls_ca=" + d + "/ca.pem"};
    launcher_tls = {d + "/client.pem", d + "/client.key", d + "/ca.pem"};
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
      launcher_credentials = common::ChannelCredentialsFrom(launcher_tls);
  if (!launcher_credentials.ok()) return launcher_credentials.status();
  launcher_credentials_ = *std::move(launcher_credentials);
  if (restarts_) {
    // A new run: no shard may resume from an earlier run's checkpoints.
    std::error_code error;
    std::filesystem::remove_all(checkpoint_dir_, error);
    std::filesystem::create_directories(checkpoint_dir_, error);
    if (error) {
      return absl::InternalError(absl::StrCat("cannot create ", checkpoint_dir_,
                                              ": ", error.message()));
    }
  }
  return WriteMetricsTargets();
}

// A fresh secret per run: a process of another run, or anyone else on the
// machine, cannot join or read this one.
absl::Status ClusterRun::WriteToken() {
  absl::StatusOr<std::string> token = common::NewToken();
  if (!token.ok()) return token.status();
  token_ = *std::move(token);
  const std::string token_path = options_.work_dir + "/auth_token";
  std::remove(token_path.c_str());
  const int fd = open(token_path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0 || write(fd, token_.data(), token_.size()) !=
                    static_cast<ssize_t>(token_.size())) {
    if (fd >= 0) close(fd);
    return absl::InternalError(absl::StrCat("cannot write ", token_path));
  }
  close(fd);
  token_flag_ = "--auth_token_file=" + token_path;
  return absl::OkStatus();
}

// The targets file Prometheus can watch, when the daemons serve metrics.
absl::Status ClusterRun::WriteMetricsTargets() const {
  if (options_.metrics_port == 0) return absl::OkStatus();
  std::string targets = "[\n";
  auto add = [&](int offset, const std::string& role, int index, bool last) {
    absl::StrAppend(&targets, "  {\"targets\": [\"127.0.0.1:",
                    options_.metrics_port + offset,
                    "\"], \"labels\": {\"role\": \"", role, "\"");
    if (index >= 0) absl::StrAppend(&targets, ", \"index\": \"", index, "\"");
    absl::StrAppend(&targets, "}}", last ? "\n" : ",\n");
  };
  for (int s = 0; s < options_.servers; ++s) add(s, "shard", s, false);
  for (int r = 0; r < ranks_; ++r) {
    add(options_.servers + r, "worker", r, false);
  }
  add(options_.servers + ranks_, "evaluator", -1, true);
  targets += "]\n";
  const std::string path = options_.work_dir + "/metrics_targets.json";
  std::ofstream out(path);
  out << targets;
  if (!out.good()) {
    return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

std::string ClusterRun::MetricsFlag(int offset) const {
  return absl::StrCat("--metrics_listen=127.0.0.1:",
                      options_.metrics_port + offset);
}

absl::Status ClusterRun::StartServers() {
  server_daemons_.resize(options_.servers);
  // With replicas the servers reach each other: on loopback their ports are
  // chosen before they start.
  std::vector<std::string> listen(options_.servers, "127.0.0.1:0");
  if (options_.replicas > 0 && placed_) {
    // Each on its emulated host, at the address its workers dial: updates
    // forwarded to a backup cross the shaped links as pushes do.
    if (options_.placement->proxy_delay_ms > 0) {
      return absl::FailedPreconditionError(
          "--replicas with a --link delay needs the kernel's netem qdisc "
          "(modprobe sch_netem): without it the delay is added by proxies in "
          "front of the workers only, and the shards would forward updates "
          "to each other undelayed; give --link a rate alone, or load netem");
    }
    listen = options_.placement->worker_addresses;
  } else if (options_.unix_sockets) {
    for (int s = 0; s < options_.servers; ++s) {
      listen[s] = absl::StrCat("unix:", socket_dir_, "/server-", s, ".sock");
    }
  } else if (options_.replicas > 0) {
    absl::StatusOr<int> first = FreePortRange(options_.servers);
    if (!first.ok()) return first.status();
    for (int s = 0; s < options_.servers; ++s) {
      listen[s] = absl::StrCat("127.0.0.1:", *first + s);
    }
  }
  for (int s = 0; s < options_.servers; ++s) {
    port_files_.push_back(
        absl::StrCat(options_.work_dir, "/server-", s, ".port"));
    std::remove(port_files_.back().c_str());
    std::vector<std::string> argv = {
        options_.bin_dir + "/server/ps_server",
        absl::StrCat("--shard=", s),
        absl::StrCat("--num_shards=", options_.servers),
        absl::StrCat("--num_workers=", ranks_),
        "--listen=" + (placed_ ? options_.placement->server_listen[s]
                               : listen[s]),
        "--port_file=" + port_files_.back(),
        "--config=" + config_path_,
        absl::StrCat("--lease_s=", options_.lease_s),
        token_flag_};
    argv.insert(argv.end(), server_tls_.begin(), server_tls_.end());
    if (options_.metrics_port != 0) argv.push_back(MetricsFlag(s));
    if (json_logs_) argv.push_back("--log_format=json");
    if (options_.replicas > 0) {
      argv.push_back(absl::StrCat("--replicas=", options_.replicas));
      argv.push_back("--servers=" + absl::StrJoin(listen, ","));
    }
    if (restarts_) {
      argv.push_back("--checkpoint_dir=" + checkpoint_dir_);
      argv.push_back(absl::StrCat("--checkpoint_interval_s=",
                                  options_.checkpoint_interval_s));
    }
    if (placed_) argv = Placed(options_.placement->server_prefix[s], argv);
    Daemon& daemon = server_daemons_[s];
    daemon.role = absl::StrCat("server ", s);
    daemon.argv = argv;
    absl::StatusOr<int> id = sup_.Start(daemon.role, argv);
    if (!id.ok()) return id.status();
    daemon.id = *id;
    sup_.StopAfterTheOthers(daemon.id);
  }
  return absl::OkStatus();
}

// Until every server has written its port file; then where they are.
absl::Status ClusterRun::WaitForServers() {
  std::vector<std::string> addresses(options_.servers);
  auto servers_ready = [&] {
    bool all = true;
    for (int s = 0; s < options_.servers; ++s) {
      const int id = server_daemons_[s].id;
      if (!sup_.running(id)) {
        failed_ = ChildFailed(sup_, id);
        return true;
      }
      std::string text;
      int port = 0;
      if (addresses[s].empty() && ReadFile(port_files_[s], &text)) {
        const absl::string_view written = absl::StripAsciiWhitespace(text);
        if (absl::StartsWith(written, "unix:")) {
          addresses[s] = std::string(written);
        } else if (absl::SimpleAtoi(written, &port)) {
          addresses[s] = absl::StrCat("127.0.0.1:", port);
        }
      }
      all = all && !addresses[s].empty();
    }
    return all;
  };
  absl::Status status =
      sup_.Pump(servers_ready, absl::Seconds(options_.start_timeout_s));
  if (status.ok()) status = failed_;
  if (status.code() == absl::StatusCode::kDeadlineExceeded) {
    status = absl::DeadlineExceededError(
        absl::StrCat("the servers did not start listening within ",
                     options_.start_timeout_s, " s"));
  }
  if (!status.ok()) return status;
  if (!placed_) {
    // A restarted server listens where its workers look for it.
    for (int s = 0; s < options_.servers; ++s) {
      SetArg(&server_daemons_[s].argv, "--listen=", "--listen=" + addresses[s]);
    }
  }
  addresses_ = placed_ ? options_.placement->control_addresses : addresses;
  server_list_ = absl::StrJoin(addresses_, ",");
  const std::string worker_server_list =
      placed_ ? absl::StrJoin(options_.placement->worker_addresses, ",")
              : server_list_;
  common::Log("launch: %d servers up at %s", options_.servers,
              worker_server_list);
  worker_lists_.assign(ranks_, worker_server_list);
  return absl::OkStatus();
}

// Where the kernel cannot delay the links, a delay proxy per server on each
// worker's host, which that worker dials instead.
absl::Status ClusterRun::StartDelayProxies() {
  if (!placed_ || options_.placement->proxy_delay_ms <= 0) {
    return absl::OkStatus();
  }
  std::vector<std::string> proxy_files;
  std::vector<int> proxies;
  for (int r = 0; r < options_.workers; ++r) {
    for (int s = 0; s < options_.servers; ++s) {
      proxy_files.push_back(
          absl::StrCat(options_.work_dir, "/proxy-", r, "-", s, ".port"));
      std::remove(proxy_files.back().c_str());
      absl::StatusOr<int> id = sup_.Start(
          absl::StrCat("proxy ", r, "-", s),
          Placed(
              options_.placement->worker_prefix[r],
              {options_.bin_dir + "/tools/delay_proxy", "--listen=127.0.0.1:0",
               "--target=" + options_.placement->worker_addresses[s],
               absl::StrCat("--delay_ms=", options_.placement->proxy_delay_ms),
               "--port_file=" + proxy_files.back()}));
      if (!id.ok()) return id.status();
      proxies.push_back(*id);
      sup_.StopAfterTheOthers(*id);
    }
  }
  std::vector<std::string> ports(proxies.size());
  absl::Status proxy_failed;
  auto proxies_ready = [&] {
    bool all = true;
    for (size_t i = 0; i < proxies.size(); ++i) {
      if (!sup_.running(proxies[i])) {
        proxy_failed = ChildFailed(sup_, proxies[i]);
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
  absl::Status status = sup_.Pump(proxies_ready, absl::Seconds(30));
  if (status.ok()) status = proxy_failed;
  if (!status.ok()) return status;
  for (int r = 0; r < options_.workers; ++r) {
    worker_lists_[r] =
        absl::StrJoin(ports.begin() + r * options_.servers,
                      ports.begin() + (r + 1) * options_.servers, ",");
  }
  common::Log("launch: delay proxies on the workers' hosts add %g ms each way",
              options_.placement->proxy_delay_ms);
  return absl::OkStatus();
}

absl::Status ClusterRun::StartEvaluator() {
  std::vector<std::string> argv = {
      options_.bin_dir + "/worker/ps_evaluator",
      "--servers=" + server_list_,
      "--config=" + config_path_,
      "--device=" + options_.device,
      absl::StrCat("--interval_s=", options_.eval_interval_s),
      "--curve_out=" + curve_path_,
      token_flag_};
  argv.insert(argv.end(), client_tls_.begin(), client_tls_.end());
  if (options_.metrics_port != 0) {
    argv.push_back(MetricsFlag(options_.servers + ranks_));
  }
  if (json_logs_) argv.push_back("--log_format=json");
  std::string script = options_.evaluator_cmd.empty() ? options_.worker_cmd
                                                      : options_.evaluator_cmd;
  if (!script.empty()) argv.push_back("--rank=-1");
  absl::StatusOr<int> evaluator = StartClient("eval", argv, {}, script);
  if (!evaluator.ok()) return evaluator.status();
  evaluator_ = *evaluator;
  // A run stopped before its end (failed, interrupted) needs no last point:
  // SIGINT stops the evaluator without one. At the end of a run
  // (StopEvaluatorAndServers), SIGTERM asks for it.
  sup_.SetStopSignal(evaluator_, SIGINT);
  return absl::OkStatus();
}

absl::Status ClusterRun::StartWorkers() {
  worker_daemons_.resize(ranks_);
  for (int r = 0; r < ranks_; ++r) {
    if (r < options_.workers) {
      if (absl::Status s = StartWorker(r); !s.ok()) return s;
    } else {
      worker_daemons_[r].role = absl::StrCat("worker ", r);
      worker_daemons_[r].finished = true;  // until an add starts it
    }
  }
  return absl::OkStatus();
}

absl::Status ClusterRun::StartWorker(int r) {
  {
    Daemon& daemon = worker_daemons_[r];
    daemon.finished = false;
    daemon.role = absl::StrCat("worker ", r);
    daemon.report = absl::StrCat(options_.work_dir, "/worker-", r, ".report");
    std::remove(daemon.report.c_str());
    daemon.session = worker::DrawSession();
    daemon.argv = {options_.bin_dir + "/worker/ps_worker",
                   absl::StrCat("--rank=", r),
                   absl::StrCat("--session=", daemon.session),
                   absl::StrCat("--num_workers=", ranks_),
                   "--servers=" + worker_lists_[r],
                   "--config=" + config_path_,
                   "--device=" + options_.device,
                   "--report_out=" + daemon.report,
                   token_flag_};
    daemon.argv.insert(daemon.argv.end(), client_tls_.begin(),
                       client_tls_.end());
    if (options_.metrics_port != 0) {
      daemon.argv.push_back(MetricsFlag(options_.servers + r));
      if (options_.metrics_linger_s > 0) {
        daemon.argv.push_back(
            absl::StrCat("--metrics_linger_s=", options_.metrics_linger_s));
      }
    }
    if (json_logs_) daemon.argv.push_back("--log_format=json");
    // With replicas a frozen shard is given up after 2 s (the shortest
    // keepalive), for its backup to take its range over.
    if (options_.replicas > 0) daemon.argv.push_back("--peer_timeout_s=2");
    if (auto it = options_.slowdown.find(r); it != options_.slowdown.end()) {
      daemon.argv.push_back(absl::StrCat("--slowdown=", it->second));
    }
    // allreduce: rank 0 publishes the weights as often as the evaluator
    // looks, so that its curve has the resolution of the other modes'. Not
    // on an emulated network: there a publish crosses rank 0's shaped link
    // (the evaluator's pulls of the other modes take the shards' unshaped
    // control links), so it stays at the worker's once a second.
    if (options_.config.mode() == ALLREDUCE && r == 0 && !placed_) {
      daemon.argv.push_back(absl::StrCat(
          "--publish_every_s=",
          std::max(0.05, std::min(3600.0, options_.eval_interval_s))));
    }
    // allreduce: the ring's traffic crosses the workers' shaped links too.
    if (placed_ && options_.config.mode() == ALLREDUCE &&
        r < static_cast<int>(options_.placement->worker_hosts.size())) {
      daemon.argv.push_back("--ring_host=" +
                            options_.placement->worker_hosts[r]);
    }
    if (placed_) {
      daemon.argv = Placed(options_.placement->worker_prefix[r], daemon.argv);
    }
    daemon.env = {"OPENBLAS_NUM_THREADS=1"};
    absl::StatusOr<int> id = StartClient(daemon.role, daemon.argv, daemon.env,
                                         options_.worker_cmd);
    if (!id.ok()) return id.status();
    daemon.id = *id;
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ClusterRun::StartClient(
    const std::string& role, const std::vector<std::string>& argv,
    std::vector<std::string> env, const std::string& script) {
  if (script.empty()) return sup_.Start(role, argv, env);
  return sup_.Start(role, ScriptArgv(script, argv, &env), env);
}

void ClusterRun::StartProgressPoller() {
  client_options_.server_addresses = addresses_;
  client_options_.config = options_.config;
  client_options_.worker_rank = -1;
  client_options_.connect_timeout = absl::Seconds(10);
  client_options_.auth_token = token_;
  client_options_.credentials = launcher_credentials_;
  if (!options_.on_progress) return;
  worker::PsClientOptions poller_options = client_options_;
  // Short, so that stopping the poller never waits long for a shard that is
  // down; it tries again a second later.
  poller_options.connect_timeout = absl::Seconds(1);
  poller_ = std::make_unique<ProgressPoller>(
      poller_options, curve_path_, start_,
      ExamplesPerEpoch(options_.config, elastic_ ? 1 : options_.workers),
      options_.config.epochs());
}

// A daemon that dies is started again after a pause (HandleExit: a
// worker's first at once, then 1 s, doubling per restart), up to
// max_restarts times; after that, or with restarts off, the run fails.
absl::Status ClusterRun::Train() {
  absl::Status status =
      sup_.Pump([this] { return TrainingDone(); }, absl::InfiniteDuration());
  poller_.reset();  // its client's channels close before the servers stop
  begun_client_.reset();
  if (status.ok()) status = failed_;
  if (status.ok()) {
    // A fault the run ended before is in its events, not only missing.
    for (size_t f = next_fault_; f < options_.faults.size(); ++f) {
      Event(absl::StrCat(
          options_.faults[f].text, ": not injected: ",
          faults_from_.has_value()
              ? absl::StrCat("training ended ",
                             absl::FormatDuration(absl::Now() - *faults_from_),
                             " after it began")
              : "no shard applied a push, so training never began"));
    }
  }
  return status;
}

bool ClusterRun::TrainingDone() {
  if (poller_ != nullptr) {
    if (std::optional<RunProgressSample> sample = poller_->Take()) {
      options_.on_progress(*sample);
    }
  }
  const absl::Time now = absl::Now();
  const double t = absl::ToDoubleSeconds(now - start_);
  if (options_.time_limit_s > 0 && !limit_reached_ &&
      t > options_.time_limit_s) {
    limit_reached_ = true;
    common::Log("launch: time limit of %g s reached; stopping the workers",
                options_.time_limit_s);
    for (Daemon& daemon : worker_daemons_) sup_.Signal(daemon.id, SIGTERM);
  }
  if (next_fault_ < options_.faults.size()) {
    if (!faults_from_.has_value() && TrainingBegun(now)) {
      faults_from_ = now;
      begun_client_.reset();
      common::Log("launch: %.1f s: training began; --chaos counts from here",
                  t);
    }
    if (faults_from_.has_value()) {
      InjectFaults(now, absl::ToDoubleSeconds(now - *faults_from_));
    }
  }
  if (!failed_.ok()) return true;
  // An evaluator that fails (an error in a script's evaluation, a test set
  // it cannot read) ends the run now, not after training: the run would
  // end without its curve anyway.
  if (evaluator_ >= 0 && !sup_.running(evaluator_) &&
      sup_.exit_code(evaluator_) != 0) {
    failed_ = absl::InternalError(
        absl::StrCat(ChildFailed(sup_, evaluator_).message(),
                     "; the run stops at once, since without its evaluator "
                     "it has no accuracy curve"));
    return true;
  }
  bool all_done = true;
  for (bool worker : {false, true}) {
    for (Daemon& daemon : worker ? worker_daemons_ : server_daemons_) {
      if (daemon.stopped && now >= daemon.continue_at) {
        sup_.Signal(daemon.id, SIGCONT);
        daemon.stopped = false;
        Event(absl::StrCat("continue ", daemon.role, " (SIGCONT)"));
      }
      if (daemon.restart_pending) {
        if (now >= daemon.restart_at && !Restart(daemon, worker)) return true;
      } else if (!daemon.finished && daemon.id >= 0 &&
                 !sup_.running(daemon.id) &&
                 !HandleExit(daemon, worker)) {
        return true;
      }
      if (worker && !daemon.finished) all_done = false;
      // A server killed as the last step ended is restarted before the
      // run goes on to its final evaluation, which needs every shard.
      if (!worker && (daemon.restart_pending || daemon.killed)) {
        all_done = false;
      }
    }
  }
  return all_done;
}

// Whether training has begun, the moment --chaos counts from: a shard has
// applied a push (dense, or of a sparse table's rows). Counting from the
// workers' start instead put a fault meant for training before the first
// step wherever the workers took long to start (on a busy machine, more
// than a second to register). In mode allreduce the shards take no pushes:
// there it is the workers' start.
bool ClusterRun::TrainingBegun(absl::Time now) {
  constexpr absl::Duration kBegunCheckEvery = absl::Milliseconds(50);
  if (options_.config.mode() == ALLREDUCE) return true;
  if (now < next_begun_check_) return false;
  next_begun_check_ = now + kBegunCheckEvery;
  if (begun_client_ == nullptr) {
    worker::PsClientOptions options = client_options_;
    options.connect_timeout = absl::Seconds(1);
    absl::StatusOr<std::unique_ptr<worker::PsClient>> client =
        worker::PsClient::Connect(options);
    if (!client.ok()) return false;  // asked again next time
    begun_client_ = *std::move(client);
  }
  absl::StatusOr<std::vector<StatsResponse>> stats =
      begun_client_->Stats(absl::Seconds(1));
  if (!stats.ok()) return false;
  for (const StatsResponse& shard : *stats) {
    if (shard.first_push_unix_s() > 0) return true;
    for (const auto& [table, updates] : shard.sparse_row_updates()) {
      if (updates > 0) return true;
    }
  }
  return false;
}

// The faults due by `t` seconds into training.
void ClusterRun::InjectFaults(absl::Time now, double t) {
  for (; next_fault_ < options_.faults.size() &&
         options_.faults[next_fault_].at_s <= t;
       ++next_fault_) {
    const Fault& fault = options_.faults[next_fault_];
    if (!fault.server && fault.index >= ranks_) {
      Event(absl::StrCat(fault.text, ": the run has ranks 0 to ", ranks_ - 1,
                         "; nothing done"));
      continue;
    }
    Daemon& daemon = fault.server ? server_daemons_[fault.index]
                                  : worker_daemons_[fault.index];
    if (fault.kind == Fault::Kind::kAdd) {
      daemon.added_at = now;
      if (absl::Status s = StartWorker(fault.index); !s.ok()) {
        failed_ = s;
        return;
      }
      Event(absl::StrCat("add ", daemon.role, " (joins the run)"));
    } else if (daemon.id < 0 || !sup_.running(daemon.id)) {
      Event(absl::StrCat(fault.text, ": ", daemon.role,
                         " is not running; nothing done"));
    } else if (fault.kind == Fault::Kind::kKill) {
      sup_.Signal(daemon.id, SIGKILL);
      daemon.killed = true;
      Event(absl::StrCat("kill ", daemon.role, " (SIGKILL)"));
    } else if (fault.kind == Fault::Kind::kRemove) {
      sup_.Signal(daemon.id, SIGTERM);
      daemon.removed = true;
      Event(absl::StrCat("remove ", daemon.role,
                         " (SIGTERM: it ends its step and leaves)"));
    } else {
      sup_.Signal(daemon.id, SIGSTOP);
      daemon.stopped = true;
      daemon.continue_at = now + absl::Seconds(fault.for_s);
      Event(absl::StrCat("stop ", daemon.role, " (SIGSTOP) for ", fault.for_s,
                         " s"));
    }
  }
}

// Whether `daemon`, no longer running, may go on: a worker that finished,
// or one to restart. Sets failed_ when the run cannot go on.
bool ClusterRun::HandleExit(Daemon& daemon, bool worker) {
  const int code = sup_.exit_code(daemon.id);
  daemon.stopped = false;
  daemon.killed = false;
  if (!worker && options_.replicas > 0 && code != common::kExitConfigError &&
      !LoseServer(daemon)) {
    return false;
  }
  if (worker) {
    if (code == common::kExitOk || code == common::ExitCodeForSignal(SIGTERM)) {
      report_paths_.push_back(daemon.report);
    }
    if (code == common::kExitOk || limit_reached_) {
      daemon.finished = true;
      return true;
    }
    if (elastic_) {
      // A worker that goes is not started again: the others train what it
      // left (its data shards go back to the queue).
      daemon.finished = true;
      if (daemon.removed && code == common::ExitCodeForSignal(SIGTERM)) {
        Event(absl::StrCat(daemon.role, " left"));
      } else {
        Event(absl::StrCat(daemon.role, " died (exit code ", code,
                           "); not restarted in an elastic run: its data "
                           "shards go back to the queue"));
        EndSessionOfDead(daemon);
      }
      bool anyone = false;
      for (const Daemon& other : worker_daemons_) anyone |= !other.finished;
      if (!anyone && code != common::kExitConfigError) {
        bool added_later = false;
        for (size_t f = next_fault_; f < options_.faults.size(); ++f) {
          added_later |= options_.faults[f].kind == Fault::Kind::kAdd;
        }
        // Killed on its way out (the data all trained, the others gone
        // already), it leaves nothing undone: the run ends as it would.
        const absl::StatusOr<int64_t> untrained = UntrainedDataShards();
        if (untrained.ok() && *untrained == 0) {
          Event(absl::StrCat(daemon.role,
                             " was the last worker; every data shard was "
                             "already trained"));
          return true;
        }
        if (!added_later) {
          failed_ = absl::InternalError(absl::StrCat(
              daemon.role,
              " was the last worker of the run and exited with code ", code,
              " before the data was all trained (",
              untrained.ok() && *untrained > 0
                  ? absl::StrCat(*untrained, " data shards left")
                  : absl::StrCat("shard 0's data queue: ",
                                 untrained.ok() ? "not started"
                                                : untrained.status().ToString()),
              "); command: ", sup_.command_line(daemon.id)));
          return false;
        }
      }
      if (code != common::kExitConfigError) return true;
    }
    if (options_.config.mode() == ALLREDUCE) {
      // A restart cannot help: the ring ended with the worker, and a new
      // one would refuse the weights its predecessors published.
      failed_ = ChildFailed(sup_, daemon.id);
      failed_ = absl::Status(
          failed_.code(),
          absl::StrCat(failed_.message(),
                       "; not restarted: in mode allreduce a worker that "
                       "stops ends the run (the ring cannot take it back)"));
      return false;
    }
    if (code == common::kExitConfigError && daemon.restarts > 0) {
      // The same flags as a start that ran: the shards hold every step of
      // this rank (the others finished the run without it).
      Event(absl::StrCat(daemon.role, " (restarted) has nothing left"));
      daemon.finished = true;
      return true;
    }
  }
  if (code == common::kExitConfigError ||
      daemon.restarts >= options_.max_restarts) {
    failed_ = ChildFailed(sup_, daemon.id);
    if (daemon.restarts > 0) {
      failed_ = absl::InternalError(absl::StrCat(
          failed_.message(), "; it was restarted ", daemon.restarts,
          " times, the most --max_restarts allows"));
    }
    return false;
  }
  ++daemon.restarts;
  ++metrics_.restarts;
  // A worker's first restart comes at once (it resumes where the shards
  // are, and in sync the others wait for it meanwhile); a worker's later
  // ones and every server's back off from 1 s, doubling up to 10 s, so that
  // a process that keeps failing does not spin.
  const int backoffs = daemon.restarts - (worker ? 2 : 1);
  const absl::Duration pause =
      backoffs < 0 ? absl::Milliseconds(100)
                   : std::min(absl::Seconds(1) * (1 << std::min(backoffs, 4)),
                              absl::Seconds(10));
  daemon.restart_pending = true;
  daemon.restart_at = absl::Now() + pause;
  Event(absl::StrCat(daemon.role, " exited with code ", code,
                     "; restarting it in ", absl::FormatDuration(pause),
                     " (restart ", daemon.restarts, " of at most ",
                     options_.max_restarts, ")"));
  return true;
}

// With replicas: a server that died has its range served by its backup
// from now on, and is restarted (HandleExit) to copy its ranges back and
// be their backup (ParameterService.Repair); false (with failed_ set) when
// a neighbour is down too, which took the other copy of a range with it.
bool ClusterRun::LoseServer(Daemon& daemon) {
  const int s = static_cast<int>(&daemon - server_daemons_.data());
  const int n = options_.servers;
  for (int neighbour : {(s + n - 1) % n, (s + 1) % n}) {
    const Daemon& other = server_daemons_[neighbour];
    if (neighbour != s &&
        (other.restart_pending || !sup_.running(other.id))) {
      failed_ = absl::DataLossError(absl::StrCat(
          daemon.role, " died after ", server_daemons_[neighbour].role,
          ": both copies of shard ", neighbour == (s + 1) % n ? s : neighbour,
          "'s range are gone (--replicas=1 survives one failure per pair of "
          "neighbouring servers); ",
          ChildFailed(sup_, daemon.id).message()));
      return false;
    }
  }
  Event(absl::StrCat(daemon.role, " died (exit code ", sup_.exit_code(daemon.id),
                     "); its range goes on at its backup in server ",
                     (s + 1) % n,
                     "; restarted, it copies its ranges back and is their "
                     "backup"));
  return true;
}

// Starts `daemon` again; false (with failed_ set) when it cannot be.
bool ClusterRun::Restart(Daemon& daemon, bool worker) {
  daemon.restart_pending = false;
  if (worker) {
    daemon.report = absl::StrCat(options_.work_dir, "/", "worker-",
                                 &daemon - worker_daemons_.data(), "-restart-",
                                 daemon.restarts, ".report");
    std::remove(daemon.report.c_str());
    SetArg(&daemon.argv, "--report_out=", "--report_out=" + daemon.report);
    // The launcher saw the last process exit: the new one takes its rank at
    // once rather than once the dead one's lease has run out.
    SetArg(&daemon.argv, "--replaces_session=",
           absl::StrCat("--replaces_session=", daemon.session));
    daemon.session = worker::DrawSession();
    SetArg(&daemon.argv,
           "--session=", absl::StrCat("--session=", daemon.session));
  }
  absl::StatusOr<int> id = StartClient(daemon.role, daemon.argv, daemon.env,
                                       worker ? options_.worker_cmd : "");
  if (!id.ok()) {
    failed_ = id.status();
    return false;
  }
  daemon.id = *id;
  if (!worker) sup_.StopAfterTheOthers(daemon.id);
  Event(absl::StrCat("restarted ", daemon.role));
  return true;
}

void ClusterRun::EndSessionOfDead(const Daemon& daemon) {
  const int rank = static_cast<int>(&daemon - worker_daemons_.data());
  worker::PsClientOptions options = client_options_;
  options.connect_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<worker::PsClient>> client =
      worker::PsClient::Connect(options);
  absl::Status ended = client.ok() ? (*client)->EndSessionOf(
                                         rank, daemon.session, absl::Seconds(2))
                                   : client.status();
  if (ended.ok()) {
    common::Log(
        "launch: ended %s's session on every shard (its lease need "
        "not run out)",
        daemon.role.c_str());
  } else {
    common::LogWarning(
        "launch: could not end %s's session on every shard (%s): the shards "
        "that did not hear it wait for its lease (--lease_s) to run out",
        daemon.role.c_str(), ended.ToString().c_str());
  }
}

// Logs `what`, which happened now, and keeps it in the run's events.
void ClusterRun::Event(const std::string& what) {
  const double t = absl::ToDoubleSeconds(absl::Now() - start_);
  common::Log("launch: %.1f s: %s", t, what);
  metrics_.events.push_back({t, what});
}

// What the training did, from the workers' reports.
absl::Status ClusterRun::CollectTraining() {
  for (Daemon& daemon : server_daemons_) {
    if (daemon.stopped) {
      sup_.Signal(daemon.id, SIGCONT);  // stopping it needs it running
      daemon.stopped = false;
      Event(
          absl::StrCat("continue ", daemon.role, " (SIGCONT; training ended)"));
    }
  }
  metrics_.config = options_.config;
  metrics_.servers = options_.servers;
  metrics_.workers = options_.workers;
  metrics_.replicas = options_.replicas;
  metrics_.wall_time_s = absl::ToDoubleSeconds(absl::Now() - start_);
  metrics_.stopped_by_time_limit = limit_reached_;
  absl::Status reported = ReadWorkerReports(report_paths_, &metrics_);
  if (!reported.ok()) return reported;
  // How long a joiner took from its registration to the end of its first
  // step, its push answered (its report: a worker that was killed wrote
  // none), and from the add that started its process.
  for (const Daemon& daemon : worker_daemons_) {
    std::string text;
    WorkerReport report;
    if (daemon.added_at == absl::InfinitePast() ||
        !ReadFile(absl::StrCat(options_.work_dir, "/worker-",
                               &daemon - worker_daemons_.data(), ".report"),
                  &text) ||
        !google::protobuf::TextFormat::ParseFromString(text, &report) ||
        report.steps() == 0) {
      continue;
    }
    metrics_.add_to_first_push_s = std::max(
        metrics_.add_to_first_push_s,
        report.first_step_end_unix_s() -
            absl::ToUnixMicros(daemon.added_at) * 1e-6);
    if (report.registered_unix_s() > 0) {
      metrics_.join_to_first_push_s =
          std::max(metrics_.join_to_first_push_s,
                   report.first_step_end_unix_s() - report.registered_unix_s());
    }
  }
  common::Log(
      "launch: training done in %.1f s (%.1f s of steps, %.0f samples/s); "
      "final evaluation",
      metrics_.wall_time_s, metrics_.train_time_s,
      metrics_.train_time_s > 0
          ? metrics_.trained_samples / metrics_.train_time_s
          : 0.0);
  return absl::OkStatus();
}

// An elastic run's data shards, over every epoch.
int64_t DataShardsDue(const DataQueueState& queue) {
  const int64_t per_epoch =
      queue.shard_batches() > 0
          ? (queue.batches_per_epoch() + queue.shard_batches() - 1) /
                queue.shard_batches()
          : 0;
  return per_epoch * queue.epochs();
}

absl::StatusOr<std::vector<StatsResponse>> ClusterRun::StatsNow(
    absl::Duration timeout) {
  worker::PsClientOptions options = client_options_;
  options.connect_timeout = timeout;
  absl::StatusOr<std::unique_ptr<worker::PsClient>> client =
      worker::PsClient::Connect(options);
  if (!client.ok()) return client.status();
  return (*client)->Stats(timeout);
}

absl::StatusOr<int64_t> ClusterRun::UntrainedDataShards() {
  absl::StatusOr<std::vector<StatsResponse>> stats =
      StatsNow(absl::Seconds(5));
  if (!stats.ok()) return stats.status();
  const DataQueueState& queue = (*stats)[0].data_queue();
  const int64_t due = DataShardsDue(queue);
  if (queue.batches_per_epoch() == 0) return int64_t{-1};  // none asked yet
  return due - queue.done_size();
}

// 4. The shards' counters, while they still run.
absl::Status ClusterRun::ReadShardStats() {
  absl::StatusOr<std::vector<StatsResponse>> stats =
      StatsNow(absl::Seconds(10));
  if (!stats.ok()) return stats.status();
  metrics_.shard_stats = *stats;
  if (elastic_ && !limit_reached_ && !stats->empty()) {
    // Every data shard of every epoch done, or said loudly how many not.
    const DataQueueState& queue = (*stats)[0].data_queue();
    const int64_t due = DataShardsDue(queue);
    if (queue.done_size() < due) {
      common::LogWarning(
          "launch: %d of the run's %d data shards were not trained: the "
          "workers that held them went when the others had finished (see "
          "examples_trained per epoch in the metrics)",
          due - queue.done_size(), due);
      Event(absl::StrCat(due - queue.done_size(), " of ", due,
                         " data shards not trained"));
    }
  }
  return absl::OkStatus();
}

// 5. The evaluator's last point (on SIGTERM it evaluates once more), then
// the servers.
absl::Status ClusterRun::StopEvaluatorAndServers() {
  sup_.Signal(evaluator_, SIGTERM);
  absl::Status status =
      sup_.Pump([&] { return !sup_.running(evaluator_); }, absl::Seconds(120));
  if (!status.ok()) return status;
  if (sup_.exit_code(evaluator_) != 0) return ChildFailed(sup_, evaluator_);
  for (const Daemon& server : server_daemons_) {
    sup_.Signal(server.id, SIGTERM);
  }
  status = sup_.Pump(
      [&] {
        for (const Daemon& server : server_daemons_) {
          if (sup_.running(server.id)) return false;
        }
        return true;
      },
      absl::Seconds(30));
  if (!status.ok()) return status;
  for (const Daemon& server : server_daemons_) {
    if (sup_.exit_code(server.id) != 0) {
      return ChildFailed(sup_, server.id);
    }
  }
  return absl::OkStatus();
}

absl::Status ClusterRun::ReadCurve() {
  std::string curve_text;
  if (!ReadFile(curve_path_, &curve_text) ||
      !google::protobuf::TextFormat::ParseFromString(curve_text,
                                                     &metrics_.curve) ||
      metrics_.curve.points_size() == 0) {
    return absl::InternalError(
        absl::StrCat("the evaluator left no curve in ", curve_path_));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckDeviceName(absl::string_view device) {
  if (device == "cpu" || device == "auto" || device == "cuda") {
    return absl::OkStatus();
  }
  absl::string_view number = device;
  int index = 0;
  if (absl::ConsumePrefix(&number, "cuda:") &&
      absl::SimpleAtoi(number, &index) && index >= 0) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--device='", device,
      "': the workers' device is cpu, auto (a GPU where there is one), cuda "
      "or cuda:N (GPU N)"));
}

absl::Status CheckRunSeconds(double eval_interval_s, double time_limit_s) {
  if (!(eval_interval_s > 0 && eval_interval_s <= 3600)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--eval_interval_s=", eval_interval_s,
        ": the seconds between two evaluations must be above 0 and at most "
        "3600"));
  }
  if (!(time_limit_s >= 0 && std::isfinite(time_limit_s))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--time_limit_s=", time_limit_s,
                     ": give the seconds a run may train, or 0 for no limit"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RunMetrics> RunLocalCluster(const LocalClusterOptions& options,
                                           ProcessSupervisor* supervisor) {
  if (options.worker_cmd.empty()) return ClusterRun(options, supervisor).Run();
  // Refused before the script runs at all (it would refuse it at its
  // first call, after the servers started).
  if (absl::Status open = common::CheckScriptMode(options.config.mode());
      !open.ok()) {
    return absl::Status(open.code(),
                        absl::StrCat("--worker_cmd: ", open.message()));
  }
  absl::StatusOr<TrainingConfig> config =
      ExportScriptLayout(options.worker_cmd, options.config, options.work_dir,
                         supervisor, absl::Minutes(2));
  if (!config.ok()) return config.status();
  LocalClusterOptions script_options = options;
  script_options.config = *std::move(config);
  // A script registers when it makes its DistributedOptimizer and may then
  // load data or evaluate for seconds without a call: with the 3 s lease
  // of C++ workers, sync steps would close without it (its examples
  // skipped).
  script_options.lease_s = std::max(options.lease_s, 30.0);
  common::Log(
      "launch: the script's model: %d tensors, %d parameters",
      script_options.config.tensors_size(),
      common::ModelLayout::FromConfig(script_options.config).num_params());
  return ClusterRun(script_options, supervisor).Run();
}

}  // namespace monsoon::tools
