// Evaluator: pulls the current weights from every shard and measures loss
// and accuracy on a test set, so that every mode's time-to-accuracy is
// measured the same way. Not thread-safe: one thread drives it.
#ifndef MONSOON_WORKER_EVALUATOR_H_
#define MONSOON_WORKER_EVALUATOR_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/metrics.pb.h"
#include "worker/dataset.h"
#include "worker/model/model.h"
#include "worker/ps_client.h"

namespace monsoon::worker {

// A point of the curve without its accuracy and loss: the shards' counters
// (samples from shard 0, bytes summed), then their current weights pulled
// into `params` (no waiting), so that the weights include at least those
// samples; time_s since `start`, version of shard 0.
absl::StatusOr<EvalPoint> PullSnapshot(PsClient* client,
                                       absl::Span<float> params,
                                       absl::Time start);

// Whether every shard says that every worker has finished.
bool EveryWorkerFinished(PsClient& client);

// Writes `curve` to `path` in text format, atomically.
absl::Status WriteCurve(const std::string& path, const EvalCurve& curve);

// Something that measures the shards' current weights on a test set: one
// point of a run's curve at each call.
class CurveEvaluator {
 public:
  virtual ~CurveEvaluator() = default;
  virtual absl::StatusOr<EvalPoint> EvaluateNow() = 0;
};

// A model of layers (worker/model) on an IDX test set.
class Evaluator : public CurveEvaluator {
 public:
  // None owned; all must outlive the Evaluator. `client` registered as -1.
  Evaluator(PsClient* client, Model* model, const Dataset* test,
            absl::Time start);

  // One point of the curve: pull (no waiting), count samples, evaluate.
  absl::StatusOr<EvalPoint> EvaluateNow() override;

 private:
  PsClient* const client_;
  Model* const model_;
  const Dataset* const test_;
  const absl::Time start_;
  std::vector<float> params_;
};

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_EVALUATOR_H_
