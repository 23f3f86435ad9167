// sync: compute a gradient on the weights of version t, push it as step t
// and receive, in the same call, the weights of version t+1 once every
// worker's step-t gradient has arrived (the barrier): one round trip per
// step. Each shard keeps its own step count: after a shard restarted from
// an older checkpoint, its steps simply continue from there.

#include <algorithm>
#include <optional>
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
    PulledParams params(c.model);
    absl::StatusOr<std::unique_ptr<GradientPusher>> pusher =
        GradientPusher::Create(c.model->backend(), c.client, c.config,
                               c.counters);
    if (!pusher.ok()) return pusher.status();
    // versions[s]: the step shard s is collecting, which the weights in
    // `params` belong to.
    std::vector<int64_t> versions;
    const absl::Duration timeout = absl::Seconds(c.config.call_timeout_s());
    auto barrier_error = [&](const absl::Status& status) {
      if (status.code() != absl::StatusCode::kDeadlineExceeded) return status;
      return absl::DeadlineExceededError(absl::StrCat(
          "waited more than ", c.config.call_timeout_s(),
          " s for the barrier of step ",
          versions.empty()
              ? 0
              : *std::min_element(versions.begin(), versions.end()),
          ": has another worker stopped? (", status.message(), ")"));
    };
    // Every shard's current weights, without waiting. A worker restarted in
    // the middle of a step finds the shards as they are: those that closed
    // it since give the next step's weights, and its push to them comes
    // back as a duplicate (its examples are in); those still collecting it
    // give that step's.
    auto pull = [&] {
      return c.client->Pull(0, timeout, params.span(), &versions);
    };
    absl::Status status = RidingOut(c, pull, pull);  // a lost shard waited for
    if (!status.ok()) return barrier_error(status);
    // The weights in `params` are always exactly those of `versions` (sync
    // has no local steps): under pull_compression the shards may answer
    // with the 1-bit difference from them.
    const PullTarget next{params.span(), &versions, timeout,
                          /*holds_base_versions=*/true};
    ProgressLog progress(c, *batches);
    while (batches->Next()) {
      if (c.stop != nullptr && c.stop->HasBeenNotified()) {
        return absl::CancelledError("stopped");
      }
      if (batches->TakeRejoined()) {
        // Elastic: back in the run after waiting out of it for data; the
        // steps went on meanwhile.
        status = RidingOut(c, pull, pull);
        if (!status.ok()) return barrier_error(status);
      }
      // After a lost shard, the step again. Where no shard went back past
      // the weights the step's gradient came from (the range's backup took
      // a dead shard over, or it came back at or past them), the same
      // push is sent again as it was: shards that had applied it answer it
      // as a duplicate, the others take it into the step it was computed
      // for, as they would have without the failure (bit for bit: a
      // replicated run comes out the same). Otherwise it is computed again
      // on every shard's current weights: shards that had applied it
      // answer the repeat as a duplicate, and shards still collecting it
      // with this worker's first push keep that one (the repeat is
      // marked: PushHeader.repeat), though a shard that went back makes
      // the recomputed values differ.
      absl::StatusOr<BatchResult> step;
      // This batch's gradient, once computed, and the versions it was
      // computed from (a push-pull that failed may have changed
      // `versions`).
      std::optional<BatchResult> computed;
      std::vector<int64_t> computed_from;
      bool resend = false;
      auto resync = [&]() -> absl::Status {
        const std::vector<int64_t> now = c.client->versions_at_reconnect();
        resend = computed.has_value() && now.size() == computed_from.size();
        for (size_t s = 0; resend && s < now.size(); ++s) {
          resend = now[s] >= computed_from[s];
        }
        if (!resend) return pull();
        versions = computed_from;
        return absl::OkStatus();
      };
      status = RidingOut(
          c,
          [&] {
            if (!resend) computed.reset();
            resend = false;
            if (!computed.has_value()) computed_from = versions;
            step = Step(c, *pusher->get(), &params, &versions, next, *batches,
                        &computed);
            return step.status();
          },
          resync);
      if (!status.ok()) return barrier_error(status);
      progress.Step(step->loss, batches->batch_size());
    }
    // An elastic stream ends early when its call to the queue fails.
    if (!batches->status().ok()) return batches->status();
    return progress.Finish();
  }

 private:
  // One step: the gradient on `params`, pushed to shard s as step
  // versions[s]; `params` and `versions` get the next step's. The
  // gradient is computed into the model and noted in `computed`; where
  // `computed` holds one already, that one (still the model's) is pushed
  // again.
  absl::StatusOr<BatchResult> Step(const WorkerContext& c,
                                   GradientPusher& pusher, PulledParams* params,
                                   std::vector<int64_t>* versions,
                                   const PullTarget& next,
                                   const BatchStream& batches,
                                   std::optional<BatchResult>* computed) {
    // Includes the wait at the barrier.
    auto push_pull = [&](std::unique_ptr<PendingCall> push) -> absl::Status {
      PhaseTimer timer(c.counters, Phase::kPushPull);
      return push->Wait();
    };
    if (computed->has_value()) {
      // A shard that already holds this push (a worker restarted, or
      // repeating its step after a lost connection) answers it as a
      // duplicate, with the next step's weights all the same (PushPull).
      // The failed call may have written some shards' answers into
      // `params` already (under pull_compression, a 1-bit difference added
      // in place): the answers this time are the weights themselves.
      PullTarget whole = next;
      whole.holds_base_versions = false;
      absl::StatusOr<std::unique_ptr<PendingCall>> push = pusher.PushAgain(
          c.model->device_gradients(), *versions, batches.batch_size(),
          batches.sample_offset(), &whole);
      if (!push.ok()) return push.status();
      if (absl::Status status = push_pull(*std::move(push)); !status.ok()) {
        return status;
      }
      return **computed;
    }
    absl::StatusOr<BatchResult> step;
    std::unique_ptr<PendingCall> push;
    {
      PhaseTimer timer(c.counters, Phase::kCompute);
      if (auto s = params->Commit(); !s.ok()) return s;
      step = ComputeAndPush(c, batches, pusher, *versions, &next, &push);
      if (!step.ok()) return step.status();
      *computed = *step;
    }
    if (absl::Status status = push_pull(std::move(push)); !status.ok()) {
      return status;
    }
    return step;
  }
};

}  // namespace

std::unique_ptr<TrainingLoop> MakeSyncLoop() {
  return std::make_unique<SyncLoop>();
}

}  // namespace monsoon::worker
