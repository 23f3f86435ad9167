// downpour (Dean et al. 2012): fetch the weights every n_fetch steps; between
// fetches apply its own gradients locally (local_learning_rate); push the
// gradient summed over n_push steps, never waiting for other workers. A
// push runs while the next steps compute: the loop waits for it only when
// the next push is ready. Also the onebit mode's loop: the GradientPusher
// quantizes the pushes.

#include <memory>
#include <vector>

#include "worker/gradient_pusher.h"
#include "worker/training_loop.h"

namespace monsoon::worker {
namespace {

class DownpourLoop : public TrainingLoop {
 public:
  absl::StatusOr<WorkerResult> Run(const WorkerContext& c) override {
    absl::StatusOr<BatchStream> batches = BatchStream::ForWorker(c);
    if (!batches.ok()) return batches.status();
    absl::StatusOr<std::unique_ptr<GradientPusher>> made =
        GradientPusher::Create(c.mlp->backend(), c.client, c.config);
    if (!made.ok()) return made.status();
    GradientPusher& pusher = **made;
    std::vector<float> params(c.mlp->layout().num_params());
    std::vector<int64_t> versions;
    const absl::Duration timeout = absl::Seconds(c.config.sync_timeout_s());
    ProgressLog progress(c, *batches);

    PushInFlight in_flight;
    // Pushes `steps` steps' gradient: at device_grads, or (nullptr) what the
    // pusher has summed.
    auto push = [&](int steps, const float* device_grads) -> absl::Status {
      if (auto s = in_flight.Finish(); !s.ok()) return s;
      const int64_t samples =
          static_cast<int64_t>(steps) * batches->batch_size();
      absl::StatusOr<std::unique_ptr<PendingCall>> started =
          device_grads != nullptr ? pusher.Push(device_grads, versions, samples)
                                  : pusher.PushAccumulated(versions, samples);
      if (!started.ok()) return started.status();
      in_flight.Hold(*std::move(started));
      return absl::OkStatus();
    };

    for (int64_t step = 0; batches->Next(); ++step) {
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
      if (c.config.n_push() == 1) {
        // Straight from the model's gradient buffer, which the local step
        // below reads but does not change.
        if (auto s = push(1, c.mlp->device_gradients()); !s.ok()) return s;
      } else {
        if (auto s = pusher.Accumulate(c.mlp->device_gradients()); !s.ok()) {
          return s;
        }
        if (pusher.accumulated_steps() == c.config.n_push()) {
          if (auto s = push(c.config.n_push(), nullptr); !s.ok()) return s;
        }
      }
      if (auto s = c.mlp->ApplyGradients(c.config.local_learning_rate(),
                                         c.config.local_momentum());
          !s.ok()) {
        return s;
      }
      progress.Step(result->loss, batches->batch_size());
    }
    if (pusher.accumulated_steps() > 0) {
      if (auto s = push(pusher.accumulated_steps(), nullptr); !s.ok()) {
        return s;
      }
    }
    if (auto s = in_flight.Finish(); !s.ok()) return s;
    return progress.Finish();
  }
};

}  // namespace

std::unique_ptr<TrainingLoop> MakeDownpourLoop() {
  return std::make_unique<DownpourLoop>();
}

}  // namespace monsoon::worker
