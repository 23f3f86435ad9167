#include "worker/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/onebit.h"
#include "worker/cpu_small_gemm.h"

namespace monsoon::worker {
namespace {

class CpuBackend : public ComputeBackend {
 public:
  CpuBackend(int threads, bool small_gemm) {
    if (threads > 0) openblas_set_num_threads(threads);
    threads_ = openblas_get_num_threads();
    // The kernels run on the calling thread: with more threads OpenBLAS
    // spreads even these products over the cores.
    small_gemm_ = small_gemm && threads_ == 1 && SmallGemmSupported();
#if defined(__x86_64__)
    avx2_ = __builtin_cpu_supports("avx2") != 0;
#endif
  }

  std::string Name() const override {
    return absl::StrCat(
        "cpu (OpenBLAS, ", threads_, " thread", threads_ == 1 ? "" : "s",
        small_gemm_ ? "; AVX2 for products with a side of 16 or less" : "",
        small_gemm_ && SmallGemmHasAvx512() ? ", AVX-512 where it pays" : "",
        ")");
  }

  bool HostMemory() const override { return true; }

  absl::StatusOr<float*> AllocateFloats(size_t n) override {
    void* memory = Allocate(n * sizeof(float));
    if (memory == nullptr) return OutOfMemory(n * sizeof(float));
    return static_cast<float*>(memory);
  }
  absl::StatusOr<int32_t*> AllocateInts(size_t n) override {
    void* memory = Allocate(n * sizeof(int32_t));
    if (memory == nullptr) return OutOfMemory(n * sizeof(int32_t));
    return static_cast<int32_t*>(memory);
  }
  void Free(void* device) override { std::free(device); }

