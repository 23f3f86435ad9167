#include "tools/local_cluster.h"

#include <google/protobuf/text_format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/config.h"
#include "common/log.h"
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

// The examples the workers trained and the time from the first step to the
// last, from the report each wrote as it stopped.
absl::Status ReadWorkerReports(const std::vector<std::string>& paths,
                               RunMetrics* metrics) {
  double first = 0, last = 0;
  for (size_t r = 0; r < paths.size(); ++r) {
    std::string text;
    WorkerReport report;
    if (!ReadFile(paths[r], &text) ||
        !google::protobuf::TextFormat::ParseFromString(text, &report)) {
      return absl::InternalError(
          absl::StrCat("worker ", r, " left no readable report in ", paths[r]));
    }
    metrics->trained_samples += report.samples();
    if (report.steps() == 0) continue;
    if (first == 0 || report.first_step_unix_s() < first) {
      first = report.first_step_unix_s();
    }
    last = std::max(last, report.last_step_unix_s());
  }
  metrics->train_time_s = std::max(0.0, last - first);
  return absl::OkStatus();
}

// `argv` run through `prefix` (e.g. ip netns exec HOST).
std::vector<std::string> Placed(const std::vector<std::string>& prefix,
                                const std::vector<std::string>& argv) {
  std::vector<std::string> placed = prefix;
  placed.insert(placed.end(), argv.begin(), argv.end());
  return placed;
}

}  // namespace

absl::StatusOr<RunMetrics> RunLocalCluster(const LocalClusterOptions& options,
                                           ProcessSupervisor* supervisor) {
  ProcessSupervisor& sup = *supervisor;
  const bool placed = options.placement != nullptr;
  const std::string config_path = options.work_dir + "/config.textproto";
  if (auto s = WriteFile(config_path, common::ConfigToText(options.config));
      !s.ok()) {
    return s;
  }
  const std::string S = absl::StrCat(options.servers);
  const std::string W = absl::StrCat(options.workers);

  // 1. Servers on free ports; each writes its port once it listens.
  std::vector<int> servers;
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
        "--config=" + config_path};
    if (placed) argv = Placed(options.placement->server_prefix[s], argv);
    absl::StatusOr<int> id = sup.Start(absl::StrCat("server ", s), argv);
    if (!id.ok()) return id.status();
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
  if (placed) addresses = options.placement->control_addresses;
  const std::string server_list = absl::StrJoin(addresses, ",");
  const std::string worker_server_list =
      placed ? absl::StrJoin(options.placement->worker_addresses, ",")
             : server_list;
  common::Log("launch: %d servers up at %s", options.servers,
              worker_server_list);

  // 2. The evaluator and the workers, started together: the curve's time 0
  // is the start of training.
  const std::string curve_path = options.work_dir + "/curve.textproto";
  std::remove(curve_path.c_str());
  const absl::Time start = absl::Now();
  absl::StatusOr<int> evaluator =
      sup.Start("eval", {options.bin_dir + "/worker/ps_evaluator",
                         "--servers=" + server_list, "--config=" + config_path,
                         "--device=" + options.device,
                         absl::StrCat("--interval_s=", options.eval_interval_s),
                         "--curve_out=" + curve_path});
  if (!evaluator.ok()) return evaluator.status();
  std::vector<int> workers;
  std::vector<std::string> report_paths;
  for (int r = 0; r < options.workers; ++r) {
    report_paths.push_back(
        absl::StrCat(options.work_dir, "/worker-", r, ".report"));
    std::remove(report_paths.back().c_str());
    std::vector<std::string> argv = {options.bin_dir + "/worker/ps_worker",
                                     absl::StrCat("--rank=", r),
                                     "--num_workers=" + W,
                                     "--servers=" + worker_server_list,
                                     "--config=" + config_path,
                                     "--device=" + options.device,
                                     "--report_out=" + report_paths.back()};
    if (placed) argv = Placed(options.placement->worker_prefix[r], argv);
    absl::StatusOr<int> id =
        sup.Start(absl::StrCat("worker ", r), argv, {"OPENBLAS_NUM_THREADS=1"});
    if (!id.ok()) return id.status();
    workers.push_back(*id);
  }

  // 3. Training: until every worker has exited; any failure ends the run.
  bool limit_reached = false;
  const int kStoppedBySigterm = 128 + SIGTERM;
  auto training_done = [&] {
    if (options.time_limit_s > 0 && !limit_reached &&
        absl::Now() - start > absl::Seconds(options.time_limit_s)) {
      limit_reached = true;
      common::Log("launch: time limit of %g s reached; stopping the workers",
                  options.time_limit_s);
      for (int id : workers) sup.Signal(id, SIGTERM);
    }
    bool all = true;
    for (int id : workers) {
      if (sup.running(id)) {
        all = false;
      } else if (sup.exit_code(id) != 0 &&
                 !(limit_reached && sup.exit_code(id) == kStoppedBySigterm)) {
        failed = ChildFailed(sup, id);
        return true;
      }
    }
    for (int id : servers) {
      if (!sup.running(id)) {
        failed = ChildFailed(sup, id);
        return true;
      }
    }
    return all;
  };
  status = sup.Pump(training_done, absl::InfiniteDuration());
  if (status.ok()) status = failed;
  if (!status.ok()) return status;
  RunMetrics metrics;
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
    worker::PsClientOptions client_options;
    client_options.server_addresses = addresses;
    client_options.config = options.config;
    client_options.worker_rank = -1;
    client_options.connect_timeout = absl::Seconds(10);
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
