// Evaluator: pulls the current weights from every shard and measures loss
// and accuracy on a test set, so that every mode's time-to-accuracy is
// measured the same way. Not thread-safe: one thread drives it.
#ifndef MONSOON_WORKER_EVALUATOR_H_
#define MONSOON_WORKER_EVALUATOR_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/metrics.pb.h"
#include "worker/dataset.h"
#include "worker/model/model.h"
#include "worker/ps_client.h"

namespace monsoon::worker {

class Evaluator {
 public:
  // None owned; all must outlive the Evaluator. `client` registered as -1.
  Evaluator(PsClient* client, Model* model, const Dataset* test,
            absl::Time start);

  // One point of the curve: pull (no waiting), count samples, evaluate.
  absl::StatusOr<EvalPoint> EvaluateNow();

 private:
  PsClient* const client_;
  Model* const model_;
  const Dataset* const test_;
  const absl::Time start_;
  std::vector<float> params_;
};

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_EVALUATOR_H_
