// The kernels of cuda_kernels.h. Elementwise kernels are grid-stride loops
// over at most a few blocks per multiprocessor; the reductions are written
// so that their result does not depend on scheduling (no atomics), which
// keeps a run reproducible and comparable with the CPU backend.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "worker/cuda_kernels.h"

namespace monsoon::worker::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kThreads = 256;
// Enough resident blocks to fill the device; grid-stride loops do the rest.
constexpr int kBlocksPerSm = 8;

int ElementwiseBlocks(int sm_count, size_t n) {
  const size_t wanted = (n + kThreads - 1) / kThreads;
  const size_t cap = static_cast<size_t>(std::max(sm_count, 1)) * kBlocksPerSm;
  return static_cast<int>(std::max<size_t>(1, std::min(wanted, cap)));
}

__device__ size_t GlobalThread() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ size_t GlobalStride() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}

__global__ void FillKernel(size_t n, float value, float* y) {
  for (size_t i = GlobalThread(); i < n; i += GlobalStride()) y[i] = value;
}

__global__ void ScaleKernel(size_t n, float alpha, float* y) {
  for (size_t i = GlobalThread(); i < n; i += GlobalStride()) y[i] *= alpha;
}

// Not __restrict__: x == y (y += alpha * y) is a legal call.
__global__ void AxpyKernel(size_t n, float alpha, const float* x, float* y) {
  for (size_t i = GlobalThread(); i < n; i += GlobalStride()) {
    y[i] += alpha * x[i];
  }
}

__global__ void ReluKernel(size_t n, float* y) {
  for (size_t i = GlobalThread(); i < n; i += GlobalStride()) {
    // fmaxf would turn NaN into 0; std::max(y, 0) on the CPU keeps it.
    const float v = y[i];
    y[i] = v < 0.0f ? 0.0f : v;
  }
}

__global__ void ReluBackwardKernel(size_t n, const float* __restrict__ y,
                                   float* __restrict__ dy) {
  for (size_t i = GlobalThread(); i < n; i += GlobalStride()) {
    if (y[i] <= 0.0f) dy[i] = 0.0f;
  }
}

// Threads run along a row (coalesced); blocks in y walk the rows.
__global__ void AddBiasKernel(int rows, int cols,
                              const float* __restrict__ bias,
                              float* __restrict__ y) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const float b = bias[c];
  for (int r = blockIdx.y; r < rows; r += gridDim.y) {
    y[static_cast<size_t>(r) * cols + c] += b;
  }
}

// A block owns 32 columns: its threads in x take one column each
// (coalesced), its threads in y split the rows, and one row of threads adds
// the partial sums in a fixed order. Overwrites `sums`.
constexpr int kSumColumns = 32;
constexpr int kSumRowThreads = 16;
constexpr int kSumThreads = kSumColumns * kSumRowThreads;
__global__ void __launch_bounds__(kSumThreads)
    ColumnSumsKernel(int rows, int cols, const float* __restrict__ x,
                     float* __restrict__ sums) {
  __shared__ float partial[kSumRowThreads][kSumColumns + 1];
  const int c = blockIdx.x * kSumColumns + threadIdx.x;
  float s = 0.0f;
  if (c < cols) {
    for (int r = threadIdx.y; r < rows; r += kSumRowThreads) {
      s += x[static_cast<size_t>(r) * cols + c];
    }
  }
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.0f;
    for (int i = 0; i < kSumRowThreads; ++i) total += partial[i][threadIdx.x];
    sums[c] = total;
  }
}

// Keeps the larger of two (value, index) candidates, the lower index on a
// tie: the CPU's "first maximum" rule. index < 0 is an empty candidate.
__device__ void KeepMax(float& best, int& index, float other_best,
                        int other_index) {
  if (other_index < 0) return;
  if (index < 0 || other_best > best ||
      (other_best == best && other_index < index)) {
    best = other_best;
    index = other_index;
  }
}

