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

// A device buffer of floats, freed when it goes.
class DeviceFloats {
 public:
  DeviceFloats(ComputeBackend* backend, float* data)
      : backend_(backend), data_(data) {}
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  ~DeviceFloats() { backend_->Free(data_); }
  float* get() const { return data_; }

 private:
  ComputeBackend* const backend_;
  float* const data_;
};

// The elastic step, on the device: d = alpha * (x - center), then x -= d
// (x and d of p floats on the device, center on the host).
absl::Status ElasticStep(ComputeBackend* backend, size_t p, float alpha,
                         const std::vector<float>& center, float* x, float* d) {
  if (auto s = backend->CopyToDevice(center.data(), d, p * sizeof(float));
      !s.ok()) {
    return s;
  }
  backend->Scale(p, -1.0f, d);
  backend->Axpy(p, 1.0f, x, d);
  backend->Scale(p, alpha, d);
  backend->Axpy(p, -1.0f, d, x);
  return absl::OkStatus();
}

// A worker's exchanges with the center: its pull, the elastic step and the
// push of d.
class Exchanges {
 public:
  // `d`: p floats on the device, for the elastic difference.
  Exchanges(const WorkerContext& c, GradientPusher* pusher, float* d)
      : c_(c),
        pusher_(pusher),
        d_(d),
        alpha_(c.config.has_alpha() ? c.config.alpha()
                                    : 0.9f / static_cast<float>(c.num_workers)),
        center_(c.model->layout().num_params()),
        timeout_(absl::Seconds(c.config.call_timeout_s())) {}

  // Pulls the center (the start, riding out a lost shard).
  absl::Status PullCenter() {
    return c_.client->Pull(0, timeout_, absl::MakeSpan(center_), &versions_);
  }
  const std::vector<float>& center() const { return center_; }

  // One exchange for the steps of `samples` examples from `offset`. A shard
  // lost while pulling the center: the exchange runs again once the shard
  // is back (nothing has changed yet). Lost while pushing d: x has moved,
  // so the exchange is not repeated; that shard's center misses this d.
  absl::Status RideOut(int64_t samples, int64_t offset) {
    pushing_ = false;
    return RidingOut(
        c_, [&] { return Once(samples, offset); },
        [] { return absl::OkStatus(); });
  }

 private:
  absl::Status Once(int64_t samples, int64_t offset) {
    if (pushing_) return absl::OkStatus();  // lost while pushing: done
    {
      PhaseTimer timer(c_.counters, Phase::kPull);
      if (auto s = PullCenter(); !s.ok()) return s;
    }
    // The elastic step and the push (its transfer and the wait for it).
    PhaseTimer timer(c_.counters, Phase::kPush);
    if (auto s =
            ElasticStep(c_.model->backend(), c_.model->layout().num_params(),
                        alpha_, center_, c_.model->device_params(), d_);
        !s.ok()) {
      return s;
    }
    pushing_ = true;
    absl::StatusOr<std::unique_ptr<PendingCall>> push =
        pusher_->Push(d_, versions_, samples, offset);
    if (!push.ok()) return push.status();
    return (*push)->Wait();
  }

  const WorkerContext& c_;
  GradientPusher* const pusher_;
  float* const d_;
  const float alpha_;
  std::vector<float> center_;
  std::vector<int64_t> versions_;
  const absl::Duration timeout_;
  bool pushing_ = false;
};

class EasgdLoop : public TrainingLoop {
 public:
  absl::StatusOr<WorkerResult> Run(const WorkerContext& c) override {
    absl::StatusOr<BatchStream> batches = BatchStream::ForWorker(c);
    if (!batches.ok()) return batches.status();
    ComputeBackend* backend = c.model->backend();
    absl::StatusOr<std::unique_ptr<GradientPusher>> pusher =
        GradientPusher::Create(backend, c.client, c.config, c.counters);
    if (!pusher.ok()) return pusher.status();
    absl::StatusOr<float*> elastic =
        backend->AllocateFloats(c.model->layout().num_params());
    if (!elastic.ok()) return elastic.status();
    const DeviceFloats d(backend, *elastic);
    Exchanges exchanges(c, pusher->get(), d.get());
    // Start from the center.
    auto first = [&] { return exchanges.PullCenter(); };
    if (absl::Status status = RidingOut(c, first, first); !status.ok()) {
      return status;
    }
    if (auto s = c.model->SetParams(exchanges.center()); !s.ok()) return s;

    ProgressLog progress(c, *batches);
    int since_exchange = 0;
    int64_t window_offset = 0;  // where the exchanged steps' examples begin
    auto exchange = [&]() -> absl::Status {
      absl::Status status = exchanges.RideOut(
          static_cast<int64_t>(since_exchange) * batches->batch_size(),
          window_offset);
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
        if (auto s = exchange(); !s.ok()) return s;
      }
      progress.Step(result->loss, batches->batch_size());
    }
    // The last local steps reach the center too.
    if (since_exchange > 0) {
      if (auto s = exchange(); !s.ok()) return s;
    }
    // An elastic stream ends early when its call to the queue fails.
    if (!batches->status().ok()) return batches->status();
    return progress.Finish();
  }
};

}  // namespace

std::unique_ptr<TrainingLoop> MakeEasgdLoop() {
  return std::make_unique<EasgdLoop>();
}

}  // namespace monsoon::worker