  absl::Status CopyToDevice(const void* host, void* device,
                            size_t bytes) override {
    std::memcpy(device, host, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(const void* device, void* host,
                          size_t bytes) override {
    std::memcpy(host, device, bytes);
    return absl::OkStatus();
  }

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
            const float* a, const float* b, float beta, float* c) override {
    // A convolution over at most 16 filters: its forward product has few
    // columns, its weight gradient few rows, and both run over all of the
    // batch's output positions (cpu_small_gemm.h). Products over fewer
    // rows, the MLP's among them (a batch of 64), stay with OpenBLAS.
    if (small_gemm_ && !trans_a && n <= kSmallGemmSide &&
        m >= kSmallGemmMinRows && k <= kSmallGemmMaxInner) {
      GemmFewColumns(m, n, k, alpha, a, b, trans_b, beta, c);
      return;
    }
    if (small_gemm_ && trans_a && !trans_b && m <= kSmallGemmSide &&
        k >= kSmallGemmMinRows && n <= kSmallGemmMaxColumns) {
      GemmFewRows(m, n, k, alpha, a, b, beta, c);
      return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
                trans_a ? m : k, b, trans_b ? k : n, beta, c, n);
  }

  // The element-wise loops below are written to vectorize (-O3, BUILD):
  // selects rather than branches, arrays that do not overlap.
  void AddBias(int rows, int cols, const float* bias, float* y) override {
    const float* __restrict b = bias;
    for (int r = 0; r < rows; ++r) {
      float* __restrict row = y + static_cast<size_t>(r) * cols;
      for (int c = 0; c < cols; ++c) row[c] += b[c];
    }
  }

  void Relu(size_t n, float* y) override {
    // std::max(y, 0): y unless y < 0 (so NaN and -0 stay as they are).
    for (size_t i = 0; i < n; ++i) y[i] = y[i] < 0.0f ? 0.0f : y[i];
  }

  void ReluBackward(size_t n, const float* y, float* dy) override {
    const float* __restrict out = y;
    float* __restrict grad = dy;
    for (size_t i = 0; i < n; ++i) grad[i] = out[i] <= 0 ? 0.0f : grad[i];
  }

  void ColumnSums(int rows, int cols, const float* x, float* sums) override {
    float* __restrict s = sums;
    std::fill(s, s + cols, 0.0f);
    for (int r = 0; r < rows; ++r) {
      const float* __restrict row = x + static_cast<size_t>(r) * cols;
      for (int c = 0; c < cols; ++c) s[c] += row[c];
    }
  }

  void SoftmaxCrossEntropy(int rows, int cols, const float* logits,
                           const int32_t* labels, float* dlogits,
                           float* stats) override {
    double loss = 0;
    int correct = 0;
    for (int r = 0; r < rows; ++r) {
      const float* z = logits + static_cast<size_t>(r) * cols;
      int arg_max = 0;
      for (int c = 1; c < cols; ++c) {
        if (z[c] > z[arg_max]) arg_max = c;
      }
      const float max = z[arg_max];
      double sum = 0;
      for (int c = 0; c < cols; ++c) sum += std::exp(z[c] - max);
      const double log_sum = std::log(sum);
      const int label = labels[r];
      loss += log_sum - (z[label] - max);
      if (arg_max == label) ++correct;
      if (dlogits != nullptr) {
        float* d = dlogits + static_cast<size_t>(r) * cols;
        for (int c = 0; c < cols; ++c) {
          const double p = std::exp(z[c] - max - log_sum);
          d[c] = static_cast<float>((p - (c == label ? 1.0 : 0.0)) / rows);
        }
      }
    }
    stats[0] += static_cast<float>(loss);
    stats[1] += static_cast<float>(correct);
  }

  // Im2Col copies each image into a zero-bordered copy first (where the
  // window has padding), so that every kernel row of every patch is one
  // run of kernel * channels values with nothing to check: a first layer's
  // runs are a few values each (LeNet's 5), which a library memcpy per run,
  // with the bounds worked out per run, spent 5 times as long copying.
  void Im2Col(const WindowGeometry& g, int batch, const float* x,
              float* cols) override {
    const int span = g.kernel * g.channels;
    const size_t row_values = static_cast<size_t>(g.width) * g.channels;
    const size_t image_values = row_values * g.height;
    const size_t padded_row =
        static_cast<size_t>(g.width + 2 * g.padding) * g.channels;
    const size_t padded_values = padded_row * (g.height + 2 * g.padding);
    if (g.padding > 0 && padded_.size() < padded_values) {
      padded_.resize(padded_values);
    }
    float* out = cols;
    for (int n = 0; n < batch; ++n) {
      const float* image = x + n * image_values;
      const float* source = image;
      size_t source_row = row_values;
      if (g.padding > 0) {
        std::fill(padded_.begin(), padded_.begin() + padded_values, 0.0f);
        for (int y = 0; y < g.height; ++y) {
          std::memcpy(padded_.data() + (y + g.padding) * padded_row +
                          static_cast<size_t>(g.padding) * g.channels,
                      image + y * row_values, sizeof(float) * row_values);
        }
        source = padded_.data();
        source_row = padded_row;
      }
      for (int oy = 0; oy < g.out_height; ++oy) {
        for (int ox = 0; ox < g.out_width; ++ox) {
          const float* corner =
              source + static_cast<size_t>(oy) * g.stride * source_row +
              static_cast<size_t>(ox) * g.stride * g.channels;
          for (int ky = 0; ky < g.kernel; ++ky, out += span) {
            CopyRun(corner + ky * source_row, span, out);
          }
        }
      }
    }
  }

  // Col2Im walks the output positions in order; for each kernel row the
  // window's columns that fall inside the image are one run of contiguous
  // values (channels last), added at once.
  void Col2Im(const WindowGeometry& g, int batch, const float* cols,
              float* dx) override {
    const size_t row_values = static_cast<size_t>(g.width) * g.channels;
    const size_t image_values = row_values * g.height;
    std::fill(dx, dx + batch * image_values, 0.0f);
    const float* in = cols;
    for (int n = 0; n < batch; ++n) {
      float* image = dx + n * image_values;
      for (int oy = 0; oy < g.out_height; ++oy) {
        for (int ox = 0; ox < g.out_width; ++ox) {
          ForEachWindowRun(
              g, oy, ox, [&](int ky, int iy, int first, int last, int x) {
                const float* __restrict from =
                    in +
                    (static_cast<size_t>(ky) * g.kernel + first) * g.channels;
                float* __restrict to = image + iy * row_values +
                                       static_cast<size_t>(x) * g.channels;
                const int count = (last - first) * g.channels;
                for (int i = 0; i < count; ++i) to[i] += from[i];
              });
          in += g.patch();
        }
      }
    }
  }

  // A first layer over single-channel images: the small-side kernels read
  // each patch where it lies in a zero-bordered copy of its image, kept in
  // the scratch from the forward pass to the backward one, instead of from
  // Im2Col's matrix (LeNet's first convolution: 25 values for each of
  // 50,176 positions, 5 MB a batch written and read twice), with the bias
  // added as the output is stored. The same bits as Im2Col and the
  // small-side products on its matrix, then AddBias.
  size_t DirectConvScratch(const WindowGeometry& g, int filters,
                           int batch) override {
    if (!small_gemm_ || g.channels != 1 || g.stride != 1 ||
        filters > kSmallGemmSide || g.patch() > kSmallGemmMaxInner ||
        g.out_height != g.height + 2 * g.padding - g.kernel + 1 ||
        g.out_width != g.width + 2 * g.padding - g.kernel + 1) {
      return 0;
    }
    return PaddedImageValues(g) * batch;
  }

  void DirectConvForward(const WindowGeometry& g, int batch, int filters,
                         const float* x, const float* w, const float* bias,
                         float* y, float* scratch) override {
    const size_t image_values = static_cast<size_t>(g.height) * g.width;
    const size_t padded_values = PaddedImageValues(g);
    const int row_stride = g.width + 2 * g.padding;
    std::fill(scratch, scratch + padded_values * batch, 0.0f);
    for (int n = 0; n < batch; ++n) {
      for (int iy = 0; iy < g.height; ++iy) {
        std::memcpy(scratch + n * padded_values +
                        static_cast<size_t>(iy + g.padding) * row_stride +
                        g.padding,
                    x + n * image_values + static_cast<size_t>(iy) * g.width,
                    sizeof(float) * g.width);
      }
    }
    GemmFewColumnsOfPatches(PatchesOf(g, scratch),
                            batch * g.out_height * g.out_width, filters,
                            g.patch(), 1.0f, w, /*trans_b=*/true, bias, y);
  }

  void DirectConvBackward(const WindowGeometry& g, int batch, int filters,
                          const float* dy, float* dw, float* db,
                          float* scratch) override {
    GemmFewRowsOfPatches(filters, g.patch(), batch * g.out_height * g.out_width,
                         1.0f, dy, PatchesOf(g, scratch), dw,
                         /*column_sums=*/db);
  }

  // Each window's row of patch gradients (LeNet's second convolution: 150
  // values from 16 filters) is made in registers and added onto the input
  // at once, instead of a matrix of them (3.8 MB a batch there) from
  // OpenBLAS, which a product with an inner side of 16 keeps far from its
  // rate, read back by Col2Im.
  bool ConvInputGradient(const WindowGeometry& g, int batch, int filters,
                         const float* dy, const float* w, float* dx) override {
    if (!small_gemm_ || !SmallGemmHasAvx512() || filters > kSmallGemmSide ||
        g.patch() > kSmallGemmMaxInner) {
      return false;
    }
    Col2ImOfProduct(g, batch, filters, dy, w, dx);
    return true;
  }

  // A window's largest value and where it is, per channel: the first
  // largest in the window's order, as a scan would find it. Channels go 4
  // at a time in vector registers, by selects (a scalar compare per value
  // compiles to a branch, mispredicted on data: LeNet's two pools took 182
  // and 60 us at batch 64 that way); a count of channels that 4 does not
  // divide ends with a group that overlaps the one before (the same values
  // computed twice). Fewer than 4 channels go one at a time.
  void MaxPool(const WindowGeometry& g, int batch, const float* x, float* y,
               int32_t* argmax) override {
    const size_t row_values = static_cast<size_t>(g.width) * g.channels;
    const size_t image_values = row_values * g.height;
    const int channels = g.channels;
    const size_t inputs = image_values * batch;
    const size_t outputs =
        static_cast<size_t>(batch) * g.out_height * g.out_width * channels;
    // The window's last value read, from its corner.
    const size_t window_span = (g.kernel - 1) * row_values +
                               static_cast<size_t>(g.kernel - 1) * channels;
    size_t o = 0;
    for (int n = 0; n < batch; ++n) {
      const size_t image = n * image_values;
      for (int oy = 0; oy < g.out_height; ++oy) {
        for (int ox = 0; ox < g.out_width; ++ox, o += channels) {
          const size_t corner = image + oy * g.stride * row_values +
                                static_cast<size_t>(ox) * g.stride * channels;
#if defined(__x86_64__)
          // Eight channels at a time where the CPU has AVX2: 4 to 7
          // channels (LeNet's 6) take one group whose last lanes read the
          // next position's values and write the next output's, which its
          // own group overwrites after, wherever both stay inside x and y.
          if (avx2_ && channels >= 4 &&
              (channels >= 8 ||
               (o + 8 <= outputs && corner + window_span + 8 <= inputs))) {
            for (int c = 0; c < channels; c += 8) {
              const int group = channels >= 8 ? std::min(c, channels - 8) : 0;
              MaxOfEightChannels(g, x, corner + group, row_values,
                                 y + o + group, argmax + o + group);
            }
            continue;
          }
#endif
          if (channels < 4) {
            for (int c = 0; c < channels; ++c) {
              MaxOfOneChannel(g, x, corner + c, row_values, y + o + c,
                              argmax + o + c);
            }
            continue;
          }
          for (int c = 0; c < channels; c += 4) {
            const int group = std::min(c, channels - 4);
            MaxOfFourChannels(g, x, corner + group, row_values, y + o + group,
                              argmax + o + group);
          }
        }
      }
    }
  }

  // MaxPool's window at `corner`, for four channels from it.
  static void MaxOfFourChannels(const WindowGeometry& g, const float* x,
                                size_t corner, size_t row_values, float* y,
                                int32_t* argmax) {
    using Floats = float __attribute__((vector_size(16)));
    using Ints = int32_t __attribute__((vector_size(16)));
    const Ints lane = {0, 1, 2, 3};
    Floats best;
    std::memcpy(&best, x + corner, sizeof(best));
    Ints at = static_cast<int32_t>(corner) + lane;
    for (int ky = 0; ky < g.kernel; ++ky) {
      for (int kx = ky == 0 ? 1 : 0; kx < g.kernel; ++kx) {
        const size_t from = corner + ky * row_values +
                            static_cast<size_t>(kx) * g.channels;
        Floats v;
        std::memcpy(&v, x + from, sizeof(v));
        const Ints larger = v > best;
        best = larger ? v : best;
        at = larger ? static_cast<int32_t>(from) + lane : at;
      }
    }
    std::memcpy(y, &best, sizeof(best));
    std::memcpy(argmax, &at, sizeof(at));
  }

#if defined(__x86_64__)
  // MaxOfFourChannels with eight, compiled for AVX2 (called only where the
  // CPU has it). The body is MaxOfFourChannels' own rather than a shared
  // template's: GCC splits a template's 8-lane vectors into 4-lane halves
  // where it compiles it outside this target, before inlining it here
  // (LeNet's first pool took 57 us that way against 50).
  __attribute__((target("avx2"))) static void MaxOfEightChannels(
      const WindowGeometry& g, const float* x, size_t corner, size_t row_values,
      float* y, int32_t* argmax) {
    using Floats = float __attribute__((vector_size(32)));
    using Ints = int32_t __attribute__((vector_size(32)));
    const Ints lane = {0, 1, 2, 3, 4, 5, 6, 7};
    Floats best;
    std::memcpy(&best, x + corner, sizeof(best));
    Ints at = static_cast<int32_t>(corner) + lane;
    for (int ky = 0; ky < g.kernel; ++ky) {
      for (int kx = ky == 0 ? 1 : 0; kx < g.kernel; ++kx) {
        const size_t from =
            corner + ky * row_values + static_cast<size_t>(kx) * g.channels;
        Floats v;
        std::memcpy(&v, x + from, sizeof(v));
        const Ints larger = v > best;
        best = larger ? v : best;
        at = larger ? static_cast<int32_t>(from) + lane : at;
      }
    }
    std::memcpy(y, &best, sizeof(best));
    std::memcpy(argmax, &at, sizeof(at));
  }
#endif

  // ...and for one channel.
  static void MaxOfOneChannel(const WindowGeometry& g, const float* x,
                              size_t corner, size_t row_values, float* y,
                              int32_t* argmax) {
    size_t at = corner;
    for (int ky = 0; ky < g.kernel; ++ky) {
      for (int kx = 0; kx < g.kernel; ++kx) {
        const size_t i = corner + ky * row_values +
                         static_cast<size_t>(kx) * g.channels;
        if (x[i] > x[at]) at = i;
      }
    }
    *y = x[at];
    *argmax = static_cast<int32_t>(at);
  }

  void MaxPoolBackward(const WindowGeometry& g, int batch, const float* dy,
                       const int32_t* argmax, float* dx) override {
    const size_t inputs =
        static_cast<size_t>(batch) * g.height * g.width * g.channels;
    std::fill(dx, dx + inputs, 0.0f);
    const size_t outputs =
        static_cast<size_t>(batch) * g.out_height * g.out_width * g.channels;
    for (size_t o = 0; o < outputs; ++o) dx[argmax[o]] += dy[o];
  }

  void Axpy(size_t n, float alpha, const float* x, float* y) override {
    cblas_saxpy(static_cast<int>(n), alpha, x, 1, y, 1);
  }

  void Scale(size_t n, float alpha, float* y) override {
    cblas_sscal(static_cast<int>(n), alpha, y, 1);
  }

  void Fill(size_t n, float value, float* y) override {
    std::fill(y, y + n, value);
  }

  absl::Status OneBitEncode(const float* grad, float* residual, size_t n,
                            int bucket_size, uint8_t* bits,
                            float* scales) override {
    if (bucket_size < 1) return BadBucketSize(bucket_size);
    // The codec itself, so that the wire format has one definition.
    common::OneBitEncode(grad, residual, n, bucket_size, bits, scales);
    return absl::OkStatus();
  }

  absl::Status OneBitDecode(const uint8_t* bits, const float* scales, size_t n,
                            int bucket_size, float* out) override {
    if (bucket_size < 1) return BadBucketSize(bucket_size);
    const size_t bucket_bytes = (static_cast<size_t>(bucket_size) + 7) / 8;
    for (size_t begin = 0, b = 0; begin < n; begin += bucket_size, ++b) {
      const size_t end = std::min(n, begin + bucket_size);
      const uint8_t* bucket_bits = bits + b * bucket_bytes;
      for (size_t i = begin; i < end; ++i) {
        const size_t k = i - begin;
        out[i] = scales[2 * b + ((bucket_bits[k / 8] >> (k % 8)) & 1)];
      }
    }
    return absl::OkStatus();
  }

  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  static absl::Status BadBucketSize(int bucket_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("1-bit bucket size must be positive, got ", bucket_size));
  }