// One block; warp w takes rows w, w + warps, ...; each lane a stride of the
// columns. Matches the CPU's arithmetic: exp of the float difference summed
// in double, the loss and the probabilities in double. An out-of-range
// label gives a NaN loss (the CPU backend's behaviour there is undefined).
constexpr int kSoftmaxThreads = 1024;
__global__ void __launch_bounds__(kSoftmaxThreads)
    SoftmaxCrossEntropyKernel(int rows, int cols,
                              const float* __restrict__ logits,
                              const int32_t* __restrict__ labels,
                              float* __restrict__ dlogits,
                              float* __restrict__ stats) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  double warp_loss = 0;
  int warp_correct = 0;
  for (int r = warp; r < rows; r += warps) {
    const float* z = logits + static_cast<size_t>(r) * cols;
    float best = 0.0f;
    int arg_max = -1;
    for (int c = lane; c < cols; c += 32) {
      if (arg_max < 0 || z[c] > best) {
        best = z[c];
        arg_max = c;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other_best = __shfl_down_sync(kFullMask, best, offset);
      const int other_index = __shfl_down_sync(kFullMask, arg_max, offset);
      KeepMax(best, arg_max, other_best, other_index);
    }
    const float max = __shfl_sync(kFullMask, best, 0);
    arg_max = __shfl_sync(kFullMask, arg_max, 0);

    double sum = 0;
    for (int c = lane; c < cols; c += 32) sum += expf(z[c] - max);
    for (int offset = 16; offset > 0; offset /= 2) {
      sum += __shfl_down_sync(kFullMask, sum, offset);
    }
    const double log_sum = log(__shfl_sync(kFullMask, sum, 0));
    const int label = labels[r];
    const bool valid = label >= 0 && label < cols;
    if (dlogits != nullptr) {
      float* d = dlogits + static_cast<size_t>(r) * cols;
      for (int c = lane; c < cols; c += 32) {
        const double p = exp(static_cast<double>(z[c] - max) - log_sum);
        d[c] = static_cast<float>((p - (c == label ? 1.0 : 0.0)) / rows);
      }
    }
    if (lane == 0) {
      warp_loss += valid ? log_sum - static_cast<double>(z[label] - max)
                         : static_cast<double>(NAN);
      if (valid && arg_max == label) ++warp_correct;
    }
  }
  __shared__ double loss[kSoftmaxThreads / 32];
  __shared__ int correct[kSoftmaxThreads / 32];
  if (lane == 0) {
    loss[warp] = warp_loss;
    correct[warp] = warp_correct;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double total_loss = 0;
    long long total_correct = 0;
    for (int w = 0; w < warps; ++w) {
      total_loss += loss[w];
      total_correct += correct[w];
    }
    stats[0] += static_cast<float>(total_loss);
    stats[1] += static_cast<float>(total_correct);
  }
}

__device__ double WarpSum(double v) {
  for (int offset = 16; offset > 0; offset /= 2) {
    v += __shfl_down_sync(kFullMask, v, offset);
  }
  return v;
}
__device__ unsigned WarpSum(unsigned v) {
  for (int offset = 16; offset > 0; offset /= 2) {
    v += __shfl_down_sync(kFullMask, v, offset);
  }
  return v;
}

// One block per bucket (grid-stride over buckets). Pass 1 forms
// v = grad + residual (kept in residual, as the CPU codec does) and sums each
// side in double; thread 0 writes the two means; pass 2 packs 8 values per
// thread into a byte and leaves v minus its reconstruction in residual.
constexpr int kEncodeThreads = 256;
__global__ void __launch_bounds__(kEncodeThreads)
    OneBitEncodeKernel(const float* __restrict__ grad,
                       float* __restrict__ residual, size_t n, int bucket_size,
                       size_t buckets, uint8_t* __restrict__ bits,
                       float* __restrict__ scales) {
  __shared__ double side_sums[2][kEncodeThreads / 32];
  __shared__ unsigned side_counts[2][kEncodeThreads / 32];
  __shared__ float bucket_scales[2];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const size_t bucket_bytes = (static_cast<size_t>(bucket_size) + 7) / 8;
  for (size_t b = blockIdx.x; b < buckets; b += gridDim.x) {
    const size_t begin = b * bucket_size;
    const size_t len = min(static_cast<size_t>(bucket_size), n - begin);
    // Named per side rather than indexed, to stay in registers.
    double negative_sum = 0, non_negative_sum = 0;
    unsigned negative_count = 0, non_negative_count = 0;
    for (size_t i = threadIdx.x; i < len; i += blockDim.x) {
      const float v = grad[begin + i] + residual[begin + i];
      residual[begin + i] = v;
      if (v >= 0.0f) {
        non_negative_sum += v;
        ++non_negative_count;
      } else {
        negative_sum += v;
        ++negative_count;
      }
    }
    negative_sum = WarpSum(negative_sum);
    non_negative_sum = WarpSum(non_negative_sum);
    negative_count = WarpSum(negative_count);
    non_negative_count = WarpSum(non_negative_count);
    if (lane == 0) {
      side_sums[0][warp] = negative_sum;
      side_sums[1][warp] = non_negative_sum;
      side_counts[0][warp] = negative_count;
      side_counts[1][warp] = non_negative_count;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int side = 0; side < 2; ++side) {
        double s = 0;
        unsigned long long c = 0;
        for (int w = 0; w < kEncodeThreads / 32; ++w) {
          s += side_sums[side][w];
          c += side_counts[side][w];
        }
        const float scale = c > 0 ? static_cast<float>(s / c) : 0.0f;
        bucket_scales[side] = scale;
        scales[2 * b + side] = scale;
      }
    }
    // Also makes pass 1's residual writes visible to every thread.
    __syncthreads();
    const float negative_scale = bucket_scales[0];
    const float non_negative_scale = bucket_scales[1];
    uint8_t* out = bits + b * bucket_bytes;
    const size_t bytes = (len + 7) / 8;
    for (size_t j = threadIdx.x; j < bytes; j += blockDim.x) {
      unsigned byte = 0;
      const size_t end = min(len, j * 8 + 8);
      for (size_t i = j * 8; i < end; ++i) {
        const float v = residual[begin + i];
        const bool non_negative = v >= 0.0f;
        byte |= static_cast<unsigned>(non_negative) << (i % 8);
        residual[begin + i] =
            v - (non_negative ? non_negative_scale : negative_scale);
      }
      out[j] = static_cast<uint8_t>(byte);
    }
    // The next bucket reuses the shared arrays.
    __syncthreads();
  }
}

