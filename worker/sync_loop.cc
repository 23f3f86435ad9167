// sync: pull the weights of version t (waiting at the barrier), compute a
// gradient, push it as step t, and wait for version t+1.

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/gradient_pusher.h"
#include "worker/training_loop.h"

namespace monsoon::worker {
namespace {

class SyncLoop : public TrainingLoop {
 public:
  absl::StatusOr<WorkerResult> Run(const WorkerContext& c) override {
    absl::StatusOr<BatchStream> batches = BatchStream::ForWorker(c);
    if (!batches.ok()) return batches.status();
    const size_t p = c.mlp->layout().num_params();
    std::vector<float> params(p);
    absl::StatusOr<std::unique_ptr<GradientPusher>> pusher =
        GradientPusher::Create(c.mlp->backend(), c.client, c.config);
    if (!pusher.ok()) return pusher.status();
    std::vector<int64_t> versions;
    const std::vector<int64_t>& initial = c.client->initial_versions();
    // The step to push is the one every shard has yet to close. Shards
    // differ only when this worker was restarted in the middle of a step
    // that some shards have since closed; it pushes that step again (see
    // below), on weights pulled from the shards as they are.
    int64_t version = *std::min_element(initial.begin(), initial.end());
    const absl::Duration timeout = absl::Seconds(c.config.sync_timeout_s());
    ProgressLog progress(c, *batches);
    while (batches->Next()) {
      if (c.stop != nullptr && c.stop->HasBeenNotified()) {
        return absl::CancelledError("stopped");
      }
      absl::Status status =
          c.client->Pull(version, timeout, absl::MakeSpan(params), &versions);
      if (status.code() == absl::StatusCode::kDeadlineExceeded) {
        return absl::DeadlineExceededError(absl::StrCat(
            "waited more than ", c.config.sync_timeout_s(),
            " s for the barrier of step ", version,
            ": has another worker stopped? (", status.message(), ")"));
      }
      if (!status.ok()) return status;
      if (auto s = c.mlp->SetParams(params); !s.ok()) return s;
      absl::StatusOr<BatchResult> step = c.mlp->ComputeGradients(
          batches->images(), batches->labels(), batches->batch_size());
      if (!step.ok()) return step.status();
      // Every shard gets the gradient as step `version`, whatever version
      // it reported (see above).
      absl::StatusOr<std::unique_ptr<PendingCall>> push =
          (*pusher)->Push(c.mlp->device_gradients(),
                          std::vector<int64_t>(versions.size(), version),
                          batches->batch_size());
      if (!push.ok()) return push.status();
      status = (*push)->Wait();
      // A worker restarted in the middle of a push finds the shards it
      // reached holding its gradient for this step already (the same batch
      // on the same weights, so theirs stands): ALREADY_EXISTS, or ABORTED
      // where the other workers' pushes have closed the step since. A step
      // cannot close without this worker's gradient, so neither code can
      // mean it was lost.
      if (!status.ok() && status.code() != absl::StatusCode::kAlreadyExists &&
          status.code() != absl::StatusCode::kAborted) {
        return status;
      }
      ++version;
      progress.Step(step->loss, batches->batch_size());
    }
    return progress.Finish();
  }
};

}  // namespace

std::unique_ptr<TrainingLoop> MakeSyncLoop() {
  return std::make_unique<SyncLoop>();
}

}  // namespace monsoon::worker
