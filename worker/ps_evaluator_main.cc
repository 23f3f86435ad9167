// ps_evaluator: pulls the weights from every shard every few seconds and
// measures loss and accuracy on the test set; on SIGTERM it evaluates once
// more and exits. Writes the curve (text-format monsoon.EvalCurve) to
// --curve_out after every point.
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/auth.h"
#include "common/config.h"
#include "common/daemon.h"
#include "common/log.h"
#include "common/metrics_exporter.h"
#include "common/model_config.h"
#include "common/model_layout.h"
#include "common/termination.h"
#include "common/tls.h"
#include "proto/metrics.pb.h"
#include "worker/backend_factory.h"
#include "worker/client_flags.h"
#include "worker/dataset.h"
#include "worker/evaluator.h"
#include "worker/model/model.h"
#include "worker/ps_client.h"
#include "worker/sparse_lr.h"
#include "worker/worker_metrics.h"

ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT to serve Prometheus metrics on (GET /metrics; port 0: "
          "any free one); empty: none (env MONSOON_METRICS_LISTEN).");
ABSL_FLAG(std::string, servers, "",
          "Comma-separated host:port of every "
          "ps_server, in shard order (env MONSOON_SERVERS).");
ABSL_FLAG(std::string, config, "",
          "Training config (env MONSOON_CONFIG); "
          "must match the servers'.");
ABSL_FLAG(std::string, data_dir, "",
          "Overrides the config's data_dir "
          "(env MONSOON_DATA_DIR).");
ABSL_FLAG(std::string, device, "auto", "auto, cpu or cuda.");
ABSL_FLAG(double, interval_s, 2, "Seconds between evaluations.");
ABSL_FLAG(bool, until_finished, false,
          "Stop by itself, exit code 0, once every shard reports that every "
          "worker has finished (StatsResponse.workers_finished), after one "
          "last evaluation of the final weights, marked run_finished in "
          "--curve_out; stopped by a signal before that, exit 128 + the "
          "signal, so that a Job starts it again (env "
          "MONSOON_UNTIL_FINISHED).");
ABSL_FLAG(std::string, curve_out, "",
          "Where to write the curve (text-format monsoon.EvalCurve), after "
          "every point; empty: log only. An evaluator started again with the "
          "same file continues its curve (a file that does not parse is kept "
          "as FILE.damaged-<time> and a new curve starts).");

namespace {

using monsoon::common::kExitConfigError;
using monsoon::common::kExitFailure;
using monsoon::common::kExitOk;
using monsoon::common::TerminationWatcher;
using monsoon::worker::PsClient;

constexpr char kProgram[] = "ps_evaluator";

int Fail(int code, const absl::Status& status) {
  return monsoon::common::Fail(kProgram, code, status);
}

monsoon::common::DaemonInfo Info() {
  monsoon::common::DaemonInfo info;
  info.program = kProgram;
  info.usage =
      "Monsoon evaluator: test loss and accuracy of the servers' weights "
      "over time.\n\n  ps_evaluator --servers=ps-0:5000,ps-1:5000 "
      "--config=train.textproto --curve_out=curve.textproto\n\n"
      "SIGTERM: one last evaluation, then exit. SIGINT: exit at once (the "
      "launchers stop a failed run's evaluator so). Every flag may also come "
      "from MONSOON_<FLAG> in the environment; a flag on the command line "
      "wins.";
  info.main_file = "worker/ps_evaluator_main.cc";
  info.more_flag_files = {"worker/client_flags.cc"};
  return info;
}

// The curve an earlier evaluator of this run left in `path`, to continue: its
// points and time 0 (`start`, when the file has it; else its last point
// counts as now). None when there is no such file. A file that does not
// parse is kept, renamed to PATH.damaged-<unix time>, with an error logged,
// and the curve starts afresh.
std::optional<monsoon::EvalCurve> EarlierCurve(const std::string& path,
                                               absl::Time* start) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  monsoon::EvalCurve curve;
  if (!google::protobuf::TextFormat::ParseFromString(text.str(), &curve)) {
    const std::string kept =
        absl::StrCat(path, ".damaged-", absl::ToUnixSeconds(absl::Now()));
    std::rename(path.c_str(), kept.c_str());
    monsoon::common::LogError(
        "ps_evaluator: %s does not parse as a curve (text-format "
        "monsoon.EvalCurve); kept as %s, starting a new curve",
        path, kept);
    return std::nullopt;
  }
  if (curve.start_unix_s() > 0) {
    *start =
        absl::FromUnixMicros(static_cast<int64_t>(curve.start_unix_s() * 1e6));
  } else if (curve.points_size() > 0) {
    *start = absl::Now() -
             absl::Seconds(curve.points(curve.points_size() - 1).time_s());
  }
  return curve;
}