__global__ void OneBitDecodeKernel(const uint8_t* __restrict__ bits,
                                   const float* __restrict__ scales, size_t n,
                                   int bucket_size, float* __restrict__ out) {
  const size_t bucket_bytes = (static_cast<size_t>(bucket_size) + 7) / 8;
  for (size_t i = GlobalThread(); i < n; i += GlobalStride()) {
    const size_t b = i / bucket_size;
    const size_t k = i - b * bucket_size;
    const unsigned bit = (bits[b * bucket_bytes + k / 8] >> (k % 8)) & 1u;
    out[i] = scales[2 * b + bit];
  }
}

// Convolution and pooling windows, channels last (cuda_kernels.h's Window).
// Each thread writes one value, so nothing races and no atomics are
// needed; the adjoints gather (each input value sums the windows over it,
// in the order of the output positions), which adds in the CPU backend's
// order and so matches it bit for bit.
__global__ void Im2ColKernel(Window g, int batch, const float* __restrict__ x,
                             float* __restrict__ cols) {
  const size_t patch = static_cast<size_t>(g.kernel) * g.kernel * g.channels;
  const size_t n_values =
      static_cast<size_t>(batch) * g.out_height * g.out_width * patch;
  for (size_t i = GlobalThread(); i < n_values; i += GlobalStride()) {
    const size_t row = i / patch;
    const int k = static_cast<int>(i % patch);
    const int c = k % g.channels;
    const int kx = (k / g.channels) % g.kernel;
    const int ky = k / (g.channels * g.kernel);
    const int ox = static_cast<int>(row % g.out_width);
    const int oy = static_cast<int>((row / g.out_width) % g.out_height);
    const size_t n = row / (static_cast<size_t>(g.out_width) * g.out_height);
    const int iy = oy * g.stride - g.padding + ky;
    const int ix = ox * g.stride - g.padding + kx;
    float v = 0.0f;
    if (iy >= 0 && iy < g.height && ix >= 0 && ix < g.width) {
      v = x[((n * g.height + iy) * g.width + ix) * g.channels + c];
    }
    cols[i] = v;
  }
}

// The output positions whose windows cover input row (or column) i:
// [*first, *last], empty when first > last.
__device__ void Covering(int i, int padding, int kernel, int stride, int outs,
                         int* first, int* last) {
  const int low = i + padding - kernel + 1;
  *first = low <= 0 ? 0 : (low + stride - 1) / stride;
  *last = min(outs - 1, (i + padding) / stride);
}

__global__ void Col2ImKernel(Window g, int batch,
                             const float* __restrict__ cols,
                             float* __restrict__ dx) {
  const size_t patch = static_cast<size_t>(g.kernel) * g.kernel * g.channels;
  const size_t n_values =
      static_cast<size_t>(batch) * g.height * g.width * g.channels;
  for (size_t i = GlobalThread(); i < n_values; i += GlobalStride()) {
    const int c = static_cast<int>(i % g.channels);
    const int ix = static_cast<int>((i / g.channels) % g.width);
    const int iy = static_cast<int>((i / g.channels / g.width) % g.height);
    const size_t n = i / (static_cast<size_t>(g.channels) * g.width * g.height);
    int oy0, oy1, ox0, ox1;
    Covering(iy, g.padding, g.kernel, g.stride, g.out_height, &oy0, &oy1);
    Covering(ix, g.padding, g.kernel, g.stride, g.out_width, &ox0, &ox1);
    float sum = 0.0f;
    for (int oy = oy0; oy <= oy1; ++oy) {
      const int ky = iy + g.padding - oy * g.stride;
      for (int ox = ox0; ox <= ox1; ++ox) {
        const int kx = ix + g.padding - ox * g.stride;
        const size_t row = (n * g.out_height + oy) * g.out_width + ox;
        sum += cols[row * patch +
                    (static_cast<size_t>(ky) * g.kernel + kx) * g.channels + c];
      }
    }
    dx[i] = sum;
  }
}

