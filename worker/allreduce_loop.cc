// allreduce: data parallelism without a parameter server in the step.
// Every step each worker computes its gradient, the ring sums the gradients
// over all workers (worker/ring.h, gloo), and every worker applies sync's
// optimizer to the average, (0 + sum) / N, as a sync shard would: all
// workers hold the same weights, bit for bit, after every step. With two
// workers the sum is the same bits in either order, so a run is the same as
// sync's with the same seed, bit for bit.
//
// The shards take no part in a step. They are the run's rendezvous (shard
// 0, where the workers find each other's ring addresses), where the
// starting weights come from (every worker pulls them), and where rank 0
// publishes the weights every publish_every (a second unless the launcher
// matches it to the evaluator's interval) and at the end, for the
// evaluator's curve, checkpoints and the run's final weights (the shard's
// rule takes them as they are: server/allreduce_rule.cc). A publish counts
// the examples of every worker since the last one, so that the shards'
// sample count is the run's.
//
// A worker that stops breaks the ring: its peers' next all-reduce fails and
// the run ends with the error (there is no ride-out: the optimizer's state
// lives in the workers). For the same reason a run cannot resume from
// weights published earlier: it is refused.

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/optimizer.h"
#include "worker/gradient_pusher.h"
#include "worker/ring.h"
#include "worker/training_loop.h"

namespace monsoon::worker {
namespace {

class AllreduceLoop : public TrainingLoop {
 public:
  absl::StatusOr<WorkerResult> Run(const WorkerContext& c) override {
    if (c.rendezvous == nullptr) {
      return absl::FailedPreconditionError(
          "mode allreduce needs the shards' rendezvous to find the other "
          "workers (a PsClient)");
    }
    if (c.resume_steps > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", c.rank, " was restarted: the shards hold ",
          c.resume_steps,
          " of its steps already, but an all-reduce run cannot take a "
          "restarted worker back (its optimizer state lived in the "
          "workers, and the ring ended with it); start a new run"));
    }
    absl::StatusOr<BatchStream> batches = BatchStream::ForWorker(c);
    if (!batches.ok()) return batches.status();
    const absl::Duration timeout = absl::Seconds(c.config.call_timeout_s());
    PulledParams params(c.model);
    std::vector<int64_t> versions;
    auto pull = [&] {
      return c.client->Pull(0, timeout, params.span(), &versions);
    };
    if (absl::Status s = RidingOut(c, pull, pull); !s.ok()) return s;
    const int64_t published = *std::max_element(versions.begin(),
                                                versions.end());
    if (published > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the shards hold weights published by an all-reduce run "
          "(version ",
          published,
          "): an all-reduce run cannot resume from them (its optimizer "
          "state lived in the workers); start a new run (fresh shards, or "
          "an empty --checkpoint_dir)"));
    }
    if (absl::Status s = params.Commit(); !s.ok()) return s;

    RingOptions options;
    options.rank = c.rank;
    options.size = c.num_workers;
    options.host = c.ring_host;
    options.timeout = timeout;
    absl::StatusOr<std::unique_ptr<Ring>> ring =
        Ring::Connect(options, c.rendezvous);
    if (!ring.ok()) return ring.status();

    const size_t n = params.span().size();
    std::unique_ptr<server::Optimizer> optimizer =
        server::MakeOptimizer(c.config, n);
    std::unique_ptr<GradientPusher> pusher;
    if (c.rank == 0) {
      absl::StatusOr<std::unique_ptr<GradientPusher>> made =
          GradientPusher::Create(c.model->backend(), c.client, c.config,
                                 c.counters);
      if (!made.ok()) return made.status();
      pusher = *std::move(made);
    }
    // The gradients where the ring sums them: the model's own buffer where
    // it is in host memory, else a copy.
    const bool host = c.model->backend()->HostMemory();
    std::vector<float> host_grads(host ? 0 : n);
    const float scale = 1.0f / static_cast<float>(c.num_workers);
    const int64_t run_batch =
        static_cast<int64_t>(batches->batch_size()) * c.num_workers;

    int64_t steps = 0;
    int64_t published_steps = 0;
    absl::Time last_publish = absl::Now();
    // Rank 0: the weights to the shards, with the run's examples since the
    // last publish.
    auto publish = [&]() -> absl::Status {
      if (pusher == nullptr || steps == published_steps) {
        return absl::OkStatus();
      }
      PhaseTimer timer(c.counters, Phase::kPush);
      absl::StatusOr<std::unique_ptr<PendingCall>> push = pusher->Push(
          c.model->device_params(), versions,
          (steps - published_steps) * run_batch,
          c.sample_origin + published_steps * run_batch);
      if (!push.ok()) return push.status();
      if (absl::Status s = (*push)->Wait(); !s.ok()) return s;
      for (int64_t& v : versions) ++v;  // only rank 0 moves them
      published_steps = steps;
      last_publish = absl::Now();
      return absl::OkStatus();
    };

    ProgressLog progress(c, *batches);
    while (batches->Next()) {
      if (c.stop != nullptr && c.stop->HasBeenNotified()) {
        return absl::CancelledError("stopped");
      }
      absl::StatusOr<BatchResult> step;
      {
        PhaseTimer timer(c.counters, Phase::kCompute);
        step = ComputeBatchGradients(c, *batches);
        if (!step.ok()) return step.status();
      }
      absl::Span<float> sum =
          host ? absl::MakeSpan(c.model->device_gradients(), n)
               : absl::MakeSpan(host_grads);
      {
        PhaseTimer timer(c.counters, Phase::kAllreduce);
        if (!host) {
          if (absl::Status s = c.model->GetGradients(sum); !s.ok()) return s;
        }
        if (absl::Status s = (*ring)->Allreduce(sum); !s.ok()) return s;
      }
      if (c.counters != nullptr) {
        c.counters->ring_bytes_sent.store((*ring)->bytes_sent());
        c.counters->ring_bytes_received.store((*ring)->bytes_received());
      }
      // sync's update of the average: (0 + sum) * (1/N), then the
      // optimizer, refused (every worker alike) where it would overflow.
      const server::Gradient mean{sum, nullptr, scale, /*plus_zero=*/true};
      float* weights = params.span().data();
      if (!optimizer->StaysFinite(mean, weights)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "step ", steps + 1,
            " would make a weight or an optimizer value infinite or NaN (an "
            "overflow): the run diverges; lower the learning rate"));
      }
      optimizer->Apply(mean, weights, weights);
      if (absl::Status s = params.Commit(); !s.ok()) return s;
      ++steps;
      if (absl::Now() - last_publish >= c.publish_every) {
        if (absl::Status s = publish(); !s.ok()) return s;
      }
      progress.Step(step->loss, batches->batch_size());
    }
    if (absl::Status s = publish(); !s.ok()) return s;
    return progress.Finish();
  }
};

}  // namespace

std::unique_ptr<TrainingLoop> MakeAllreduceLoop() {
  return std::make_unique<AllreduceLoop>();
}

}  // namespace monsoon::worker