// Replaces `path` atomically, so that a reader never sees half a file.
// The curve to add to, with time 0 in *start: the one an evaluator
// restarted (a rescheduled pod) finds in --curve_out, else a new one from
// now.
monsoon::EvalCurve StartCurve(absl::Time* start) {
  *start = absl::Now();
  monsoon::EvalCurve curve;
  if (const std::string path = absl::GetFlag(FLAGS_curve_out); !path.empty()) {
    if (std::optional<monsoon::EvalCurve> earlier = EarlierCurve(path, start)) {
      curve = *std::move(earlier);
      monsoon::common::Log(
          "ps_evaluator: continuing the curve in %s (%d points, time 0 %.0f s "
          "ago)",
          path, curve.points_size(),
          absl::ToDoubleSeconds(absl::Now() - *start));
    }
  }
  curve.set_start_unix_s(absl::ToDoubleSeconds(*start - absl::UnixEpoch()));
  return curve;
}

// One point of the curve. The last one (`last`) is the run's result: a
// shard that was just restarted gets time to answer.
absl::StatusOr<monsoon::EvalPoint> EvaluateOnce(
    monsoon::worker::CurveEvaluator& evaluator, PsClient& client, bool last) {
  absl::StatusOr<monsoon::EvalPoint> point = evaluator.EvaluateNow();
  if (!point.ok() && point.status().code() == absl::StatusCode::kUnavailable) {
    // A shard lost, restarted, or its range moved to its backup
    // (--replicas): registered again, the evaluator follows it. Briefly
    // while the run goes on (the next point is an interval away).
    const absl::Duration wait = last ? absl::Seconds(30) : absl::Seconds(5);
    monsoon::common::LogWarning(
        "ps_evaluator: %s%s; waiting up to %.0f s for every shard",
        last ? "final evaluation: " : "", point.status().ToString(),
        absl::ToDoubleSeconds(wait));
    if (client.Reconnect(wait, absl::Seconds(10)).ok()) {
      point = evaluator.EvaluateNow();
    }
  }
  return point;
}