__global__ void MaxPoolKernel(Window g, int batch, const float* __restrict__ x,
                              float* __restrict__ y,
                              int32_t* __restrict__ argmax) {
  const size_t n_values =
      static_cast<size_t>(batch) * g.out_height * g.out_width * g.channels;
  for (size_t o = GlobalThread(); o < n_values; o += GlobalStride()) {
    const int c = static_cast<int>(o % g.channels);
    const int ox = static_cast<int>((o / g.channels) % g.out_width);
    const int oy =
        static_cast<int>((o / g.channels / g.out_width) % g.out_height);
    const size_t n =
        o / (static_cast<size_t>(g.channels) * g.out_width * g.out_height);
    const size_t corner =
        ((n * g.height + static_cast<size_t>(oy) * g.stride) * g.width +
         static_cast<size_t>(ox) * g.stride) *
            g.channels +
        c;
    size_t best = corner;
    for (int ky = 0; ky < g.kernel; ++ky) {
      for (int kx = 0; kx < g.kernel; ++kx) {
        const size_t i =
            corner + (static_cast<size_t>(ky) * g.width + kx) * g.channels;
        if (x[i] > x[best]) best = i;
      }
    }
    y[o] = x[best];
    argmax[o] = static_cast<int32_t>(best);
  }
}

__global__ void MaxPoolBackwardKernel(Window g, int batch,
                                      const float* __restrict__ dy,
                                      const int32_t* __restrict__ argmax,
                                      float* __restrict__ dx) {
  const size_t n_values =
      static_cast<size_t>(batch) * g.height * g.width * g.channels;
  for (size_t i = GlobalThread(); i < n_values; i += GlobalStride()) {
    const int c = static_cast<int>(i % g.channels);
    const int ix = static_cast<int>((i / g.channels) % g.width);
    const int iy = static_cast<int>((i / g.channels / g.width) % g.height);
    const size_t n = i / (static_cast<size_t>(g.channels) * g.width * g.height);
    int oy0, oy1, ox0, ox1;
    Covering(iy, 0, g.kernel, g.stride, g.out_height, &oy0, &oy1);
    Covering(ix, 0, g.kernel, g.stride, g.out_width, &ox0, &ox1);
    float sum = 0.0f;
    for (int oy = oy0; oy <= oy1; ++oy) {
      for (int ox = ox0; ox <= ox1; ++ox) {
        const size_t o =
            ((n * g.out_height + oy) * g.out_width + ox) * g.channels + c;
        if (argmax[o] == static_cast<int32_t>(i)) sum += dy[o];
      }
    }
    dx[i] = sum;
  }
}

}  // namespace

cudaError_t CheckKernelsLoad() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, FillKernel);
}

cudaError_t AddBias(cudaStream_t stream, int sm_count, int rows, int cols,
                    const float* bias, float* y) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const dim3 grid((cols + kThreads - 1) / kThreads,
                  std::min(rows, std::max(sm_count, 1) * kBlocksPerSm));
  AddBiasKernel<<<grid, kThreads, 0, stream>>>(rows, cols, bias, y);
  return cudaGetLastError();
}

cudaError_t Relu(cudaStream_t stream, int sm_count, size_t n, float* y) {
  if (n == 0) return cudaSuccess;
  ReluKernel<<<ElementwiseBlocks(sm_count, n), kThreads, 0, stream>>>(n, y);
  return cudaGetLastError();
}

cudaError_t ReluBackward(cudaStream_t stream, int sm_count, size_t n,
                         const float* y, float* dy) {
  if (n == 0) return cudaSuccess;
  ReluBackwardKernel<<<ElementwiseBlocks(sm_count, n), kThreads, 0, stream>>>(
      n, y, dy);
  return cudaGetLastError();
}

cudaError_t ColumnSums(cudaStream_t stream, int rows, int cols, const float* x,
                       float* sums) {
  if (cols <= 0) return cudaSuccess;
  const dim3 block(kSumColumns, kSumRowThreads);
  const dim3 grid((cols + kSumColumns - 1) / kSumColumns);
  ColumnSumsKernel<<<grid, block, 0, stream>>>(std::max(rows, 0), cols, x,
                                               sums);
  return cudaGetLastError();
}

