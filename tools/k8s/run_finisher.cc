#include "tools/k8s/run_finisher.h"

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/daemon.h"
#include "common/log.h"

namespace monsoon::tools {
namespace {

// Waits `d`, or returns false when `stop` was notified.
bool Wait(const absl::Notification* stop, absl::Duration d) {
  if (stop == nullptr) {
    absl::SleepFor(d);
    return true;
  }
  return !stop->WaitForNotificationWithTimeout(d);
}

// The curve at `path`, or nothing when it is missing or does not parse
// (the evaluator replaces it atomically, so that is a file not yet
// written, or not the evaluator's).
std::optional<EvalCurve> ReadCurve(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  EvalCurve curve;
  if (!google::protobuf::TextFormat::ParseFromString(text.str(), &curve)) {
    return std::nullopt;
  }
  return curve;
}

// The shards' Stats once every worker has finished on every shard (or the
// run is closed), logging what it waits for when that changes. CANCELLED
// when options.stop is notified first.
absl::StatusOr<std::vector<StatsResponse>> WaitForEveryWorker(
    worker::PsClient* client, const FinishOptions& options) {
  std::string last_said;
  while (true) {
    absl::StatusOr<std::vector<StatsResponse>> now =
        client->Stats(absl::Seconds(10));
    std::string said;
    if (!now.ok()) {
      said = absl::StrCat("cannot ask every shard: ", now.status().ToString());
    } else if (std::all_of(now->begin(), now->end(),
                           [](const StatsResponse& s) {
                             return s.workers_finished() || s.run_closed();
                           })) {
      return now;
    } else {
      std::vector<std::string> shards;
      for (const StatsResponse& s : *now) {
        shards.push_back(absl::StrCat("shard ", s.shard(), ": ranks [",
                                      absl::StrJoin(s.finished_ranks(), ","),
                                      "]"));
      }
      said = absl::StrCat("waiting for every worker to finish; finished ",
                          absl::StrJoin(shards, ", "));
    }
    if (said != last_said) common::Log("run_finisher: %s", said);
    last_said = said;
    if (!Wait(options.stop, options.poll)) {
      return absl::CancelledError("stopped before every worker finished");
    }
  }
}

// The evaluator's curve once it has the point of the final weights, or as
// it is after options.evaluator_timeout (with a warning; nothing when there
// is no curve). CANCELLED when options.stop is notified first.
absl::StatusOr<std::optional<EvalCurve>> WaitForFinalPoint(
    const FinishOptions& options) {
  const absl::Time give_up = absl::Now() + options.evaluator_timeout;
  std::optional<EvalCurve> curve = ReadCurve(options.curve_path);
  while (!(curve && curve->run_finished()) && absl::Now() < give_up) {
    if (!Wait(options.stop, std::min(options.poll, absl::Seconds(1)))) {
      return absl::CancelledError("stopped waiting for the evaluator");
    }
    curve = ReadCurve(options.curve_path);
  }
  if (!(curve && curve->run_finished())) {
    common::LogWarning(
        "run_finisher: %s has no point of the final weights after %s "
        "(is the evaluator running with --until_finished?); the metrics "
        "have the curve as it is",
        options.curve_path, absl::FormatDuration(options.evaluator_timeout));
  }
  return curve;
}

}  // namespace

RunMetrics FinishedRunMetrics(const TrainingConfig& config,
                              const std::vector<StatsResponse>& shards,
                              const EvalCurve& curve) {
  RunMetrics run;
  run.config = config;
  run.servers = static_cast<int>(shards.size());
  run.shard_stats = shards;
  run.curve = curve;
  if (shards.empty()) return run;
  run.workers = shards[0].finished_ranks_size();
  run.trained_samples = shards[0].samples();
  double first = 0, last = 0;
  for (const StatsResponse& shard : shards) {
    if (shard.first_push_unix_s() > 0 &&
        (first == 0 || shard.first_push_unix_s() < first)) {
      first = shard.first_push_unix_s();
    }
    last = std::max(last, shard.workers_finished_unix_s());
  }
  if (first > 0 && last > first) run.train_time_s = last - first;
  run.wall_time_s = run.train_time_s;
  return run;
}

absl::Status FinishRun(worker::PsClient* client, const FinishOptions& options) {
  // 1. Every worker has finished, on every shard.
  absl::StatusOr<std::vector<StatsResponse>> stats =
      WaitForEveryWorker(client, options);
  if (!stats.ok()) return stats.status();
  common::Log("run_finisher: every worker has finished");

  // 2. The evaluator's point of the final weights.
  absl::StatusOr<std::optional<EvalCurve>> curve = WaitForFinalPoint(options);
  if (!curve.ok()) return curve.status();

  // 3. The metrics, from the shards' final counters.
  if (absl::StatusOr<std::vector<StatsResponse>> final_stats =
          client->Stats(absl::Seconds(10));
      final_stats.ok()) {
    stats = *std::move(final_stats);
  }
  const RunMetrics run =
      FinishedRunMetrics(options.config, *stats, curve->value_or(EvalCurve()));
  if (absl::Status written =
          common::WriteFileAtomically(options.metrics_out, MetricsJson(run));
      !written.ok()) {
    return written;
  }
  common::Log(
      "run_finisher: wrote %s: %d samples in %.1f s, final test accuracy "
      "%.4f (%d curve points)",
      options.metrics_out, run.trained_samples, run.train_time_s,
      run.curve.points_size() > 0
          ? run.curve.points(run.curve.points_size() - 1).test_accuracy()
          : 0.0,
      run.curve.points_size());

  // 4. Close the run: every shard saves its final checkpoint and stops.
  if (absl::Status closed = client->CloseRun(absl::Seconds(10)); !closed.ok()) {
    return closed;
  }
  common::Log("run_finisher: closed the run on every shard");
  return absl::OkStatus();
}

}  // namespace monsoon::tools
