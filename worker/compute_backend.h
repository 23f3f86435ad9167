// ComputeBackend: the one interface between training code and hardware. The
// model's layers (worker/model/) are written once against these operations;
// cpu_backend.cc runs them with OpenBLAS, and a CUDA backend runs them on a
// GPU.
//
// Every pointer given to an operation comes from the same backend's
// Allocate* and lives in its device's memory; host memory crosses only
// through CopyToDevice and CopyToHost. Operations may run asynchronously:
// Synchronize() waits for them and reports the first error any of them hit.
// Matrices are row-major and contiguous. A backend is used by one thread at a
// time; several backends (one per worker) may share a device.
//
// Every backend implements the 1-bit codec (common/onebit.h's format), so
// that a gradient is quantized where it lives.
#ifndef MONSOON_WORKER_COMPUTE_BACKEND_H_
#define MONSOON_WORKER_COMPUTE_BACKEND_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace monsoon::worker {

// A sliding window over a batch of images stored channels last (example,
// row, column, channel), for convolutions and pooling: kernel x kernel
// windows every `stride` values, over an input padded with `padding` zeros
// on each side, out_height x out_width of them per example.
struct WindowGeometry {
  int height = 1;
  int width = 1;
  int channels = 1;
  int kernel = 1;
  int stride = 1;
  int padding = 0;
  int out_height = 1;
  int out_width = 1;
  // Values of one patch: kernel * kernel * channels.
  int patch() const { return kernel * kernel * channels; }
};

// Col2Im's walk of one window, at output position (oy, ox): for each kernel
// row ky whose input row iy lies inside the image, the kernel columns
// [first, last) that do, as visit(ky, iy, first, last, x), where x is the
// input column of `first`. Channels last, each is one run of
// (last - first) * g.channels values.
template <typename Visit>
void ForEachWindowRun(const WindowGeometry& g, int oy, int ox, Visit visit) {
  const int x0 = ox * g.stride - g.padding;
  const int first = std::max(0, -x0);
  const int last = std::min(g.kernel, g.width - x0);
  for (int ky = 0; ky < g.kernel && first < last; ++ky) {
    const int iy = oy * g.stride - g.padding + ky;
    if (iy < 0 || iy >= g.height) continue;
    visit(ky, iy, first, last, x0 + first);
  }
}

