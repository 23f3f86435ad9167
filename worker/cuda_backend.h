// CudaBackend: ComputeBackend on an NVIDIA GPU. Matrix products with
// cuBLAS (cublasSgemm, float32 throughout), everything else with the kernels
// of cuda_kernels.cu, all queued in order on the backend's own stream.
// Host data crosses through the backend's pinned staging buffers.
//
// Built only with --config=cuda (the one target that depends on CUDA); the
// backend factory (backend_factory.h) is how the rest of the code reaches
// it. Operations run asynchronously and record the first CUDA or cuBLAS
// error they meet; Synchronize() returns it, naming the call
// ("cublasSgemm: CUBLAS_STATUS_EXECUTION_FAILED"), and clears it.
//
// Like every backend, one thread at a time. Several backends, in one
// process or several, may share a GPU: each has its own stream, cuBLAS
// handle and memory, and none asks for exclusive use.
#ifndef MONSOON_WORKER_CUDA_BACKEND_H_
#define MONSOON_WORKER_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/compute_backend.h"

namespace monsoon::worker {

// A backend on GPU `device` (0 for the first). FAILED_PRECONDITION when the
// GPU cannot be used: no driver or one too old for this CUDA runtime, no
// such device, or a device this build's kernels (sm_90, with PTX for newer
// ones) cannot run on; the message gives the CUDA error. RESOURCE_EXHAUSTED
// when its stream, cuBLAS handle or pinned staging memory cannot be made.
absl::StatusOr<std::unique_ptr<ComputeBackend>> MakeCudaBackend(int device);

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_CUDA_BACKEND_H_
