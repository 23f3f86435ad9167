// downpour (Dean et al. 2012): fetch the weights every n_fetch steps; between
// fetches apply its own gradients locally (local_learning_rate); push the
// gradient accumulated over n_push steps, never waiting for other workers.
// Also the onebit mode's loop: PsClient quantizes the pushes.

#include <algorithm>
#include <vector>

#include "worker/training_loop.h"

namespace monsoon::worker {
namespace {

class DownpourLoop : public TrainingLoop {
 public:
  absl::StatusOr<WorkerResult> Run(const WorkerContext& c) override {
    absl::StatusOr<BatchStream> batches =
        BatchStream::Create(c.train, c.config, c.rank, c.num_workers);
    if (!batches.ok()) return batches.status();
    const size_t p = c.mlp->layout().num_params();
    std::vector<float> params(p), grads(p), accumulated(p, 0.0f);
    std::vector<int64_t> versions;
    const absl::Duration timeout = absl::Seconds(c.config.sync_timeout_s());
    ProgressLog progress(c, *batches);
    int64_t step = 0;
    int pending = 0;
    auto push = [&]() -> absl::Status {
      absl::Status status =
          c.client->Push(accumulated, versions,
                         static_cast<int64_t>(pending) * batches->batch_size());
      std::fill(accumulated.begin(), accumulated.end(), 0.0f);
      pending = 0;
      return status;
    };
    while (batches->Next()) {
      if (c.stop != nullptr && c.stop->HasBeenNotified()) {
        return absl::CancelledError("stopped");
      }
      if (step % c.config.n_fetch() == 0) {
        absl::Status status =
            c.client->Pull(0, timeout, absl::MakeSpan(params), &versions);
        if (!status.ok()) return status;
        if (auto s = c.mlp->SetParams(params); !s.ok()) return s;
      }
      absl::StatusOr<BatchResult> result = c.mlp->ComputeGradients(
          batches->images(), batches->labels(), batches->batch_size());
      if (!result.ok()) return result.status();
      if (auto s = c.mlp->GetGradients(absl::MakeSpan(grads)); !s.ok()) {
        return s;
      }
      if (auto s = c.mlp->ApplyGradients(c.config.local_learning_rate(),
                                         c.config.local_momentum());
          !s.ok()) {
        return s;
      }
      for (size_t i = 0; i < p; ++i) accumulated[i] += grads[i];
      ++pending;
      ++step;
      if (pending == c.config.n_push()) {
        if (auto s = push(); !s.ok()) return s;
      }
      progress.Step(result->loss, batches->batch_size());
    }
    if (pending > 0) {
      if (auto s = push(); !s.ok()) return s;
    }
    return progress.Finish();
  }
};

}  // namespace

std::unique_ptr<TrainingLoop> MakeDownpourLoop() {
  return std::make_unique<DownpourLoop>();
}

}  // namespace monsoon::worker