// Work recorded by ComputeBackend::CaptureWork. Used by one thread at a
// time, and destroyed before its backend.
class CapturedWork {
 public:
  virtual ~CapturedWork() = default;
  // Issues the recorded work again, queued like the operations it recorded
  // (Synchronize waits for it).
  virtual absl::Status Replay() = 0;
};

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

  // "cpu (OpenBLAS, 1 thread)", "cuda:0 (NVIDIA H100 ...)", ...
  virtual std::string Name() const = 0;

  // True where the device's memory is the host's (the CPU backend): its
  // pointers may then be read and written directly, once queued work is
  // done (Synchronize), and copies between host and device can be skipped.
  virtual bool HostMemory() const { return false; }

  // Device memory; RESOURCE_EXHAUSTED when there is not enough.
  virtual absl::StatusOr<float*> AllocateFloats(size_t n) = 0;
  virtual absl::StatusOr<int32_t*> AllocateInts(size_t n) = 0;
  virtual void Free(void* device) = 0;
  // n bytes of device memory, e.g. for 1-bit payloads. The default rounds up
  // to whole int32s from AllocateInts.
  virtual absl::StatusOr<uint8_t*> AllocateBytes(size_t n) {
    absl::StatusOr<int32_t*> ints = AllocateInts((n + 3) / 4);
    if (!ints.ok()) return ints.status();
    return reinterpret_cast<uint8_t*>(*ints);
  }

  virtual absl::Status CopyToDevice(const void* host, void* device,
                                    size_t bytes) = 0;
  // Waits for queued work that writes `device` before copying.
  virtual absl::Status CopyToHost(const void* device, void* host,
                                  size_t bytes) = 0;

  // C[m x n] = alpha * op(A) * op(B) + beta * C, where op(A) is m x k and
  // op(B) is k x n; trans_a means A is stored k x m (likewise B).
  virtual void Gemm(bool trans_a, bool trans_b, int m, int n, int k,
                    float alpha, const float* a, const float* b, float beta,
                    float* c) = 0;
  // y[r][c] += bias[c] for a rows x cols matrix y.
  virtual void AddBias(int rows, int cols, const float* bias, float* y) = 0;
  // y = max(y, 0).
  virtual void Relu(size_t n, float* y) = 0;
  // dy[i] = 0 where y[i] <= 0 (y is the ReLU's output).
  virtual void ReluBackward(size_t n, const float* y, float* dy) = 0;
  // sums[c] = sum over r of x[r][c].
  virtual void ColumnSums(int rows, int cols, const float* x, float* sums) = 0;
  // Row-wise softmax cross-entropy of logits (rows x cols) against labels.
  // stats[0] += summed loss, stats[1] += rows whose arg-max is the label.
  // If dlogits is not null it gets (softmax - onehot(label)) / rows.
  virtual void SoftmaxCrossEntropy(int rows, int cols, const float* logits,
                                   const int32_t* labels, float* dlogits,
                                   float* stats) = 0;
  // Convolution patches (im2col): for each example and output position, in
  // that order, a row of g.patch() values ordered (kernel row, kernel
  // column, channel), 0 where the window lies over the padding. x holds
  // batch images of g.height x g.width x g.channels; cols gets batch *
  // g.out_height * g.out_width rows.
  virtual void Im2Col(const WindowGeometry& g, int batch, const float* x,
                      float* cols) = 0;
  // The adjoint of Im2Col (col2im): dx (overwritten) gets, at each input
  // value, the sum of the patch values Im2Col would have copied from it,
  // added in the order of the output positions.
  virtual void Col2Im(const WindowGeometry& g, int batch, const float* cols,
                      float* dx) = 0;
  // A convolution computed from its input images in place, without
  // Im2Col's patches, where the backend has kernels for the window (the CPU
  // backend: one input channel and stride 1, as a first layer over
  // grayscale images has, up to 16 filters). The floats of scratch that
  // DirectConvForward and DirectConvBackward need for `batch` examples; 0
  // where the backend has no such kernels for g and `filters` (the default):
  // the layer then takes Im2Col and Gemm.
  virtual size_t DirectConvScratch(const WindowGeometry& /*g*/, int /*filters*/,
                                   int /*batch*/) {
    return 0;
  }
  // y (batch x g.out_height x g.out_width x filters) = the patches of x
  // times w^T (filters x g.patch()), plus bias: the values Im2Col, Gemm and
  // AddBias give. `scratch` (DirectConvScratch floats) keeps what
  // DirectConvBackward reads.
  virtual void DirectConvForward(const WindowGeometry& /*g*/, int /*batch*/,
                                 int /*filters*/, const float* /*x*/,
                                 const float* /*w*/, const float* /*bias*/,
                                 float* /*y*/, float* /*scratch*/) {}
  // dw (filters x g.patch()) = dy^T times the patches, and db (filters) the
  // column sums of dy, for the batch of the last DirectConvForward with the
  // same scratch.
  virtual void DirectConvBackward(const WindowGeometry& /*g*/, int /*batch*/,
                                  int /*filters*/, const float* /*dy*/,
                                  float* /*dw*/, float* /*db*/,
                                  float* /*scratch*/) {}
  // dx (overwritten) = Col2Im of dy (rows x filters) times w (filters x
  // g.patch()): a convolution's input gradient, computed without the
  // matrix of patch gradients where the backend has a kernel for it (the
  // CPU backend: up to 16 filters, with AVX-512). False, with dx
  // untouched, where it has none: the layer then takes Gemm and Col2Im.
  virtual bool ConvInputGradient(const WindowGeometry& /*g*/, int /*batch*/,
                                 int /*filters*/, const float* /*dy*/,
                                 const float* /*w*/, float* /*dx*/) {
    return false;
  }
  // Max pooling (g.padding 0): y[example][oy][ox][c] is the largest value
  // of its window in channel c, the first in (row, column) order among
  // equals; argmax gets that value's index in x.
  virtual void MaxPool(const WindowGeometry& g, int batch, const float* x,
                       float* y, int32_t* argmax) = 0;
  // dx (overwritten, batch images of g's input shape) gets each dy value
  // added at its argmax, in the order of the output positions.
  virtual void MaxPoolBackward(const WindowGeometry& g, int batch,
                               const float* dy, const int32_t* argmax,
                               float* dx) = 0;

  // y += alpha * x.
  virtual void Axpy(size_t n, float alpha, const float* x, float* y) = 0;
  // y *= alpha.
  virtual void Scale(size_t n, float alpha, float* y) = 0;
  // y[i] = value.
  virtual void Fill(size_t n, float value, float* y) = 0;

  // 1-bit quantization with error feedback in common/onebit.h's wire
  // layout, on device buffers of n values: v = grad + residual is cut into
  // buckets of bucket_size (the last may be shorter); `bits` gets
  // common::OneBitBitsBytes(n, bucket_size) bytes (bit i % 8 of byte i / 8
  // of its bucket is 1 where v >= 0, each bucket starting on a byte), `scales`
  // gets 2 floats per bucket (mean of the negative values, then of the
  // non-negative ones; 0 for an empty side), and residual becomes v minus its
  // reconstruction. The buffers must not overlap. Queued like the other
  // operations; the result says only what is known at once: INVALID_ARGUMENT
  // for bucket_size < 1.
  virtual absl::Status OneBitEncode(const float* grad, float* residual,
                                    size_t n, int bucket_size, uint8_t* bits,
                                    float* scales) = 0;
  // out[i] = the scale that i's bit selects in its bucket. The payload is
  // trusted: wire input is checked by common::OneBitDecode's rules first.
  virtual absl::Status OneBitDecode(const uint8_t* bits, const float* scales,
                                    size_t n, int bucket_size, float* out) = 0;

  // Waits for all queued work; the first error since the last call.
  virtual absl::Status Synchronize() = 0;

  // Records the device work that `work` issues on this backend (the
  // operations above on device buffers: no copies to or from the host, no
  // Synchronize) without running it, for CapturedWork::Replay to issue
  // again, all of it at once (a CUDA graph: one launch instead of one per
  // operation). Replays read and write the same buffers as the recording.
  // UNIMPLEMENTED where the backend cannot record (the CPU runs each
  // operation as it is called); otherwise the first error of the recording.
  virtual absl::StatusOr<std::unique_ptr<CapturedWork>> CaptureWork(
      const std::function<void()>& work) {
    (void)work;
    return absl::UnimplementedError(Name() + " cannot record work");
  }
};

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_COMPUTE_BACKEND_H_
