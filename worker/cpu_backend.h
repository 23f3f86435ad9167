// CpuBackend: ComputeBackend on the host, matrix products with OpenBLAS's
// sgemm, but for tall ones with a side of 16 or less (cpu_small_gemm.h), which
// run on AVX2 kernels of their own where the CPU has them and OpenBLAS runs
// one thread. Always builds. "Device" memory is ordinary aligned host memory.
// One thread at a time (see ComputeBackend).
#ifndef MONSOON_WORKER_CPU_BACKEND_H_
#define MONSOON_WORKER_CPU_BACKEND_H_

#include <memory>

#include "worker/compute_backend.h"

namespace monsoon::worker {

// `threads` > 0 sets OpenBLAS's thread count for the process; 0 leaves it.
// small_gemm_kernels false leaves every product to OpenBLAS (benchmarks
// compare the two).
std::unique_ptr<ComputeBackend> MakeCpuBackend(int threads = 0,
                                               bool small_gemm_kernels = true);

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_CPU_BACKEND_H_