// Evaluates every --interval_s until a signal (then once more after
// SIGTERM, not after SIGINT) or, with --until_finished, until every worker
// has finished; the exit code.
int EvaluateUntilTheEnd(const TerminationWatcher& termination, PsClient& client,
                        monsoon::worker::CurveEvaluator& evaluator,
                        monsoon::worker::EvaluatorMetrics& eval_metrics,
                        monsoon::EvalCurve& curve) {
  const absl::Duration interval =
      absl::Seconds(absl::GetFlag(FLAGS_interval_s));
  const bool until_finished = absl::GetFlag(FLAGS_until_finished);
  bool last = false;
  bool run_finished = false;
  while (!last) {
    last = termination.terminated().WaitForNotificationWithTimeout(interval);
    if (last && termination.signal() == SIGINT) {
      monsoon::common::Log(
          "ps_evaluator: SIGINT: stopping without a last "
          "evaluation");
      break;
    }
    // Asked before the evaluation: weights pulled after every shard said
    // so are the final ones (a worker leaves after its last push).
    if (until_finished && !last && monsoon::worker::EveryWorkerFinished(client)) {
      monsoon::common::Log(
          "ps_evaluator: every worker has finished; evaluating the final "
          "weights");
      last = run_finished = true;
    }
    absl::StatusOr<monsoon::EvalPoint> point =
        EvaluateOnce(evaluator, client, last);
    if (!point.ok()) {
      monsoon::common::LogWarning("ps_evaluator: cannot evaluate now: %s",
                                  point.status().ToString());
      if (run_finished) return Fail(kExitFailure, point.status());
      continue;
    }
    *curve.add_points() = *point;
    curve.set_run_finished(run_finished);
    eval_metrics.Record(*point, absl::Now());
    monsoon::common::Log(
        "eval: %.1f s  samples %d  version %d  test accuracy %.4f  loss "
        "%.4f%s%s",
        point->time_s(), point->samples(), point->version(),
        point->test_accuracy(), point->test_loss(),
        point->test_auc() > 0 ? absl::StrFormat("  AUC %.4f", point->test_auc())
                              : "",
        last ? "  (final)" : "");
    if (!absl::GetFlag(FLAGS_curve_out).empty()) {
      absl::Status written = monsoon::worker::WriteCurve(absl::GetFlag(FLAGS_curve_out), curve);
      if (!written.ok()) return Fail(kExitFailure, written);
    }
  }
  if (until_finished && !run_finished) {
    // Stopped before the run's end (a drained node): not a success, so that
    // the Job starts another evaluator, which continues the curve.
    monsoon::common::Log(
        "ps_evaluator: stopped by signal %d before every worker finished",
        termination.signal());
    return monsoon::common::ExitCodeForSignal(termination.signal());
  }
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<TerminationWatcher> termination;
  if (absl::Status started =
          monsoon::common::StartDaemon(Info(), argc, argv, &termination);
      !started.ok()) {
    return Fail(kExitConfigError, started);
  }
  absl::Time start;
  monsoon::EvalCurve curve = StartCurve(&start);

  auto config = monsoon::common::LoadResolvedConfig(
      absl::GetFlag(FLAGS_config), absl::GetFlag(FLAGS_data_dir));
  if (!config.ok()) return Fail(kExitConfigError, config.status());
  if (absl::Status built_in = monsoon::common::CheckBuiltInModel(*config);
      !built_in.ok()) {
    return Fail(kExitConfigError, built_in);
  }
  int connect_error = kExitFailure;
  auto connect = [&] {
    return monsoon::worker::ConnectWithClientFlags(
        monsoon::worker::ObserverOptions(absl::GetFlag(FLAGS_servers), *config,
                                         &termination->terminated()),
        &connect_error);
  };
  absl::StatusOr<std::unique_ptr<PsClient>> client;
  std::unique_ptr<monsoon::worker::ComputeBackend> backend;
  std::unique_ptr<monsoon::worker::Model> model;
  monsoon::worker::Dataset test;
  std::unique_ptr<monsoon::worker::CurveEvaluator> evaluator;
  if (config->model() == monsoon::SPARSE_LR) {
    auto path = monsoon::worker::LibsvmFile(config->data_dir(), "test");
    if (!path.ok()) return Fail(kExitConfigError, path.status());
    auto examples = monsoon::worker::LoadSparseExamples(*path);
    if (!examples.ok()) return Fail(kExitConfigError, examples.status());
    client = connect();
    if (!client.ok()) return Fail(connect_error, client.status());
    evaluator = std::make_unique<monsoon::worker::SparseLrEvaluator>(
        client->get(), *std::move(examples), start);
  } else {
    auto loaded =
        monsoon::worker::LoadDatasetFor(*config, monsoon::worker::Split::kTest);
    if (!loaded.ok()) return Fail(kExitConfigError, loaded.status());
    test = *std::move(loaded);
    auto made = monsoon::worker::MakeBackend(absl::GetFlag(FLAGS_device), 1);
    if (!made.ok()) return Fail(kExitConfigError, made.status());
    backend = *std::move(made);
    auto created = monsoon::worker::Model::Create(
        backend.get(), monsoon::common::ModelLayout::FromConfig(*config), 500);
    if (!created.ok()) return Fail(kExitFailure, created.status());
    model = *std::move(created);
    client = connect();
    if (!client.ok()) return Fail(connect_error, client.status());
    evaluator = std::make_unique<monsoon::worker::Evaluator>(
        client->get(), model.get(), &test, start);
  }
  // SIGTERM asks for one last evaluation: its calls must not be cancelled by
  // it (each has a deadline).
  (*client)->set_stop(nullptr);
  auto eval_metrics = std::make_shared<monsoon::worker::EvaluatorMetrics>();
  auto metrics = monsoon::common::MetricsExporter::StartIfListening(
      absl::GetFlag(FLAGS_metrics_listen),
      monsoon::common::BuildInfoLabels("evaluator", *config), {eval_metrics});
  if (!metrics.ok()) return Fail(kExitConfigError, metrics.status());
  if (*metrics != nullptr) {
    monsoon::common::Log("ps_evaluator: metrics on port %d",
                         (*metrics)->port());
  }
  return EvaluateUntilTheEnd(*termination, **client, *evaluator, *eval_metrics,
                             curve);
}
