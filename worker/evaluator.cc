#include "worker/evaluator.h"

#include <google/protobuf/text_format.h>

#include <algorithm>

#include "common/daemon.h"

namespace monsoon::worker {

Evaluator::Evaluator(PsClient* client, Model* model, const Dataset* test,
                     absl::Time start)
    : client_(client),
      model_(model),
      test_(test),
      start_(start),
      params_(model->layout().num_params()) {}

absl::StatusOr<EvalPoint> PullSnapshot(PsClient* client,
                                       absl::Span<float> params,
                                       absl::Time start) {
  // Samples first: the weights pulled next include at least these.
  absl::StatusOr<std::vector<StatsResponse>> stats =
      client->Stats(absl::Seconds(10));
  if (!stats.ok()) return stats.status();
  std::vector<int64_t> versions;
  absl::Status status = client->Pull(0, absl::Seconds(30), params, &versions);
  if (!status.ok()) return status;
  EvalPoint point;
  point.set_time_s(absl::ToDoubleSeconds(absl::Now() - start));
  point.set_samples((*stats)[0].samples());
  point.set_version(versions[0]);
  for (const StatsResponse& shard : *stats) {
    point.set_bytes_pushed(point.bytes_pushed() + shard.bytes_pushed());
    point.set_bytes_pulled(point.bytes_pulled() + shard.bytes_pulled());
  }
  return point;
}

bool EveryWorkerFinished(PsClient& client) {
  absl::StatusOr<std::vector<StatsResponse>> stats =
      client.Stats(absl::Seconds(10));
  return stats.ok() && !stats->empty() &&
         std::all_of(stats->begin(), stats->end(),
                     [](const StatsResponse& shard) {
                       return shard.workers_finished();
                     });
}

absl::Status WriteCurve(const std::string& path, const EvalCurve& curve) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(curve, &text);
  return common::WriteFileAtomically(path, text);
}

absl::StatusOr<EvalPoint> Evaluator::EvaluateNow() {
  absl::StatusOr<EvalPoint> point =
      PullSnapshot(client_, absl::MakeSpan(params_), start_);
  if (!point.ok()) return point.status();
  if (auto s = model_->SetParams(params_); !s.ok()) return s;
  absl::StatusOr<BatchResult> result =
      model_->Evaluate(test_->images.data(), test_->labels.data(), test_->size);
  if (!result.ok()) return result.status();
  point->set_test_accuracy(static_cast<double>(result->correct) /
                           std::max<int64_t>(1, result->examples));
  point->set_test_loss(result->loss);
  return point;
}

}  // namespace monsoon::worker
