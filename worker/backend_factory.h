// Choosing a ComputeBackend from --device=auto|cpu|cuda. Stateless.
#ifndef MONSOON_WORKER_BACKEND_FACTORY_H_
#define MONSOON_WORKER_BACKEND_FACTORY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/compute_backend.h"

namespace monsoon::worker {

// "cpu": OpenBLAS with `cpu_threads` threads. "cuda": a GPU, or
// FAILED_PRECONDITION saying why there is none. "auto": a GPU where one is
// usable, else the CPU. INVALID_ARGUMENT for any other name.
absl::StatusOr<std::unique_ptr<ComputeBackend>> MakeBackend(
    absl::string_view device, int cpu_threads);

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_BACKEND_FACTORY_H_
