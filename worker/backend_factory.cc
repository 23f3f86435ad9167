#include "worker/backend_factory.h"

#include "absl/strings/str_cat.h"
#include "worker/cpu_backend.h"

namespace monsoon::worker {

absl::StatusOr<std::unique_ptr<ComputeBackend>> MakeBackend(
    absl::string_view device, int cpu_threads) {
  if (device == "cpu" || device == "auto") {
    return MakeCpuBackend(cpu_threads);
  }
  if (device == "cuda") {
    return absl::FailedPreconditionError(
        "--device=cuda: this build has no CUDA backend yet; use --device=cpu");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device='", device, "': use auto, cpu or cuda"));
}

}  // namespace monsoon::worker
