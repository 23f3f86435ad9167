// run_finisher: ends a run on Kubernetes. Waits until every worker has
// finished and the evaluator has measured the final weights, writes the
// run's metrics (the JSON of launch_local --metrics_out) and closes the run,
// so that every shard saves its final checkpoint and exits (see
// tools/k8s/run_finisher.h and tools/k8s/README.md).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/daemon.h"
#include "common/log.h"
#include "common/metrics_exporter.h"
#include "common/termination.h"
#include "tools/k8s/run_finisher.h"
#include "worker/client_flags.h"
#include "worker/ps_client.h"

ABSL_FLAG(std::string, servers, "",
          "Comma-separated host:port of every ps_server, in shard order "
          "(env MONSOON_SERVERS).");
ABSL_FLAG(std::string, config, "",
          "Training config (env MONSOON_CONFIG); must match the servers'.");
ABSL_FLAG(std::string, curve, "",
          "The evaluator's --curve_out, read for the final point "
          "(env MONSOON_CURVE).");
ABSL_FLAG(std::string, metrics_out, "",
          "Where to write the run's metrics, JSON (env MONSOON_METRICS_OUT).");
ABSL_FLAG(double, poll_s, 5,
          "Seconds between questions to the shards (env MONSOON_POLL_S).");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT to serve Prometheus metrics on (GET /metrics: the build "
          "and the process); empty: none (env MONSOON_METRICS_LISTEN).");
ABSL_FLAG(double, evaluator_timeout_s, 300,
          "Seconds to wait for the evaluator's final point once every worker "
          "has finished (env MONSOON_EVALUATOR_TIMEOUT_S).");

namespace {

using monsoon::common::kExitConfigError;
using monsoon::common::kExitFailure;
using monsoon::common::kExitOk;

constexpr char kProgram[] = "run_finisher";

int Fail(int code, const absl::Status& status) {
  return monsoon::common::Fail(kProgram, code, status);
}

monsoon::common::DaemonInfo Info() {
  monsoon::common::DaemonInfo info;
  info.program = kProgram;
  info.usage =
      "Monsoon run finisher: once every worker has finished, writes the "
      "run's metrics and closes the run on every shard.\n\n"
      "  run_finisher --servers=ps-0.ps:5000,ps-1.ps:5000 "
      "--config=train.textproto --curve=results/curve.textproto "
      "--metrics_out=results/metrics.json\n\n"
      "Every flag may also come from MONSOON_<FLAG> in the environment. Exit "
      "codes: 0 once the run is closed, 2 for a configuration error, 1 "
      "otherwise.";
  info.main_file = "tools/k8s/run_finisher_main.cc";
  info.more_flag_files = {"worker/client_flags.cc"};
  info.tune_process = false;
  return info;
}

// What FinishRun needs from the flags; INVALID_ARGUMENT for a missing or
// out-of-range one.
absl::Status SetFinishFlags(monsoon::tools::FinishOptions* finish) {
  finish->curve_path = absl::GetFlag(FLAGS_curve);
  finish->metrics_out = absl::GetFlag(FLAGS_metrics_out);
  if (finish->curve_path.empty() || finish->metrics_out.empty()) {
    return absl::InvalidArgumentError("--curve and --metrics_out are required");
  }
  const double poll_s = absl::GetFlag(FLAGS_poll_s);
  const double evaluator_s = absl::GetFlag(FLAGS_evaluator_timeout_s);
  if (!(poll_s >= 0.1 && poll_s <= 3600) ||
      !(evaluator_s >= 0 && evaluator_s <= 86400)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--poll_s must be from 0.1 to 3600 and "
                     "--evaluator_timeout_s from 0 to 86400, got ",
                     poll_s, " and ", evaluator_s));
  }
  finish->poll = absl::Seconds(poll_s);
  finish->evaluator_timeout = absl::Seconds(evaluator_s);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<monsoon::common::TerminationWatcher> termination;
  if (absl::Status started =
          monsoon::common::StartDaemon(Info(), argc, argv, &termination);
      !started.ok()) {
    return Fail(kExitConfigError, started);
  }
  auto config =
      monsoon::common::LoadResolvedConfig(absl::GetFlag(FLAGS_config));
  if (!config.ok()) return Fail(kExitConfigError, config.status());
  monsoon::tools::FinishOptions finish;
  finish.config = *config;
  if (absl::Status set = SetFinishFlags(&finish); !set.ok()) {
    return Fail(kExitConfigError, set);
  }
  finish.stop = &termination->terminated();
  auto metrics = monsoon::common::MetricsExporter::StartIfListening(
      absl::GetFlag(FLAGS_metrics_listen),
      monsoon::common::BuildInfoLabels("finisher", *config));
  if (!metrics.ok()) return Fail(kExitConfigError, metrics.status());
  if (*metrics != nullptr) {
    monsoon::common::Log("run_finisher: metrics on port %d",
                         (*metrics)->port());
  }

  int connect_error = kExitFailure;
  auto client = monsoon::worker::ConnectWithClientFlags(
      monsoon::worker::ObserverOptions(absl::GetFlag(FLAGS_servers), *config,
                                       &termination->terminated()),
      &connect_error);
  if (!client.ok()) return Fail(connect_error, client.status());
  absl::Status finished = monsoon::tools::FinishRun(client->get(), finish);
  if (!finished.ok()) return Fail(kExitFailure, finished);
  return kExitOk;
}
