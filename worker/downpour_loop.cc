// downpour (Dean et al. 2012): fetch the weights every n_fetch steps; between
// fetches apply its own gradients locally (local_learning_rate); push the
// gradient summed over n_push steps, never waiting for other workers. A
// push runs while the next steps compute: the loop waits for it only when
// the next push is ready. When every step both fetches and pushes (n_fetch =
// n_push = 1, the default), each push's answer carries the weights that
// include it: one round trip per step, and no local step (the fetched
// weights would replace it at once). Also the onebit mode's loop: the
// GradientPusher quantizes the pushes.

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
    if (c.config.n_fetch() == 1 && c.config.n_push() == 1) {
      return RunOneRoundTrip(c, &*batches, *made->get());
    }
    return RunOverlapped(c, &*batches, *made->get());
  }

 private:
  absl::StatusOr<WorkerResult> RunOneRoundTrip(const WorkerContext& c,
                                               BatchStream* batches,
                                               GradientPusher& pusher) {
    PulledParams params(c.mlp);
    std::vector<int64_t> versions;
    const absl::Duration timeout = absl::Seconds(c.config.sync_timeout_s());
    absl::Status status = c.client->Pull(0, timeout, params.span(), &versions);
    if (!status.ok()) return status;
    const PullTarget next{params.span(), &versions, timeout};
    ProgressLog progress(c, *batches);
    while (batches->Next()) {
      if (c.stop != nullptr && c.stop->HasBeenNotified()) {
        return absl::CancelledError("stopped");
      }
      if (auto s = params.Commit(); !s.ok()) return s;
      absl::StatusOr<BatchResult> result = c.mlp->ComputeGradients(
          batches->images(), batches->labels(), batches->batch_size());
      if (!result.ok()) return result.status();
      // The push carries the versions its gradient was computed from; the
      // answer replaces them (and the weights) with the shards' new ones.
      absl::StatusOr<std::unique_ptr<PendingCall>> push = pusher.Push(
          c.mlp->device_gradients(), versions, batches->batch_size(), &next);
      if (!push.ok()) return push.status();
      if (auto s = (*push)->Wait(); !s.ok()) return s;
      progress.Step(result->loss, batches->batch_size());
    }
    return progress.Finish();
  }

  absl::StatusOr<WorkerResult> RunOverlapped(const WorkerContext& c,
                                             BatchStream* batches,
                                             GradientPusher& pusher) {
    PulledParams params(c.mlp);
    std::vector<int64_t> versions;
    const absl::Duration timeout = absl::Seconds(c.config.sync_timeout_s());
    ProgressLog progress(c, *batches);

    PushInFlight in_flight;
    // Pushes `steps` steps' gradient: device_grads plus what the pusher has
    // summed.
    auto push = [&](int steps, const float* device_grads) -> absl::Status {
      if (auto s = in_flight.Finish(); !s.ok()) return s;
      const int64_t samples =
          static_cast<int64_t>(steps) * batches->batch_size();
      absl::StatusOr<std::unique_ptr<PendingCall>> started =
          pusher.Push(device_grads, versions, samples);
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
            c.client->Pull(0, timeout, params.span(), &versions);
        if (!status.ok()) return status;
        if (auto s = params.Commit(); !s.ok()) return s;
      }
      absl::StatusOr<BatchResult> result = c.mlp->ComputeGradients(
          batches->images(), batches->labels(), batches->batch_size());
      if (!result.ok()) return result.status();
      // The model's gradient buffer, which the local step below reads but
      // does not change, goes straight to the pusher on a push step.
      if (pusher.accumulated_steps() + 1 == c.config.n_push()) {
        if (auto s = push(c.config.n_push(), c.mlp->device_gradients());
            !s.ok()) {
          return s;
        }
      } else if (auto s = pusher.Accumulate(c.mlp->device_gradients());
                 !s.ok()) {
        return s;
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
