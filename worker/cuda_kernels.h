// CUDA kernels behind CudaBackend (cuda_backend.cc), compiled by nvcc from
// cuda_kernels.cu; this header is plain C++ for the host compiler. Each
// function queues one or two kernels on `stream` and returns the launch's
// error (cudaGetLastError): errors while the kernel runs surface later, at a
// synchronization. The semantics are ComputeBackend's (compute_backend.h),
// matched to the CPU backend's arithmetic where it matters: the same arg-max
// tie rule, double accumulation of the softmax loss and of the 1-bit
// reconstruction values. Stateless; any thread.
#ifndef MONSOON_WORKER_CUDA_KERNELS_H_
#define MONSOON_WORKER_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace monsoon::worker::cuda {

// ComputeBackend's WindowGeometry (compute_backend.h), which this header
// cannot include: images channels last, kernel x kernel windows.
struct Window {
  int height, width, channels;
  int kernel, stride, padding;
  int out_height, out_width;
};

// Whether this build's kernels can run on the current device: cudaSuccess,
// or the error (e.g. cudaErrorNoKernelImageForDevice) that launches would
// meet. `sm_count` below is the device's multiprocessor count; it sizes grids.
cudaError_t CheckKernelsLoad();

cudaError_t AddBias(cudaStream_t stream, int sm_count, int rows, int cols,
                    const float* bias, float* y);
cudaError_t Relu(cudaStream_t stream, int sm_count, size_t n, float* y);
cudaError_t ReluBackward(cudaStream_t stream, int sm_count, size_t n,
                         const float* y, float* dy);
cudaError_t ColumnSums(cudaStream_t stream, int rows, int cols, const float* x,
                       float* sums);
// One block: rows are spread over its warps, and the block adds its totals to
// stats in a fixed order, so the result does not depend on timing.
cudaError_t SoftmaxCrossEntropy(cudaStream_t stream, int rows, int cols,
                                const float* logits, const int32_t* labels,
                                float* dlogits, float* stats);
cudaError_t Axpy(cudaStream_t stream, int sm_count, size_t n, float alpha,
                 const float* x, float* y);
cudaError_t Scale(cudaStream_t stream, int sm_count, size_t n, float alpha,
                  float* y);
cudaError_t Fill(cudaStream_t stream, int sm_count, size_t n, float value,
                 float* y);
// ComputeBackend's Im2Col, Col2Im, MaxPool and MaxPoolBackward; each
// thread writes one value (the adjoints gather rather than scatter), so the
// results equal the CPU backend's bit for bit.
cudaError_t Im2Col(cudaStream_t stream, int sm_count, const Window& g,
                   int batch, const float* x, float* cols);
cudaError_t Col2Im(cudaStream_t stream, int sm_count, const Window& g,
                   int batch, const float* cols, float* dx);
cudaError_t MaxPool(cudaStream_t stream, int sm_count, const Window& g,
                    int batch, const float* x, float* y, int32_t* argmax);
cudaError_t MaxPoolBackward(cudaStream_t stream, int sm_count, const Window& g,
                            int batch, const float* dy, const int32_t* argmax,
                            float* dx);
// common/onebit.h's layout; bucket_size >= 1.
cudaError_t OneBitEncode(cudaStream_t stream, int sm_count, const float* grad,
                         float* residual, size_t n, int bucket_size,
                         uint8_t* bits, float* scales);
cudaError_t OneBitDecode(cudaStream_t stream, int sm_count, const uint8_t* bits,
                         const float* scales, size_t n, int bucket_size,
                         float* out);

}  // namespace monsoon::worker::cuda

#endif  // MONSOON_WORKER_CUDA_KERNELS_H_
