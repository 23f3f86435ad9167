// easgd (asynchronous Elastic Averaging SGD, Zhang, Choromanska and LeCun
// 2015, Algorithm 1): local SGD (with local_momentum: EAMSGD) on the worker's
// own copy x at every step; every tau steps pull the center x~, compute
// d = alpha * (x - x~), set x -= d and push d, which the shard adds to x~.
// The pushed d carries the version of the center it was computed from, so the
// shard records the exchange's staleness.

#include <vector>

#include "worker/training_loop.h"

namespace monsoon::worker {
namespace {

class EasgdLoop : public TrainingLoop {
 public:
  absl::StatusOr<WorkerResult> Run(const WorkerContext& c) override {
    absl::StatusOr<BatchStream> batches = BatchStream::ForWorker(c);
    if (!batches.ok()) return batches.status();
    const size_t p = c.mlp->layout().num_params();
    const float alpha = c.config.has_alpha()
                            ? c.config.alpha()
                            : 0.9f / static_cast<float>(c.num_workers);
    std::vector<float> x(p), center(p), elastic(p);
    std::vector<int64_t> versions;
    const absl::Duration timeout = absl::Seconds(c.config.sync_timeout_s());
    // Start from the center.
    absl::Status status =
        c.client->Pull(0, timeout, absl::MakeSpan(x), &versions);
    if (!status.ok()) return status;
    if (auto s = c.mlp->SetParams(x); !s.ok()) return s;

    ProgressLog progress(c, *batches);
    int since_exchange = 0;
    auto exchange = [&]() -> absl::Status {
      absl::Status pulled =
          c.client->Pull(0, timeout, absl::MakeSpan(center), &versions);
      if (!pulled.ok()) return pulled;
      if (auto s = c.mlp->GetParams(absl::MakeSpan(x)); !s.ok()) return s;
      for (size_t i = 0; i < p; ++i) {
        elastic[i] = alpha * (x[i] - center[i]);
        x[i] -= elastic[i];
      }
      if (auto s = c.mlp->SetParams(x); !s.ok()) return s;
      absl::Status pushed = c.client->Push(
          elastic, versions,
          static_cast<int64_t>(since_exchange) * batches->batch_size());
      since_exchange = 0;
      return pushed;
    };
    while (batches->Next()) {
      if (c.stop != nullptr && c.stop->HasBeenNotified()) {
        return absl::CancelledError("stopped");
      }
      absl::StatusOr<BatchResult> result = c.mlp->ComputeGradients(
          batches->images(), batches->labels(), batches->batch_size());
      if (!result.ok()) return result.status();
      if (auto s = c.mlp->ApplyGradients(c.config.local_learning_rate(),
                                         c.config.local_momentum());
          !s.ok()) {
        return s;
      }
      if (++since_exchange == c.config.tau()) {
        if (auto s = exchange(); !s.ok()) return s;
      }
      progress.Step(result->loss, batches->batch_size());
    }
    // The last local steps reach the center too.
    if (since_exchange > 0) {
      if (auto s = exchange(); !s.ok()) return s;
    }
    return progress.Finish();
  }
};

}  // namespace

std::unique_ptr<TrainingLoop> MakeEasgdLoop() {
  return std::make_unique<EasgdLoop>();
}

}  // namespace monsoon::worker
