// Matrix products with one small side, for the CPU backend (cpu_backend.cc).
//
// OpenBLAS's sgemm computes C in tiles of several rows by several columns.
// When C has only a few columns (a convolution's forward pass over few
// filters, whose rows are examples x output positions) or only a few rows
// (the same layer's weight gradient, summed over those rows), most of each
// tile is empty: LeNet's first convolution (6 filters of 25 values over
// 50,176 positions) ran at 0.26-0.33x of a large square sgemm's rate. These
// kernels put the small side in the lanes of one or two AVX2 registers
// instead (one AVX-512 register where the CPU has it), and keep enough
// independent sums in flight to keep both FMA units busy.
//
// Plain functions of their arguments: safe to call from any thread on
// buffers no other thread writes. They need a CPU with AVX2 and FMA
// (SmallGemmSupported()); the backend uses OpenBLAS elsewhere. Sums run in a
// fixed order, so a product is the same bits on every run, but not the same
// bits as OpenBLAS's.
#ifndef MONSOON_WORKER_CPU_SMALL_GEMM_H_
#define MONSOON_WORKER_CPU_SMALL_GEMM_H_

#include <cstddef>

#include "worker/compute_backend.h"

namespace monsoon::worker {

// The small side's largest size: two AVX2 registers of floats.
inline constexpr int kSmallGemmSide = 16;
// Limits of the kernels' stack buffers: GemmFewColumns' k and GemmFewRows'
// n.
inline constexpr int kSmallGemmMaxInner = 512;
inline constexpr int kSmallGemmMaxColumns = 512;

// True where this CPU has AVX2 and FMA, which the kernels below need.
bool SmallGemmSupported();

// Which build of the kernels runs: the widest this CPU has (where it has
// AVX-512F: a small side of 9 to 16 in one AVX-512 register instead of two
// AVX2 ones, and GemmFewRows with m up to 8 two columns to a register), or
// AVX2 alone. Each value of C is the same fused multiply-adds in the same
// order either way, so the same bits (tested).
enum class SmallGemmUnits { kWidest, kAvx2 };
// Whether the widest build here uses AVX-512.
bool SmallGemmHasAvx512();

// C[m x n] = alpha * A * op(B) + beta * C for 1 <= n <= kSmallGemmSide and
// 1 <= k <= kSmallGemmMaxInner: A is m x k, and op(B) is k x n where B is
// stored n x k (trans_b) or k x n. Every matrix is row-major and contiguous.
// C is not read where beta is 0. Each value of C sums over k in order.
void GemmFewColumns(int m, int n, int k, float alpha, const float* a,
                    const float* b, bool trans_b, float beta, float* c,
                    SmallGemmUnits units = SmallGemmUnits::kWidest);

// C[m x n] = alpha * A^T * B + beta * C for 1 <= m <= kSmallGemmSide and
// 1 <= n <= kSmallGemmMaxColumns: A is stored k x m, B is k x n, row-major
// and contiguous, so each value of C is a sum over k rows (in order). C is
// not read where beta is 0.
void GemmFewRows(int m, int n, int k, float alpha, const float* a,
                 const float* b, float beta, float* c,
                 SmallGemmUnits units = SmallGemmUnits::kWidest);

// The patches of a window over single-channel images with stride 1, read
// where they lie instead of from Im2Col's matrix: patch r, for example n,
// output row oy and column ox (r = (n * out_height + oy) * out_width + ox,
// Im2Col's row), has value i = ky * kernel + kx (kernel row ky, column kx)
// at
//   images[n * image_stride + (oy + ky) * row_stride + ox + kx].
// The images are the caller's zero-bordered copies, so that every window
// lies inside one.
struct ImagePatches {
  const float* images = nullptr;
  size_t image_stride = 0;  // values between images
  int row_stride = 0;       // values between rows of an image
  int out_height = 0;
  int out_width = 0;
  int kernel = 0;  // a patch has kernel * kernel values
};

// GemmFewColumns with A the m patches of `a` (k = kernel * kernel values
// each; m a whole number of images' out_height * out_width) and beta 0, then
// bias[j] added to column j of C where bias is not null: the same bits as
// GemmFewColumns on Im2Col's matrix, then the bias added to each row.
void GemmFewColumnsOfPatches(const ImagePatches& a, int m, int n, int k,
                             float alpha, const float* b, bool trans_b,
                             const float* bias, float* c,
                             SmallGemmUnits units = SmallGemmUnits::kWidest);

// GemmFewRows with B the k patches of `b` (n = kernel * kernel values each)
// and beta 0: the same bits as GemmFewRows on Im2Col's matrix. Where
// column_sums is not null it gets the sums of A's m columns, each added row
// by row in order from 0 (the bias's gradient of a convolution), in the
// same pass where it can.
void GemmFewRowsOfPatches(int m, int n, int k, float alpha, const float* a,
                          const ImagePatches& b, float* c,
                          float* column_sums = nullptr,
                          SmallGemmUnits units = SmallGemmUnits::kWidest);

// A convolution's input gradient without Im2Col's matrix of patch
// gradients: dx (batch images of g's input shape, overwritten) gets, for
// each window in order, the row dy[window] (m values) times w (m x
// g.patch()) added where Im2Col would have copied each value from, as
// Col2Im adds. Each value of a window's row is the sum over i of dy[i] *
// w[i][j], fused multiply-adds in order from 0. For m <= kSmallGemmSide and
// g.patch() <= kSmallGemmMaxInner, where SmallGemmHasAvx512().
void Col2ImOfProduct(const WindowGeometry& g, int batch, int m, const float* dy,
                     const float* w, float* dx);

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_CPU_SMALL_GEMM_H_
