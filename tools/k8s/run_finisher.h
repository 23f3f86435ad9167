// The end of a run on Kubernetes (tools/k8s): once every worker has
// finished and the evaluator has measured the final weights, writes the
// run's metrics (tools/metrics.h's JSON, the one launch_local --metrics_out
// writes) to the results volume, then closes the run, so that every shard
// saves its final checkpoint and exits 0 and the run leaves nothing running.
// Functions, no state; FinishRun blocks its caller's thread.
#ifndef MONSOON_TOOLS_K8S_RUN_FINISHER_H_
#define MONSOON_TOOLS_K8S_RUN_FINISHER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "proto/config.pb.h"
#include "proto/metrics.pb.h"
#include "proto/service.pb.h"
#include "tools/metrics.h"
#include "worker/ps_client.h"

namespace monsoon::tools {

struct FinishOptions {
  TrainingConfig config;  // resolved, the run's
  // The evaluator's curve (ps_evaluator --curve_out, text-format EvalCurve).
  std::string curve_path;
  // Where the metrics go (written atomically: a reader never sees half).
  std::string metrics_out;
  // How often the shards are asked whether every worker has finished.
  absl::Duration poll = absl::Seconds(5);
  // How long, after every worker finished, to wait for the evaluator's
  // final point (EvalCurve.run_finished); then the metrics are written with
  // the curve as it is, and a warning logged.
  absl::Duration evaluator_timeout = absl::Minutes(5);
  // Notified to give up (SIGTERM): FinishRun returns CANCELLED. May be null.
  const absl::Notification* stop = nullptr;
};

// The metrics of a finished run from the shards' final stats (in shard
// order) and the evaluator's curve: samples are the examples the shards
// applied (shard 0's count), the training time runs from the first push
// any shard applied to the moment the last shard saw its last worker
// finish (StatsResponse.first_push_unix_s, workers_finished_unix_s), and is
// also the wall time; the workers are the ranks shard 0 counts as finished.
RunMetrics FinishedRunMetrics(const TrainingConfig& config,
                              const std::vector<StatsResponse>& shards,
                              const EvalCurve& curve);

// Waits (polling every options.poll) until every shard reports
// workers_finished, then for the evaluator's final point, writes the
// metrics to options.metrics_out and closes the run on every shard
// (PsClient::CloseRun; `client` is of rank -1). OK once closed; CANCELLED
// when options.stop is notified first; INTERNAL when the metrics cannot be
// written; a shard's error when it refuses to close.
absl::Status FinishRun(worker::PsClient* client, const FinishOptions& options);

}  // namespace monsoon::tools

#endif  // MONSOON_TOOLS_K8S_RUN_FINISHER_H_
