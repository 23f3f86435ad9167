// Choosing a ComputeBackend from --device=auto|cpu|cuda[:N]. Stateless;
// thread-safe.
#ifndef MONSOON_WORKER_BACKEND_FACTORY_H_
#define MONSOON_WORKER_BACKEND_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/compute_backend.h"

namespace monsoon::worker {

// "cpu": OpenBLAS with `cpu_threads` threads. "cuda" (GPU 0) or "cuda:N": a
// GPU, or FAILED_PRECONDITION saying why there is none (no usable GPU, with
// the CUDA error, or a build without --config=cuda). "auto": GPU 0 where it
// is usable, else the CPU; then *why_no_gpu (if not null) gets the reason,
// and "" when the GPU was chosen. Callers log the chosen backend's Name().
// Errors other than "no usable GPU" (a GPU that is there but whose backend
// cannot be set up, e.g. RESOURCE_EXHAUSTED) are returned, not hidden by a
// fallback. INVALID_ARGUMENT for any other name.
absl::StatusOr<std::unique_ptr<ComputeBackend>> MakeBackend(
    absl::string_view device, int cpu_threads,
    std::string* why_no_gpu = nullptr);

// Whether this build has the CUDA backend (bazel build --config=cuda).
bool BuiltWithCuda();

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_BACKEND_FACTORY_H_
