// easgd (asynchronous Elastic Averaging SGD, Zhang, Choromanska and LeCun
// 2015, Algorithm 1): local SGD (with local_momentum: EAMSGD) on the worker's
// own copy x at every step; every tau steps pull the center x~, compute
// d = alpha * (x - x~), set x -= d and push d, which the shard adds to x~.
// x and d stay on the device; only the center crosses to it. The pushed d
// carries the version of the center it was computed from, so the shard
// records the exchange's staleness.

#include <vector>

#include "worker/gradient_pusher.h"
#include "worker/training_loop.h"

namespace monsoon::worker {
namespace {

class EasgdLoop : public TrainingLoop {
 public:
  absl::StatusOr<WorkerResult> Run(const WorkerContext& c) override {
    absl::StatusOr<BatchStream> batches = BatchStream::ForWorker(c);
    if (!batches.ok()) return batches.status();
    const size_t p = c.model->layout().num_params();
    const float alpha = c.config.has_alpha()
                            ? c.config.alpha()
                            : 0.9f / static_cast<float>(c.num_workers);
    ComputeBackend* backend = c.model->backend();
    absl::StatusOr<std::unique_ptr<GradientPusher>> pusher =
        GradientPusher::Create(backend, c.client, c.config, c.counters);
    if (!pusher.ok()) return pusher.status();
    absl::StatusOr<float*> elastic = backend->AllocateFloats(p);
    if (!elastic.ok()) return elastic.status();
    struct Free {
      ComputeBackend* backend;
      float* d;
      ~Free() { backend->Free(d); }
    } free_elastic{backend, *elastic};
    float* d = *elastic;
    std::vector<float> center(p);
    std::vector<int64_t> versions;
    const absl::Duration timeout = absl::Seconds(c.config.call_timeout_s());
    // Start from the center.
    auto first = [&] {
      return c.client->Pull(0, timeout, absl::MakeSpan(center), &versions);
    };
    if (absl::Status status = RidingOut(c, first, first); !status.ok()) {
      return status;
    }
    if (auto s = c.model->SetParams(center); !s.ok()) return s;

    ProgressLog progress(c, *batches);
    int since_exchange = 0;
    int64_t window_offset = 0;  // where the exchanged steps' examples begin
    // One exchange. A shard lost while pulling the center: the exchange
    // runs again once the shard is back (nothing has changed yet). Lost
    // while pushing d: x has moved, so the exchange is not repeated; that
    // shard's center misses this d.
    bool pushing = false;
    auto exchange = [&]() -> absl::Status {
      if (pushing) return absl::OkStatus();  // lost while pushing: done
      {
        PhaseTimer timer(c.counters, Phase::kPull);
        absl::Status pulled =
            c.client->Pull(0, timeout, absl::MakeSpan(center), &versions);
        if (!pulled.ok()) return pulled;
      }
      // The elastic step and the push (its transfer and the wait for it).
      PhaseTimer timer(c.counters, Phase::kPush);
      // d = alpha * (x - center), then x -= d, on the device.
      float* x = c.model->device_params();
      if (auto s = backend->CopyToDevice(center.data(), d, p * sizeof(float));
          !s.ok()) {
        return s;
      }
      backend->Scale(p, -1.0f, d);
      backend->Axpy(p, 1.0f, x, d);
      backend->Scale(p, alpha, d);
      backend->Axpy(p, -1.0f, d, x);
      pushing = true;
      absl::StatusOr<std::unique_ptr<PendingCall>> push = (*pusher)->Push(
          d, versions,
          static_cast<int64_t>(since_exchange) * batches->batch_size(),
          window_offset);
      if (!push.ok()) return push.status();
      return (*push)->Wait();
    };
    auto none = [] { return absl::OkStatus(); };
    auto exchange_riding_out = [&]() -> absl::Status {
      pushing = false;
      absl::Status status = RidingOut(c, exchange, none);
      since_exchange = 0;
      return status;
    };
    while (batches->Next()) {
      if (c.stop != nullptr && c.stop->HasBeenNotified()) {
        return absl::CancelledError("stopped");
      }
      if (since_exchange == 0) window_offset = batches->sample_offset();
      PhaseTimer compute(c.counters, Phase::kCompute);
      absl::StatusOr<BatchResult> result = ComputeBatchGradients(c, *batches);
      if (!result.ok()) return result.status();
      if (auto s = c.model->ApplyGradients(c.config.local_learning_rate(),
                                           c.config.local_momentum());
          !s.ok()) {
        return s;
      }
      compute.Pause();
      if (++since_exchange == c.config.tau()) {
        if (auto s = exchange_riding_out(); !s.ok()) return s;
      }
      progress.Step(result->loss, batches->batch_size());
    }
    // The last local steps reach the center too.
    if (since_exchange > 0) {
      if (auto s = exchange_riding_out(); !s.ok()) return s;
    }
    return progress.Finish();
  }
};

}  // namespace

std::unique_ptr<TrainingLoop> MakeEasgdLoop() {
  return std::make_unique<EasgdLoop>();
}

}  // namespace monsoon::worker
