// sync: compute a gradient on the weights of version t, push it as step t
// and receive, in the same call, the weights of version t+1 once every
// worker's step-t gradient has arrived (the barrier): one round trip per
// step.

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
    PulledParams params(c.mlp);
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
    auto barrier_error = [&](const absl::Status& status) {
      if (status.code() != absl::StatusCode::kDeadlineExceeded) return status;
      return absl::DeadlineExceededError(absl::StrCat(
          "waited more than ", c.config.sync_timeout_s(),
          " s for the barrier of step ", version,
          ": has another worker stopped? (", status.message(), ")"));
    };
    absl::Status status =
        c.client->Pull(version, timeout, params.span(), &versions);
    if (!status.ok()) return barrier_error(status);
    const PullTarget next{params.span(), &versions, timeout};
    ProgressLog progress(c, *batches);
    while (batches->Next()) {
      if (c.stop != nullptr && c.stop->HasBeenNotified()) {
        return absl::CancelledError("stopped");
      }
      if (auto s = params.Commit(); !s.ok()) return s;
      absl::StatusOr<BatchResult> step = c.mlp->ComputeGradients(
          batches->images(), batches->labels(), batches->batch_size());
      if (!step.ok()) return step.status();
      // Every shard gets the gradient as step `version`, whatever version
      // it reported (see above), and answers with step version+1's weights.
      absl::StatusOr<std::unique_ptr<PendingCall>> push =
          (*pusher)->Push(c.mlp->device_gradients(),
                          std::vector<int64_t>(versions.size(), version),
                          batches->batch_size(), &next);
      if (!push.ok()) return push.status();
      status = (*push)->Wait();
      // A worker restarted in the middle of a push finds the shards it
      // reached holding its gradient for this step already (the same batch
      // on the same weights, so theirs stands): ALREADY_EXISTS, or ABORTED
      // where the other workers' pushes have closed the step since. A step
      // cannot close without this worker's gradient, so neither code can
      // mean it was lost. Those shards sent no weights: pull them all.
      if (status.code() == absl::StatusCode::kAlreadyExists ||
          status.code() == absl::StatusCode::kAborted) {
        status = c.client->Pull(version + 1, timeout, params.span(), &versions);
      }
      ++version;
      if (!status.ok()) return barrier_error(status);
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