cudaError_t SoftmaxCrossEntropy(cudaStream_t stream, int rows, int cols,
                                const float* logits, const int32_t* labels,
                                float* dlogits, float* stats) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  SoftmaxCrossEntropyKernel<<<1, kSoftmaxThreads, 0, stream>>>(
      rows, cols, logits, labels, dlogits, stats);
  return cudaGetLastError();
}

cudaError_t Axpy(cudaStream_t stream, int sm_count, size_t n, float alpha,
                 const float* x, float* y) {
  if (n == 0) return cudaSuccess;
  AxpyKernel<<<ElementwiseBlocks(sm_count, n), kThreads, 0, stream>>>(n, alpha,
                                                                      x, y);
  return cudaGetLastError();
}

cudaError_t Scale(cudaStream_t stream, int sm_count, size_t n, float alpha,
                  float* y) {
  if (n == 0) return cudaSuccess;
  ScaleKernel<<<ElementwiseBlocks(sm_count, n), kThreads, 0, stream>>>(n, alpha,
                                                                       y);
  return cudaGetLastError();
}

cudaError_t Fill(cudaStream_t stream, int sm_count, size_t n, float value,
                 float* y) {
  if (n == 0) return cudaSuccess;
  FillKernel<<<ElementwiseBlocks(sm_count, n), kThreads, 0, stream>>>(n, value,
                                                                      y);
  return cudaGetLastError();
}

cudaError_t OneBitEncode(cudaStream_t stream, int sm_count, const float* grad,
                         float* residual, size_t n, int bucket_size,
                         uint8_t* bits, float* scales) {
  if (n == 0) return cudaSuccess;
  const size_t buckets = (n + bucket_size - 1) / bucket_size;
  const size_t cap = static_cast<size_t>(std::max(sm_count, 1)) * 32;
  const int grid = static_cast<int>(std::min(buckets, cap));
  OneBitEncodeKernel<<<grid, kEncodeThreads, 0, stream>>>(
      grad, residual, n, bucket_size, buckets, bits, scales);
  return cudaGetLastError();
}

cudaError_t OneBitDecode(cudaStream_t stream, int sm_count, const uint8_t* bits,
                         const float* scales, size_t n, int bucket_size,
                         float* out) {
  if (n == 0) return cudaSuccess;
  OneBitDecodeKernel<<<ElementwiseBlocks(sm_count, n), kThreads, 0, stream>>>(
      bits, scales, n, bucket_size, out);
  return cudaGetLastError();
}

cudaError_t Im2Col(cudaStream_t stream, int sm_count, const Window& g,
                   int batch, const float* x, float* cols) {
  const size_t n = static_cast<size_t>(batch) * g.out_height * g.out_width *
                   g.kernel * g.kernel * g.channels;
  if (n == 0) return cudaSuccess;
  Im2ColKernel<<<ElementwiseBlocks(sm_count, n), kThreads, 0, stream>>>(
      g, batch, x, cols);
  return cudaGetLastError();
}

cudaError_t Col2Im(cudaStream_t stream, int sm_count, const Window& g,
                   int batch, const float* cols, float* dx) {
  const size_t n = static_cast<size_t>(batch) * g.height * g.width * g.channels;
  if (n == 0) return cudaSuccess;
  Col2ImKernel<<<ElementwiseBlocks(sm_count, n), kThreads, 0, stream>>>(
      g, batch, cols, dx);
  return cudaGetLastError();
}

cudaError_t MaxPool(cudaStream_t stream, int sm_count, const Window& g,
                    int batch, const float* x, float* y, int32_t* argmax) {
  const size_t n =
      static_cast<size_t>(batch) * g.out_height * g.out_width * g.channels;
  if (n == 0) return cudaSuccess;
  MaxPoolKernel<<<ElementwiseBlocks(sm_count, n), kThreads, 0, stream>>>(
      g, batch, x, y, argmax);
  return cudaGetLastError();
}

cudaError_t MaxPoolBackward(cudaStream_t stream, int sm_count, const Window& g,
                            int batch, const float* dy, const int32_t* argmax,
                            float* dx) {
  const size_t n = static_cast<size_t>(batch) * g.height * g.width * g.channels;
  if (n == 0) return cudaSuccess;
  MaxPoolBackwardKernel<<<ElementwiseBlocks(sm_count, n), kThreads, 0,
                          stream>>>(g, batch, dy, argmax, dx);
  return cudaGetLastError();
}

}  // namespace monsoon::worker::cuda
