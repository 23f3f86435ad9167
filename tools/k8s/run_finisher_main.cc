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
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/flag_env.h"
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

constexpr int kConfigError = 2;

int Fail(int code, const absl::Status& status) {
  monsoon::common::LogError("run_finisher: %s", status.ToString());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Monsoon run finisher: once every worker has finished, writes the "
      "run's metrics and closes the run on every shard.\n\n"
      "  run_finisher --servers=ps-0.ps:5000,ps-1.ps:5000 "
      "--config=train.textproto --curve=results/curve.textproto "
      "--metrics_out=results/metrics.json\n\n"
      "Every flag may also come from MONSOON_<FLAG> in the environment. Exit "
      "codes: 0 once the run is closed, 2 for a configuration error, 1 "
      "otherwise.");
  monsoon::common::TerminationWatcher termination;
  absl::Status env =
      monsoon::common::ApplyFlagEnvironmentAndWarn("run_finisher");
  if (!env.ok()) return Fail(kConfigError, env);
  if (absl::Status names = monsoon::common::CheckFlagNames(argc, argv);
      !names.ok()) {
    return Fail(kConfigError, names);
  }
  monsoon::common::ShowFlagsInHelp("tools/k8s/run_finisher_main.cc",
                                   {"worker/client_flags.cc"});
  absl::ParseCommandLine(argc, argv);

  auto config =
      monsoon::common::LoadResolvedConfig(absl::GetFlag(FLAGS_config));
  if (!config.ok()) return Fail(kConfigError, config.status());
  monsoon::tools::FinishOptions finish;
  finish.config = *config;
  finish.curve_path = absl::GetFlag(FLAGS_curve);
  finish.metrics_out = absl::GetFlag(FLAGS_metrics_out);
  if (finish.curve_path.empty() || finish.metrics_out.empty()) {
    return Fail(kConfigError, absl::InvalidArgumentError(
                                  "--curve and --metrics_out are required"));
  }
  const double poll_s = absl::GetFlag(FLAGS_poll_s);
  const double evaluator_s = absl::GetFlag(FLAGS_evaluator_timeout_s);
  if (!(poll_s >= 0.1 && poll_s <= 3600) ||
      !(evaluator_s >= 0 && evaluator_s <= 86400)) {
    return Fail(kConfigError, absl::InvalidArgumentError(absl::StrCat(
                                  "--poll_s must be from 0.1 to 3600 and "
                                  "--evaluator_timeout_s from 0 to 86400, got ",
                                  poll_s, " and ", evaluator_s)));
  }
  finish.poll = absl::Seconds(poll_s);
  finish.evaluator_timeout = absl::Seconds(evaluator_s);
  finish.stop = &termination.terminated();
  std::unique_ptr<monsoon::common::MetricsExporter> metrics;
  if (const std::string listen = absl::GetFlag(FLAGS_metrics_listen);
      !listen.empty()) {
    auto started = monsoon::common::MetricsExporter::Start(
        listen, monsoon::common::BuildInfoLabels("finisher", *config));
    if (!started.ok()) return Fail(kConfigError, started.status());
    metrics = *std::move(started);
    monsoon::common::Log("run_finisher: metrics on port %d", metrics->port());
  }

  monsoon::worker::PsClientOptions options;
  options.server_addresses =
      absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipWhitespace());
  options.config = *config;
  options.worker_rank = -1;
  if (absl::Status applied = monsoon::worker::ApplyClientFlags(&options);
      !applied.ok()) {
    return Fail(kConfigError, applied);
  }
  options.stop = &termination.terminated();
  options.log_every = absl::Seconds(10);
  auto client = monsoon::worker::PsClient::Connect(options);
  if (!client.ok()) {
    return Fail(monsoon::worker::RefusedForHowItWasStarted(client.status())
                    ? kConfigError
                    : 1,
                client.status());
  }
  absl::Status finished = monsoon::tools::FinishRun(client->get(), finish);
  if (!finished.ok()) return Fail(1, finished);
  return 0;
}