  static absl::Status OutOfMemory(size_t bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of host memory"));
  }

  // to[0, n) = from[0, n), for runs that do not overlap: runs of 4 to 16
  // values as two fixed-size copies that overlap in the middle (single
  // vector moves once inlined), longer ones by memcpy.
  static void CopyRun(const float* from, int n, float* to) {
    if (n >= 4 && n <= 8) {
      std::memcpy(to, from, 4 * sizeof(float));
      std::memcpy(to + n - 4, from + n - 4, 4 * sizeof(float));
    } else if (n > 8 && n <= 16) {
      std::memcpy(to, from, 8 * sizeof(float));
      std::memcpy(to + n - 8, from + n - 8, 8 * sizeof(float));
    } else if (n > 16) {
      std::memcpy(to, from, n * sizeof(float));
    } else {
      for (int i = 0; i < n; ++i) to[i] = from[i];
    }
  }

  static size_t PaddedImageValues(const WindowGeometry& g) {
    return static_cast<size_t>(g.height + 2 * g.padding) *
           (g.width + 2 * g.padding);
  }

  static ImagePatches PatchesOf(const WindowGeometry& g, const float* images) {
    ImagePatches p;
    p.images = images;
    p.image_stride = PaddedImageValues(g);
    p.row_stride = g.width + 2 * g.padding;
    p.out_height = g.out_height;
    p.out_width = g.out_width;
    p.kernel = g.kernel;
    return p;
  }

  static void* Allocate(size_t bytes) {
    // Round up: aligned_alloc wants a multiple of the alignment.
    const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
    return std::aligned_alloc(64, rounded);
  }

  int threads_ = 1;
  bool small_gemm_ = false;
  bool avx2_ = false;  // MaxPool's eight channels at a time
  // Im2Col's zero-bordered copy of one image, kept between calls.
  std::vector<float> padded_;
  // The small-side kernels take products over at least this many rows
  // (examples x output positions: LeNet's convolutions have 64 x 784 and
  // 64 x 100).
  static constexpr int kSmallGemmMinRows = 1024;
};

}  // namespace

std::unique_ptr<ComputeBackend> MakeCpuBackend(int threads,
                                               bool small_gemm_kernels) {
  return std::make_unique<CpuBackend>(threads, small_gemm_kernels);
}

}  // namespace monsoon::worker
