// downpour (Dean et al. 2012): fetch the weights every n_fetch steps; between
// fetches apply its own gradients locally (local_learning_rate); push the
// gradient summed over n_push steps, never waiting for other workers. A
// push runs while the next steps compute: the loop waits for it only when
// the next push is ready. When every step both fetches and pushes (n_fetch =
// n_push = 1, the default), each push's answer carries the weights that
// include it: one round trip per step, and no local step (the fetched
// weights would replace it at once). Also the onebit mode's loop: the
// GradientPusher quantizes the pushes. A lost shard is waited for
// (RidingOut); the step is then repeated on fresh weights.

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
        GradientPusher::Create(c.model->backend(), c.client, c.config,
                               c.counters);
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
    PulledParams params(c.model);
    std::vector<int64_t> versions;
    const absl::Duration timeout = absl::Seconds(c.config.call_timeout_s());
    auto pull = [&] {
      return c.client->Pull(0, timeout, params.span(), &versions);
    };
    if (auto s = RidingOut(c, pull, pull); !s.ok()) return s;
    // No local steps here: `params` hold exactly the weights of `versions`,
    // so under pull_compression a shard may answer with the difference.
    const PullTarget next{params.span(), &versions, timeout,
                          /*holds_base_versions=*/true};
    ProgressLog progress(c, *batches);
    while (batches->Next()) {
      if (c.stop != nullptr && c.stop->HasBeenNotified()) {
        return absl::CancelledError("stopped");
      }
      absl::StatusOr<BatchResult> result;
      auto step = [&]() -> absl::Status {
        {
          PhaseTimer timer(c.counters, Phase::kCompute);
          if (auto s = params.Commit(); !s.ok()) return s;
          result = ComputeBatchGradients(c, *batches);
          if (!result.ok()) return result.status();
        }
        PhaseTimer timer(c.counters, Phase::kPushPull);
        // The push carries the versions its gradient was computed from;
        // the answer replaces them (and the weights) with the shards' new
        // ones.
        absl::StatusOr<std::unique_ptr<PendingCall>> push =
            pusher.Push(c.model->device_gradients(), versions,
                        batches->batch_size(), batches->sample_offset(), &next);
        if (!push.ok()) return push.status();
        return (*push)->Wait();
      };
      if (auto s = RidingOut(c, step, pull); !s.ok()) return s;
      progress.Step(result->loss, batches->batch_size());
    }
    return progress.Finish();
  }

  absl::StatusOr<WorkerResult> RunOverlapped(const WorkerContext& c,
                                             BatchStream* batches,
                                             GradientPusher& pusher) {
    PulledParams params(c.model);
    std::vector<int64_t> versions;
    const absl::Duration timeout = absl::Seconds(c.config.call_timeout_s());
    ProgressLog progress(c, *batches);

    PushInFlight in_flight;
    // Where the examples of the push being summed begin.
    int64_t first_offset = 0;
    // Pushes `steps` steps' gradient: device_grads plus what the pusher has
    // summed. A push that failed on a lost shard is not sent again: that
    // shard loses it, the others have it.
    auto push = [&](int steps, const float* device_grads) -> absl::Status {
      PhaseTimer timer(c.counters, Phase::kPush);
      if (auto s = in_flight.Finish(); !s.ok()) return s;
      const int64_t samples =
          static_cast<int64_t>(steps) * batches->batch_size();
      absl::StatusOr<std::unique_ptr<PendingCall>> started =
          pusher.Push(device_grads, versions, samples, first_offset);
      if (!started.ok()) return started.status();
      in_flight.Hold(*std::move(started));
      return absl::OkStatus();
    };
    auto pull = [&]() -> absl::Status {
      PhaseTimer timer(c.counters, Phase::kPull);
      if (auto s = c.client->Pull(0, timeout, params.span(), &versions);
          !s.ok()) {
        return s;
      }
      return params.Commit();
    };

    bool fetch = true;  // the first step, and after a lost shard
    for (int64_t step = 0; batches->Next(); ++step) {
      if (c.stop != nullptr && c.stop->HasBeenNotified()) {
        return absl::CancelledError("stopped");
      }
      absl::StatusOr<BatchResult> result;
      auto one_step = [&]() -> absl::Status {
        if (fetch || step % c.config.n_fetch() == 0) {
          if (auto s = pull(); !s.ok()) return s;
          fetch = false;
        }
        PhaseTimer compute(c.counters, Phase::kCompute);
        result = ComputeBatchGradients(c, *batches);
        if (!result.ok()) return result.status();
        if (pusher.accumulated_steps() == 0) {
          first_offset = batches->sample_offset();
        }
        // The model's gradient buffer, which the local step below reads but
        // does not change, goes straight to the pusher on a push step.
        if (pusher.accumulated_steps() + 1 == c.config.n_push()) {
          compute.Pause();
          if (auto s = push(c.config.n_push(), c.model->device_gradients());
              !s.ok()) {
            return s;
          }
        } else if (auto s = pusher.Accumulate(c.model->device_gradients());
                   !s.ok()) {
          return s;
        }
        compute.Resume();  // the local step computes too
        return c.model->ApplyGradients(c.config.local_learning_rate(),
                                       c.config.local_momentum());
      };
      auto resync = [&]() -> absl::Status {
        fetch = true;
        return absl::OkStatus();
      };
      if (auto s = RidingOut(c, one_step, resync); !s.ok()) return s;
      progress.Step(result->loss, batches->batch_size());
    }
    auto finish = [&]() -> absl::Status {
      if (pusher.accumulated_steps() > 0) {
        if (auto s = push(pusher.accumulated_steps(), nullptr); !s.ok()) {
          return s;
        }
      }
      return in_flight.Finish();
    };
    auto none = [] { return absl::OkStatus(); };
    if (auto s = RidingOut(c, finish, none); !s.ok()) return s;
    return progress.Finish();
  }
};

}  // namespace

std::unique_ptr<TrainingLoop> MakeDownpourLoop() {
  return std::make_unique<DownpourLoop>();
}

}  // namespace monsoon::worker
