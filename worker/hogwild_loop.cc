// hogwild (Niu, Recht, Re and Wright 2011): pull, compute, push, never wait
// for other workers. The push of step i streams while step i+1 pulls and
// computes; the worker waits only for its own previous push before starting
// the next (two gradient buffers).

#include <memory>
#include <vector>

#include "worker/training_loop.h"

namespace monsoon::worker {
namespace {

class HogwildLoop : public TrainingLoop {
 public:
  absl::StatusOr<WorkerResult> Run(const WorkerContext& c) override {
    absl::StatusOr<BatchStream> batches = BatchStream::ForWorker(c);
    if (!batches.ok()) return batches.status();
    const size_t p = c.mlp->layout().num_params();
    std::vector<float> params(p);
    std::vector<float> grads[2] = {std::vector<float>(p),
                                   std::vector<float>(p)};
    std::vector<int64_t> versions[2];
    std::unique_ptr<PendingCall> in_flight;
    const absl::Duration timeout = absl::Seconds(c.config.sync_timeout_s());
    ProgressLog progress(c, *batches);
    int current = 0;
    while (batches->Next()) {
      if (c.stop != nullptr && c.stop->HasBeenNotified()) {
        if (in_flight != nullptr) in_flight->Wait().IgnoreError();
        return absl::CancelledError("stopped");
      }
      absl::Status status = c.client->Pull(0, timeout, absl::MakeSpan(params),
                                           &versions[current]);
      if (!status.ok()) return status;
      if (auto s = c.mlp->SetParams(params); !s.ok()) return s;
      absl::StatusOr<BatchResult> result = c.mlp->ComputeGradients(
          batches->images(), batches->labels(), batches->batch_size());
      if (!result.ok()) return result.status();
      if (auto s = c.mlp->GetGradients(absl::MakeSpan(grads[current]));
          !s.ok()) {
        return s;
      }
      if (in_flight != nullptr) {
        if (auto s = in_flight->Wait(); !s.ok()) return s;
      }
      in_flight = c.client->PushAsync(grads[current], versions[current],
                                      batches->batch_size(), nullptr);
      current = 1 - current;
      progress.Step(result->loss, batches->batch_size());
    }
    if (in_flight != nullptr) {
      if (auto s = in_flight->Wait(); !s.ok()) return s;
    }
    return progress.Finish();
  }
};

}  // namespace

std::unique_ptr<TrainingLoop> MakeHogwildLoop() {
  return std::make_unique<HogwildLoop>();
}

}  // namespace monsoon::worker
