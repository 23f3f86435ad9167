// CpuBackend: ComputeBackend on the host, matrix products with OpenBLAS's
// sgemm. Always builds. "Device" memory is ordinary aligned host memory.
// One thread at a time (see ComputeBackend).
#ifndef MONSOON_WORKER_CPU_BACKEND_H_
#define MONSOON_WORKER_CPU_BACKEND_H_

#include <memory>

#include "worker/compute_backend.h"

namespace monsoon::worker {

// `threads` > 0 sets OpenBLAS's thread count for the process; 0 leaves it.
std::unique_ptr<ComputeBackend> MakeCpuBackend(int threads = 0);

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_CPU_BACKEND_H_
