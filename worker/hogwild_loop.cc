// hogwild (Niu, Recht, Re and Wright 2011): pull, compute, push, never wait
// for other workers. The push of step i streams while step i+1 pulls and
// computes; the worker waits only for its own previous push before starting
// the next. Pushes leave the device shard by shard (GradientPusher).

#include <memory>
#include <vector>

#include "worker/gradient_pusher.h"
#include "worker/training_loop.h"

namespace monsoon::worker {
namespace {

class HogwildLoop : public TrainingLoop {
 public:
  absl::StatusOr<WorkerResult> Run(const WorkerContext& c) override {
    absl::StatusOr<BatchStream> batches = BatchStream::ForWorker(c);
    if (!batches.ok()) return batches.status();
    absl::StatusOr<std::unique_ptr<GradientPusher>> pusher =
        GradientPusher::Create(c.model->backend(), c.client, c.config,
                               c.counters);
    if (!pusher.ok()) return pusher.status();
    PulledParams params(c.model);
    std::vector<int64_t> versions;
    const absl::Duration timeout = absl::Seconds(c.config.call_timeout_s());
    ProgressLog progress(c, *batches);
    PushInFlight in_flight;  // the previous step's push
    auto none = [] { return absl::OkStatus(); };
    while (batches->Next()) {
      if (c.stop != nullptr && c.stop->HasBeenNotified()) {
        return absl::CancelledError("stopped");
      }
      // After a lost shard the step runs again from its pull; the previous
      // step's push, lost on that shard, is not sent again.
      absl::StatusOr<BatchResult> result;
      auto step = [&]() -> absl::Status {
        {
          PhaseTimer timer(c.counters, Phase::kPull);
          absl::Status status =
              c.client->Pull(0, timeout, params.span(), &versions);
          if (!status.ok()) return status;
        }
        {
          PhaseTimer timer(c.counters, Phase::kCompute);
          if (auto s = params.Commit(); !s.ok()) return s;
          result = ComputeBatchGradients(c, *batches);
          if (!result.ok()) return result.status();
        }
        PhaseTimer timer(c.counters, Phase::kPush);
        if (auto s = in_flight.Finish(); !s.ok()) return s;
        absl::StatusOr<std::unique_ptr<PendingCall>> push =
            (*pusher)->Push(c.model->device_gradients(), versions,
                            batches->batch_size(), batches->sample_offset());
        if (!push.ok()) return push.status();
        in_flight.Hold(*std::move(push));
        return absl::OkStatus();
      };
      if (auto s = RidingOut(c, step, none); !s.ok()) return s;
      progress.Step(result->loss, batches->batch_size());
    }
    if (auto s = RidingOut(
            c, [&] { return in_flight.Finish(); }, none);
        !s.ok()) {
      return s;
    }
    // An elastic stream ends early when its call to the queue fails.
    if (!batches->status().ok()) return batches->status();
    return progress.Finish();
  }
};

}  // namespace

std::unique_ptr<TrainingLoop> MakeHogwildLoop() {
  return std::make_unique<HogwildLoop>();
}

}  // namespace monsoon::worker
