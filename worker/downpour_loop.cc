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

// The steps of RunOverlapped: the weights pulled and the versions they are
// of, the push in flight, and where the examples being summed begin.
class OverlappedSteps {
 public:
  OverlappedSteps(const WorkerContext& c, BatchStream* batches,
                  GradientPusher& pusher)
      : c_(c),
        batches_(batches),
        pusher_(pusher),
        params_(c.model),
        timeout_(absl::Seconds(c.config.call_timeout_s())) {}

  // One step (`step` counts from 0): a pull when one is due (every n_fetch
  // steps, and after FetchNext), the gradient into *result, a push of the
  // summed gradient every n_push steps (else the gradient summed), and the
  // local step.
  absl::Status Step(int64_t step, absl::StatusOr<BatchResult>* result) {
    if (fetch_ || step % c_.config.n_fetch() == 0) {
      if (auto s = Pull(); !s.ok()) return s;
      fetch_ = false;
    }
    PhaseTimer compute(c_.counters, Phase::kCompute);
    *result = ComputeBatchGradients(c_, *batches_);
    if (!result->ok()) return result->status();
    if (pusher_.accumulated_steps() == 0) {
      first_offset_ = batches_->sample_offset();
    }
    // The model's gradient buffer, which the local step below reads but
    // does not change, goes straight to the pusher on a push step.
    if (pusher_.accumulated_steps() + 1 == c_.config.n_push()) {
      compute.Pause();
      if (auto s = Push(c_.config.n_push(), c_.model->device_gradients());
          !s.ok()) {
        return s;
      }
    } else if (auto s = pusher_.Accumulate(c_.model->device_gradients());
               !s.ok()) {
      return s;
    }
    compute.Resume();  // the local step computes too
    return c_.model->ApplyGradients(c_.config.local_learning_rate(),
                                    c_.config.local_momentum());
  }

  // The next step pulls (the first one does anyway): after a lost shard.
  void FetchNext() { fetch_ = true; }

  // Pushes what the pusher has summed, if anything, and waits for the push
  // in flight.
  absl::Status Finish() {
    const int steps = pusher_.accumulated_steps();
    if (steps > 0) {
      if (auto s = Push(steps, nullptr); !s.ok()) return s;
    }
    return in_flight_.Finish();
  }

 private:
  // Pushes `steps` steps' gradient: device_grads plus what the pusher has
  // summed. A push that failed on a lost shard is not sent again: that
  // shard loses it, the others have it.
  absl::Status Push(int steps, const float* device_grads) {
    PhaseTimer timer(c_.counters, Phase::kPush);
    if (auto s = in_flight_.Finish(); !s.ok()) return s;
    const int64_t samples =
        static_cast<int64_t>(steps) * batches_->batch_size();
    absl::StatusOr<std::unique_ptr<PendingCall>> started =
        pusher_.Push(device_grads, versions_, samples, first_offset_);
    if (!started.ok()) return started.status();
    in_flight_.Hold(*std::move(started));
    return absl::OkStatus();
  }

  absl::Status Pull() {
    PhaseTimer timer(c_.counters, Phase::kPull);
    if (auto s = c_.client->Pull(0, timeout_, params_.span(), &versions_);
        !s.ok()) {
      return s;
    }
    return params_.Commit();
  }

  const WorkerContext& c_;
  BatchStream* const batches_;
  GradientPusher& pusher_;
  PulledParams params_;
  std::vector<int64_t> versions_;
  const absl::Duration timeout_;
  PushInFlight in_flight_;
  int64_t first_offset_ =
      0;               // where the examples of the push being summed begin
  bool fetch_ = true;  // the first step, and after a lost shard
};

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
        // The push carries the versions its gradient was computed from;
        // the answer replaces them (and the weights) with the shards' new
        // ones. Each shard's part leaves as soon as backward has made it
        // final.
        std::unique_ptr<PendingCall> push;
        {
          PhaseTimer timer(c.counters, Phase::kCompute);
          if (auto s = params.Commit(); !s.ok()) return s;
          result = ComputeAndPush(c, *batches, pusher, versions, &next, &push);
          if (!result.ok()) return result.status();
        }
        PhaseTimer timer(c.counters, Phase::kPushPull);
        return push->Wait();
      };
      if (auto s = RidingOut(c, step, pull); !s.ok()) return s;
      progress.Step(result->loss, batches->batch_size());
    }
    // An elastic stream ends early when its call to the queue fails.
    if (!batches->status().ok()) return batches->status();
    return progress.Finish();
  }

  absl::StatusOr<WorkerResult> RunOverlapped(const WorkerContext& c,
                                             BatchStream* batches,
                                             GradientPusher& pusher) {
    OverlappedSteps steps(c, batches, pusher);
    ProgressLog progress(c, *batches);
    for (int64_t step = 0; batches->Next(); ++step) {
      if (c.stop != nullptr && c.stop->HasBeenNotified()) {
        return absl::CancelledError("stopped");
      }
      absl::StatusOr<BatchResult> result;
      auto one_step = [&] { return steps.Step(step, &result); };
      auto resync = [&] {
        steps.FetchNext();
        return absl::OkStatus();
      };
      if (auto s = RidingOut(c, one_step, resync); !s.ok()) return s;
      progress.Step(result->loss, batches->batch_size());
    }
    // The last steps summed reach the shards too.
    auto finish = [&] { return steps.Finish(); };
    if (auto s = RidingOut(c, finish, [] { return absl::OkStatus(); });
        !s.ok()) {
      return s;
    }
    // An elastic stream ends early when its call to the queue fails.
    if (!batches->status().ok()) return batches->status();
    return progress.Finish();
  }
};

}  // namespace

std::unique_ptr<TrainingLoop> MakeDownpourLoop() {
  return std::make_unique<DownpourLoop>();
}

}  // namespace monsoon::worker
