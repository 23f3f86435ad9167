#include "worker/backend_factory.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "worker/cpu_backend.h"
#ifdef MONSOON_HAVE_CUDA
#include "worker/cuda_backend.h"
#endif

namespace monsoon::worker {
namespace {

// The GPU backend on `gpu`, or why there is none.
absl::StatusOr<std::unique_ptr<ComputeBackend>> MakeGpuBackend(int gpu) {
#ifdef MONSOON_HAVE_CUDA
  return MakeCudaBackend(gpu);
#else
  (void)gpu;
  return absl::FailedPreconditionError(
      "this build has no CUDA backend (rebuild with --config=cuda)");
#endif
}

}  // namespace

bool BuiltWithCuda() {
#ifdef MONSOON_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<ComputeBackend>> MakeBackend(
    absl::string_view device, int cpu_threads, std::string* why_no_gpu) {
  if (why_no_gpu != nullptr) why_no_gpu->clear();
  if (device == "cpu") return MakeCpuBackend(cpu_threads);
  if (device == "auto") {
    absl::StatusOr<std::unique_ptr<ComputeBackend>> gpu = MakeGpuBackend(0);
    if (gpu.ok() ||
        gpu.status().code() != absl::StatusCode::kFailedPrecondition) {
      return gpu;
    }
    if (why_no_gpu != nullptr)
      *why_no_gpu = std::string(gpu.status().message());
    return MakeCpuBackend(cpu_threads);
  }
  if (device == "cuda" || absl::StartsWith(device, "cuda:")) {
    int gpu = 0;
    if (device != "cuda" &&
        (!absl::SimpleAtoi(device.substr(5), &gpu) || gpu < 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--device='", device, "': a GPU is cuda or cuda:N with N >= 0"));
    }
    absl::StatusOr<std::unique_ptr<ComputeBackend>> backend =
        MakeGpuBackend(gpu);
    if (backend.ok()) return backend;
    const absl::StatusCode code = backend.status().code();
    return absl::Status(
        code,
        absl::StrCat("--device=", device, ": ", backend.status().message(),
                     code == absl::StatusCode::kFailedPrecondition
                         ? "; use --device=cpu (or auto)"
                         : ""));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device='", device, "': use auto, cpu or cuda"));
}

}  // namespace monsoon::worker
