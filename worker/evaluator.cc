#include "worker/evaluator.h"

namespace monsoon::worker {

Evaluator::Evaluator(PsClient* client, Model* model, const Dataset* test,
                     absl::Time start)
    : client_(client),
      model_(model),
      test_(test),
      start_(start),
      params_(model->layout().num_params()) {}

absl::StatusOr<EvalPoint> Evaluator::EvaluateNow() {
  // Samples first: the weights pulled next include at least these.
  absl::StatusOr<std::vector<StatsResponse>> stats =
      client_->Stats(absl::Seconds(10));
  if (!stats.ok()) return stats.status();
  std::vector<int64_t> versions;
  absl::Status status =
      client_->Pull(0, absl::Seconds(30), absl::MakeSpan(params_), &versions);
  if (!status.ok()) return status;
  const double time_s = absl::ToDoubleSeconds(absl::Now() - start_);
  if (auto s = model_->SetParams(params_); !s.ok()) return s;
  absl::StatusOr<BatchResult> result =
      model_->Evaluate(test_->images.data(), test_->labels.data(), test_->size);
  if (!result.ok()) return result.status();
  EvalPoint point;
  point.set_time_s(time_s);
  point.set_samples((*stats)[0].samples());
  point.set_test_accuracy(static_cast<double>(result->correct) /
                          std::max<int64_t>(1, result->examples));
  point.set_test_loss(result->loss);
  point.set_version(versions[0]);
  for (const StatsResponse& shard : *stats) {
    point.set_bytes_pushed(point.bytes_pushed() + shard.bytes_pushed());
    point.set_bytes_pulled(point.bytes_pulled() + shard.bytes_pulled());
  }
  return point;
}

}  // namespace monsoon::worker
