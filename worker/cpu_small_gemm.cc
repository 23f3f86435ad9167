#include "worker/cpu_small_gemm.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#define MONSOON_SMALL_GEMM_X86 1
#else
#define MONSOON_SMALL_GEMM_X86 0
#endif

namespace monsoon::worker {
namespace {

constexpr int kLanes = 8;  // floats in an AVX2 register

// C = alpha * sum + beta * C, not reading C where beta is 0 (as BLAS).
inline float Scaled(float alpha, float sum, float beta, float c) {
  return beta == 0.0f ? alpha * sum : alpha * sum + beta * c;
}

}  // namespace

#if MONSOON_SMALL_GEMM_X86
namespace {

// Asked once, at the first product.
bool HaveAvx512() {
  static const bool have = __builtin_cpu_supports("avx512f") != 0;
  return have;
}

// Compiled for AVX2 and FMA whatever the build's flags; called only where
// SmallGemmSupported().
#define MONSOON_AVX2 __attribute__((target("avx2,fma")))
// ...and for AVX-512F, called only where HaveAvx512().
#define MONSOON_AVX512 __attribute__((target("avx512f")))

// The small side takes kRegs registers of 8 lanes (1 or 2); lanes past it
// hold zeros.

// Where a kernel reads the long side's matrix (A's rows in GemmFewColumns,
// B's in GemmFewRows), from the first row of its call on. Row(q) is row q
// from there, At(row, i) its value i, Pair(row, p) values 2p and 2p + 1 as
// the 8 bytes of a double; From(i) the same rows from value i on.
//
// A dense row-major matrix.
struct DenseRows {
  static constexpr bool kPrefetch = true;
  const float* first;
  size_t stride;  // values between rows
  const float* Row(int q) const {
    return first + static_cast<size_t>(q) * stride;
  }
  float At(const float* row, int i) const { return row[i]; }
  double Pair(const float* row, int p) const {
    double pair;
    std::memcpy(&pair, row + 2 * p, sizeof(pair));
    return pair;
  }
  DenseRows From(int i) const { return {first + i, stride}; }
  DenseRows Skip(int q) const { return {Row(q), stride}; }
};

// Patches read where they lie in their images (ImagePatches): the rows of
// one call are one output row's windows, or part of it, one value apart.
struct PatchRows {
  static constexpr bool kPrefetch = false;
  const float* first;  // the first row's window's corner
  const int* offsets;  // of each value from a window's corner
  const float* Row(int q) const { return first + q; }
  float At(const float* row, int i) const { return row[offsets[i]]; }
  double Pair(const float* row, int p) const {
    const float two[2] = {row[offsets[2 * p]], row[offsets[2 * p + 1]]};
    double pair;
    std::memcpy(&pair, two, sizeof(pair));
    return pair;
  }
  PatchRows From(int i) const { return {first, offsets + i}; }
  PatchRows Skip(int q) const { return {first + q, offsets}; }
};

// Each patch value's offset from its window's corner, in Im2Col's order.
void WindowOffsets(const ImagePatches& p, int* offsets) {
  for (int ky = 0; ky < p.kernel; ++ky) {
    for (int kx = 0; kx < p.kernel; ++kx) {
      offsets[ky * p.kernel + kx] = ky * p.row_stride + kx;
    }
  }
}

// Each output row of patches, in order: visit(r, corner), where r is the
// first patch's row in Im2Col's matrix and corner its window's corner.
template <typename Visit>
void ForEachOutputRow(const ImagePatches& p, int batch, Visit visit) {
  for (int n = 0; n < batch; ++n) {
    const float* image = p.images + static_cast<size_t>(n) * p.image_stride;
    for (int oy = 0; oy < p.out_height; ++oy) {
      visit((static_cast<size_t>(n) * p.out_height + oy) * p.out_width,
            image + static_cast<size_t>(oy) * p.row_stride);
    }
  }
}

// GemmFewColumns: row r of C is the sum over i of A[r][i] times row i of
// op(B) (kRegs registers). kRows rows of C are summed at once, so that
// each row of op(B), loaded once, serves kRows broadcasts of A[r][i], and
// kRows * kRegs independent sums hide the FMA's latency: 12 sums, the row
// of op(B) and a broadcast fit AVX2's 16 registers.
template <int kRegs>
constexpr int kRowsInFlight = 12 / kRegs;

// The next call's rows of A ([r + in_flight, r + 2 in_flight), where they
// exist), which a conv layer's product reads from L3 or memory: the
// hardware's prefetcher alone left the kernels waiting.
inline void PrefetchNextRows(const float* rows, int in_flight, int r, int m,
                             int k) {
  if (r + 2 * in_flight > m) return;
  const char* next = reinterpret_cast<const char*>(rows + in_flight * k);
  for (int byte = 0; byte < in_flight * k * 4; byte += 64) {
    _mm_prefetch(next + byte, _MM_HINT_T0);
  }
}

// Rows [r, r + kRows) of C from A's rows there (`a` from row r on);
// b_rows is op(B), a row of kRegs * 8 values per i. Where `bias` is not
// null (kRegs * 8 values, zeros past n), it is added to each row of C after
// the scaling: the same two roundings as scaling, then adding it apart.
template <int kRegs, int kRows, typename Rows>
MONSOON_AVX2 void FewColumnsRows(int m, int r, int n, int k, float alpha,
                                 const Rows& a, const float* b_rows, float beta,
                                 float* c, const float* bias) {
  __m256 acc[kRows][kRegs];
#pragma GCC unroll 16
  for (int q = 0; q < kRows; ++q) {
#pragma GCC unroll 2
    for (int v = 0; v < kRegs; ++v) acc[q][v] = _mm256_setzero_ps();
  }
  if constexpr (Rows::kPrefetch) PrefetchNextRows(a.Row(0), kRows, r, m, k);
  for (int i = 0; i < k; ++i) {
    __m256 b[kRegs];
#pragma GCC unroll 2
    for (int v = 0; v < kRegs; ++v) {
      b[v] = _mm256_load_ps(b_rows + (i * kRegs + v) * kLanes);
    }
#pragma GCC unroll 16
    for (int q = 0; q < kRows; ++q) {
      const __m256 x = _mm256_set1_ps(a.At(a.Row(q), i));
#pragma GCC unroll 2
      for (int v = 0; v < kRegs; ++v) {
        acc[q][v] = _mm256_fmadd_ps(x, b[v], acc[q][v]);
      }
    }
  }
  const __m256 scale = _mm256_set1_ps(alpha);
#pragma GCC unroll 16
  for (int q = 0; q < kRows; ++q) {
    float* out = c + static_cast<size_t>(r + q) * n;
    // Whole registers where C's row fills them, or where C goes on past
    // the register: the lanes past n (zeros) land on the next rows' first
    // values, which their own stores, later, overwrite.
    if (beta == 0.0f &&
        (n == kRegs * kLanes ||
         (kRegs == 1 && static_cast<size_t>(r + q) * n + kLanes <=
                            static_cast<size_t>(m) * n))) {
#pragma GCC unroll 2
      for (int v = 0; v < kRegs; ++v) {
        __m256 y = _mm256_mul_ps(scale, acc[q][v]);
        if (bias != nullptr) {
          y = _mm256_add_ps(y, _mm256_load_ps(bias + v * kLanes));
        }
        _mm256_storeu_ps(out + v * kLanes, y);
      }
      continue;
    }
    alignas(32) float sums[kRegs * kLanes];
#pragma GCC unroll 2
    for (int v = 0; v < kRegs; ++v) {
      _mm256_store_ps(sums + v * kLanes, acc[q][v]);
    }
    for (int j = 0; j < n; ++j) {
      out[j] = Scaled(alpha, sums[j], beta, out[j]);
      if (bias != nullptr) out[j] += bias[j];
    }
  }
}

// The same with the small side (9 to 16) in one AVX-512 register, where the
// CPU has AVX-512: one FMA where AVX2 takes two, and 32 registers hold 24
// rows' sums. Each value of C is the same FMAs in the same order as in
// FewColumnsRows<2, ...>, so the same bits.
constexpr int kWideRows = 24;

template <int kRows, typename Rows>
MONSOON_AVX512 void FewColumnsRowsWide(int m, int r, int n, int k, float alpha,
                                       const Rows& a, const float* b_rows,
                                       float beta, float* c,
                                       const float* bias) {
  __m512 acc[kRows];
#pragma GCC unroll 32
  for (int q = 0; q < kRows; ++q) acc[q] = _mm512_setzero_ps();
  if constexpr (Rows::kPrefetch) PrefetchNextRows(a.Row(0), kRows, r, m, k);
  for (int i = 0; i < k; ++i) {
    const __m512 b = _mm512_load_ps(b_rows + i * 2 * kLanes);
#pragma GCC unroll 32
    for (int q = 0; q < kRows; ++q) {
      acc[q] = _mm512_fmadd_ps(_mm512_set1_ps(a.At(a.Row(q), i)), b, acc[q]);
    }
  }
  const __m512 scale = _mm512_set1_ps(alpha);
#pragma GCC unroll 32
  for (int q = 0; q < kRows; ++q) {
    float* out = c + static_cast<size_t>(r + q) * n;
    if (beta == 0.0f && n == 2 * kLanes) {
      __m512 y = _mm512_mul_ps(scale, acc[q]);
      if (bias != nullptr) y = _mm512_add_ps(y, _mm512_load_ps(bias));
      _mm512_storeu_ps(out, y);
      continue;
    }
    alignas(64) float sums[2 * kLanes];
    _mm512_store_ps(sums, acc[q]);
    for (int j = 0; j < n; ++j) {
      out[j] = Scaled(alpha, sums[j], beta, out[j]);
      if (bias != nullptr) out[j] += bias[j];
    }
  }
}

// Row i of op(B), zero past n: the kernels' b_rows.
template <int kRegs>
void StageB(int n, int k, const float* b, bool trans_b, float* b_rows) {
  for (int i = 0; i < k; ++i) {
    for (int j = 0; j < kRegs * kLanes; ++j) {
      b_rows[i * kRegs * kLanes + j] =
          j >= n ? 0.0f
                 : (trans_b ? b[static_cast<size_t>(j) * k + i]
                            : b[static_cast<size_t>(i) * n + j]);
    }
  }
}

template <int kRegs>
void FewColumns(int m, int n, int k, float alpha, const float* a,
                const float* b, bool trans_b, float beta, float* c, bool wide) {
  alignas(64) float b_rows[kSmallGemmMaxInner * kRegs * kLanes];
  StageB<kRegs>(n, k, b, trans_b, b_rows);
  auto rows = [&](int r) {
    return DenseRows{a + static_cast<size_t>(r) * k, static_cast<size_t>(k)};
  };
  if (kRegs == 2 && wide) {
    int r = 0;
    for (; r + kWideRows <= m; r += kWideRows) {
      FewColumnsRowsWide<kWideRows>(m, r, n, k, alpha, rows(r), b_rows, beta, c,
                                    nullptr);
    }
    for (; r < m; ++r) {
      FewColumnsRowsWide<1>(m, r, n, k, alpha, rows(r), b_rows, beta, c,
                            nullptr);
    }
    return;
  }
  constexpr int kRows = kRowsInFlight<kRegs>;
  int r = 0;
  for (; r + kRows <= m; r += kRows) {
    FewColumnsRows<kRegs, kRows>(m, r, n, k, alpha, rows(r), b_rows, beta, c,
                                 nullptr);
  }
  for (; r < m; ++r) {
    FewColumnsRows<kRegs, 1>(m, r, n, k, alpha, rows(r), b_rows, beta, c,
                             nullptr);
  }
}

// GemmFewRows: column j of C (m values: kRegs registers) is the sum over
// rows r of B[r][j] times row r of A. A block of kSumBlock rows is walked
// once per chunk of at most kColumnChunk<kRegs> columns, whose sums stay in
// registers (13 or 6 x 2 sums, A's row and a broadcast of B[r][j]); the
// block's rows of B stay in L1 from one chunk to the next.
template <int kRegs>
constexpr int kColumnChunk = kRegs == 1 ? 13 : 6;
constexpr int kSumBlock = 128;

// B's rows are prefetched this many rows ahead in a block's first chunk:
// with rows of a few hundred bytes, of which a chunk reads a few, the
// hardware's prefetcher alone left the kernel waiting on L3 or memory.
constexpr int kPrefetchRows = 2;

// B's rows up to kPrefetchRows past row r (of b_rows) into L1, from *next
// on (advanced past them).
inline void PrefetchRowsOfB(const DenseRows& b, int r, int b_rows,
                            const char** next) {
  const int ahead = std::min(r + kPrefetchRows + 1, b_rows);
  const char* end = reinterpret_cast<const char*>(b.Row(ahead));
  for (; *next < end; *next += 64) _mm_prefetch(*next, _MM_HINT_T0);
}

// sums[j] += sum over r < rows of B[r][j] * a[r * m .. + m), for j < kChunk,
// B's rows from b. Reads kRegs * 8 values at each a + r * m: the caller
// makes sure they exist; lanes past m are masked to 0. Where `b_rows` (a
// dense B's rows from b on) is not 0, streams them ahead into L1: a block's
// first chunk does, the others find them there.
template <int kRegs, int kChunk, typename Rows>
MONSOON_AVX2 void FewRowsChunk(int rows, const float* a, int m, const Rows& b,
                               float* sums, int b_rows) {
  __m256 mask[kRegs];
#pragma GCC unroll 2
  for (int v = 0; v < kRegs; ++v) {
    mask[v] = _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_set1_epi32(m - v * kLanes),
                           _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
  }
  __m256 acc[kChunk][kRegs];
#pragma GCC unroll 16
  for (int j = 0; j < kChunk; ++j) {
#pragma GCC unroll 2
    for (int v = 0; v < kRegs; ++v) {
      acc[j][v] = _mm256_load_ps(sums + (j * kRegs + v) * kLanes);
    }
  }
  const char* next = reinterpret_cast<const char*>(b.Row(0));
  for (int r = 0; r < rows; ++r) {
    __m256 row[kRegs];
#pragma GCC unroll 2
    for (int v = 0; v < kRegs; ++v) {
      row[v] = _mm256_and_ps(
          _mm256_loadu_ps(a + static_cast<size_t>(r) * m + v * kLanes),
          mask[v]);
    }
    const float* b_row = b.Row(r);
    if constexpr (Rows::kPrefetch) {
      if (b_rows > 0) PrefetchRowsOfB(b, r, b_rows, &next);
    }
#pragma GCC unroll 16
    for (int j = 0; j < kChunk; ++j) {
      const __m256 x = _mm256_set1_ps(b.At(b_row, j));
#pragma GCC unroll 2
      for (int v = 0; v < kRegs; ++v) {
        acc[j][v] = _mm256_fmadd_ps(x, row[v], acc[j][v]);
      }
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < kChunk; ++j) {
#pragma GCC unroll 2
    for (int v = 0; v < kRegs; ++v) {
      _mm256_store_ps(sums + (j * kRegs + v) * kLanes, acc[j][v]);
    }
  }
}

// The same with m (9 to 16) in one AVX-512 register, where the CPU has it:
// chunks of up to kWideChunk columns (32 registers), each value of C the
// same FMAs in the same order as FewRowsChunk<2, ...>'s, so the same bits.
constexpr int kWideChunk = 24;

template <int kChunk, typename Rows>
MONSOON_AVX512 void FewRowsChunkWide(int rows, const float* a, int m,
                                     const Rows& b, float* sums, int b_rows) {
  const __mmask16 mask = static_cast<__mmask16>((1u << m) - 1);
  __m512 acc[kChunk];
#pragma GCC unroll 32
  for (int j = 0; j < kChunk; ++j) {
    acc[j] = _mm512_load_ps(sums + j * 2 * kLanes);
  }
  const char* next = reinterpret_cast<const char*>(b.Row(0));
  for (int r = 0; r < rows; ++r) {
    const __m512 row =
        _mm512_maskz_loadu_ps(mask, a + static_cast<size_t>(r) * m);
    const float* b_row = b.Row(r);
    if constexpr (Rows::kPrefetch) {
      if (b_rows > 0) PrefetchRowsOfB(b, r, b_rows, &next);
    }
#pragma GCC unroll 32
    for (int j = 0; j < kChunk; ++j) {
      acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(b.At(b_row, j)), row, acc[j]);
    }
  }
#pragma GCC unroll 32
  for (int j = 0; j < kChunk; ++j) {
    _mm512_store_ps(sums + j * 2 * kLanes, acc[j]);
  }
}

// And with m up to 8, two columns in one AVX-512 register: lane 2i sums
// row i of column j, lane 2i + 1 row i of column j + 1, so that one
// broadcast of B[r][j, j + 2) and one FMA serve both (A's row r spread to
// lanes 2i and 2i + 1 once a row). An odd last column takes the even lanes
// alone (a masked FMA). The sums keep FewRowsChunk<1, ...>'s layout (8
// values a column) outside the kernel, and each value is the same FMAs in
// the same order, so the same bits. Chunks of up to kPairChunk columns.
constexpr int kPairChunk = 26;

// _mm512_permutexvar_ps(index, v), in the form whose lanes start at zero
// (all of them chosen): GCC 12's form starts them "undefined" and warns
// that they are used uninitialized.
MONSOON_AVX512 inline __m512 FullPermute(__m512i index, __m512 v) {
  return _mm512_maskz_permutexvar_ps(static_cast<__mmask16>(0xffff), index, v);
}

// The pairs' lane orders: lane l of the interleaved layout (two columns, or
// two rows, of 8 values each, lane 2i the first's value i and 2i + 1 the
// second's) from the plain layout, the plain from the interleaved, and
// value i of 8 to lanes 2i and 2i + 1.
MONSOON_AVX512 inline __m512i ToPairs() {
  return _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7,
                           15);
}
MONSOON_AVX512 inline __m512i FromPairs() {
  return _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13,
                           15);
}
MONSOON_AVX512 inline __m512i SpreadToPairs() {
  return _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
}

template <int kColumns, typename Rows>
MONSOON_AVX512 void FewRowsPairs(int rows, const float* a, int m, const Rows& b,
                                 float* sums, int b_rows) {
  constexpr int kPairs = (kColumns + 1) / 2;
  const __m512i to_pairs = ToPairs();
  const __m512i from_pairs = FromPairs();
  const __m512i spread = SpreadToPairs();
  const __mmask16 row_mask = static_cast<__mmask16>((1u << m) - 1);
  __m512 acc[kPairs];
#pragma GCC unroll 16
  for (int p = 0; p < kPairs; ++p) {
    // A chunk may begin at an odd column: 32-byte aligned only.
    acc[p] = FullPermute(to_pairs, _mm512_loadu_ps(sums + p * 2 * kLanes));
  }
  const char* next = reinterpret_cast<const char*>(b.Row(0));
  for (int r = 0; r < rows; ++r) {
    const __m512 row = FullPermute(
        spread,
        _mm512_maskz_loadu_ps(row_mask, a + static_cast<size_t>(r) * m));
    const float* b_row = b.Row(r);
    if constexpr (Rows::kPrefetch) {
      if (b_rows > 0) PrefetchRowsOfB(b, r, b_rows, &next);
    }
#pragma GCC unroll 16
    for (int p = 0; p < kColumns / 2; ++p) {
      acc[p] = _mm512_fmadd_ps(
          row, _mm512_castpd_ps(_mm512_set1_pd(b.Pair(b_row, p))), acc[p]);
    }
    if (kColumns % 2 == 1) {
      acc[kPairs - 1] = _mm512_mask3_fmadd_ps(
          row, _mm512_set1_ps(b.At(b_row, kColumns - 1)), acc[kPairs - 1],
          static_cast<__mmask16>(0x5555));
    }
  }
#pragma GCC unroll 16
  for (int p = 0; p < kPairs; ++p) {
    _mm512_storeu_ps(sums + p * 2 * kLanes, FullPermute(from_pairs, acc[p]));
  }
}

// GemmFewColumns on patches over n <= 8 filters, where the CPU has
// AVX-512: two adjacent windows of an output row to a register, lane 2j
// the first's column j and lane 2j + 1 the second's, so that one load of
// their two values (adjacent in the image) serves both, against each
// weight spread to two lanes (b_pairs: 16 values a row of op(B)). Then
// rows [r, r + 2 kPairs) of C, as FewColumnsRows stores them (alpha, then
// the bias, bias_pairs spread likewise). Each value of C is the same FMAs
// in the same order as FewColumnsRows<1, ...>'s, so the same bits.
template <int kPairs>
MONSOON_AVX512 void FewColumnsPatchPairs(int m, int r, int n, int k,
                                         float alpha, const float* corner,
                                         const int* offsets,
                                         const float* b_pairs, float* c,
                                         const float* bias_pairs) {
  __m512 acc[kPairs];
#pragma GCC unroll 16
  for (int p = 0; p < kPairs; ++p) acc[p] = _mm512_setzero_ps();
  for (int i = 0; i < k; ++i) {
    const __m512 b = _mm512_load_ps(b_pairs + i * 2 * kLanes);
    const float* at = corner + offsets[i];
#pragma GCC unroll 16
    for (int p = 0; p < kPairs; ++p) {
      double pair;
      std::memcpy(&pair, at + 2 * p, sizeof(pair));
      acc[p] =
          _mm512_fmadd_ps(_mm512_castpd_ps(_mm512_set1_pd(pair)), b, acc[p]);
    }
  }
  const __m512i from_pairs = FromPairs();
  const __m512 scale = _mm512_set1_ps(alpha);
#pragma GCC unroll 16
  for (int p = 0; p < kPairs; ++p) {
    __m512 y = _mm512_mul_ps(scale, FullPermute(from_pairs, acc[p]));
    if (bias_pairs != nullptr) y = _mm512_add_ps(y, _mm512_load_ps(bias_pairs));
    alignas(64) float rows[2 * kLanes];
    _mm512_store_ps(rows, y);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const size_t row = static_cast<size_t>(r) + 2 * p + h;
      float* out = c + row * n;
      // A whole register where C goes on past it: the lanes past n land on
      // the next row's first values, which its own store overwrites.
      if (row * n + kLanes <= static_cast<size_t>(m) * n) {
        _mm256_storeu_ps(out, _mm256_load_ps(rows + h * kLanes));
      } else {
        for (int j = 0; j < n; ++j) out[j] = rows[h * kLanes + j];
      }
    }
  }
}

// GemmFewRows on the patches of a kernel x kernel window over m <= 8
// filters, where the CPU has AVX-512: for each kernel row, its values in
// pairs two columns to a register as FewRowsPairs takes them (adjacent in
// the image, so one load a pair; an odd row's last value alone, in the even
// lanes), and A's column sums beside them. sums holds FewRowsChunk<1, ...>'s
// layout (8 values a column) for kernel * kernel columns and one more,
// column_sums 16 values (the first m of them A's); both are added to. The
// same FMAs in the same order as FewRowsPairs' on Im2Col's matrix, and the
// same additions as a loop over A's rows, so the same bits.
template <int kKernel>
MONSOON_AVX512 void PatchPairs(int rows, const float* a, int m,
                               const float* corner, int row_stride, float* sums,
                               float* column_sums) {
  constexpr int kPairs = (kKernel + 1) / 2;  // registers per kernel row
  const __m512i to_pairs = ToPairs();
  const __m512i from_pairs = FromPairs();
  const __m512i spread = SpreadToPairs();
  const __mmask16 row_mask = static_cast<__mmask16>((1u << m) - 1);
  __m512 acc[kKernel][kPairs];
#pragma GCC unroll 8
  for (int ky = 0; ky < kKernel; ++ky) {
#pragma GCC unroll 4
    for (int p = 0; p < kPairs; ++p) {
      acc[ky][p] = FullPermute(
          to_pairs, _mm512_loadu_ps(sums + (ky * kKernel + 2 * p) * kLanes));
    }
  }
  __m512 column = _mm512_load_ps(column_sums);
  for (int r = 0; r < rows; ++r) {
    const __m512 values =
        _mm512_maskz_loadu_ps(row_mask, a + static_cast<size_t>(r) * m);
    column = _mm512_add_ps(column, values);
    const __m512 row = FullPermute(spread, values);
#pragma GCC unroll 8
    for (int ky = 0; ky < kKernel; ++ky) {
      const float* line = corner + r + ky * row_stride;
#pragma GCC unroll 4
      for (int p = 0; p < kKernel / 2; ++p) {
        double pair;
        std::memcpy(&pair, line + 2 * p, sizeof(pair));
        acc[ky][p] = _mm512_fmadd_ps(
            row, _mm512_castpd_ps(_mm512_set1_pd(pair)), acc[ky][p]);
      }
      if (kKernel % 2 == 1) {
        acc[ky][kPairs - 1] = _mm512_mask3_fmadd_ps(
            row, _mm512_set1_ps(line[kKernel - 1]), acc[ky][kPairs - 1],
            static_cast<__mmask16>(0x5555));
      }
    }
  }
  // In order: an odd kernel row's last register holds the next row's first
  // column in its odd lanes, as loaded; that row's own store comes after.
#pragma GCC unroll 8
  for (int ky = 0; ky < kKernel; ++ky) {
#pragma GCC unroll 4
    for (int p = 0; p < kPairs; ++p) {
      _mm512_storeu_ps(sums + (ky * kKernel + 2 * p) * kLanes,
                       FullPermute(from_pairs, acc[ky][p]));
    }
  }
  _mm512_store_ps(column_sums, column);
}

// Values [from, from + 16 kRegs) of a window's row of the product dy * w
// (dy's row: m values; w: m x k), the last register's lanes past k masked:
// each the sum over i < m of dy[i] * w[i][j], fused multiply-adds in order
// from 0.
template <int kRegs>
MONSOON_AVX512 void ProductRow(const float* dy, int m, const float* w, int k,
                               int from, float* out) {
  const int in_last = std::min(16, k - from - (kRegs - 1) * 16);
  const __mmask16 last = static_cast<__mmask16>((1u << in_last) - 1);
  __m512 acc[kRegs];
#pragma GCC unroll 16
  for (int v = 0; v < kRegs; ++v) acc[v] = _mm512_setzero_ps();
  for (int i = 0; i < m; ++i) {
    const __m512 d = _mm512_set1_ps(dy[i]);
    const float* row = w + static_cast<size_t>(i) * k + from;
#pragma GCC unroll 16
    for (int v = 0; v < kRegs - 1; ++v) {
      acc[v] = _mm512_fmadd_ps(d, _mm512_loadu_ps(row + v * 16), acc[v]);
    }
    acc[kRegs - 1] = _mm512_fmadd_ps(
        d, _mm512_maskz_loadu_ps(last, row + (kRegs - 1) * 16), acc[kRegs - 1]);
  }
#pragma GCC unroll 16
  for (int v = 0; v < kRegs - 1; ++v) {
    _mm512_storeu_ps(out + from + v * 16, acc[v]);
  }
  _mm512_mask_storeu_ps(out + from + (kRegs - 1) * 16, last, acc[kRegs - 1]);
}

// to[i] += from[i] for i < count, 16 at a time.
MONSOON_AVX512 void AddRun(const float* from, int count, float* to) {
  int i = 0;
  for (; i + 16 <= count; i += 16) {
    _mm512_storeu_ps(to + i, _mm512_add_ps(_mm512_loadu_ps(to + i),
                                           _mm512_loadu_ps(from + i)));
  }
  if (i < count) {
    const __mmask16 rest = static_cast<__mmask16>((1u << (count - i)) - 1);
    _mm512_mask_storeu_ps(to + i, rest,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(rest, to + i),
                                        _mm512_maskz_loadu_ps(rest, from + i)));
  }
}

#undef MONSOON_AVX2
#undef MONSOON_AVX512

// A chunk kernel by chunk size: table[s - 1] sums chunks of s, where
// pick(std::integral_constant<int, s>) is that size's kernel.
template <typename Rows>
using FewRowsChunkFn = void (*)(int, const float*, int, const Rows&, float*,
                                int);
template <typename Rows, typename Pick, int... kSizes>
constexpr std::array<FewRowsChunkFn<Rows>, sizeof...(kSizes)> ChunkTable(
    Pick pick, std::integer_sequence<int, kSizes...>) {
  return {pick(std::integral_constant<int, kSizes + 1>())...};
}
template <int kRegs, typename Rows>
constexpr std::array<FewRowsChunkFn<Rows>, kColumnChunk<kRegs>> kFewRowsChunks =
    ChunkTable<Rows>(
        [](auto size) -> FewRowsChunkFn<Rows> {
          return &FewRowsChunk<kRegs, decltype(size)::value, Rows>;
        },
        std::make_integer_sequence<int, kColumnChunk<kRegs>>());
template <typename Rows>
constexpr std::array<FewRowsChunkFn<Rows>, kWideChunk> kFewRowsChunksWide =
    ChunkTable<Rows>(
        [](auto size) -> FewRowsChunkFn<Rows> {
          return &FewRowsChunkWide<decltype(size)::value, Rows>;
        },
        std::make_integer_sequence<int, kWideChunk>());
template <typename Rows>
constexpr std::array<FewRowsChunkFn<Rows>, kPairChunk> kFewRowsChunksPairs =
    ChunkTable<Rows>(
        [](auto size) -> FewRowsChunkFn<Rows> {
          return &FewRowsPairs<decltype(size)::value, Rows>;
        },
        std::make_integer_sequence<int, kPairChunk>());

// Cuts `total` into the fewest chunks of at most `largest`, of nearly equal
// sizes (27 by 13: 9, 9 and 9 rather than 13, 13 and 1), calling
// visit(begin, size) for each.
template <typename Visit>
void ForEachChunk(int total, int largest, Visit visit) {
  const int count = (total + largest - 1) / largest;
  for (int chunk = 0, begin = 0; chunk < count; ++chunk) {
    const int size = (total - begin) / (count - chunk);
    visit(begin, size);
    begin += size;
  }
}

// C = alpha * A^T * B + beta * C (GemmFewRows) with B's k rows as `walk`
// gives them: walk(visit) calls visit(r0, rows, b) for runs of them in
// order, rows [r0, r0 + rows) read from `b` (a Rows).
template <int kRegs, typename Rows, typename Walk>
void FewRows(int m, int n, int k, float alpha, const float* a, Walk walk,
             float beta, float* c, bool wide_asked) {
  constexpr int kWidth = kRegs * kLanes;
  // One column more than n may take: an odd chunk's last pair of columns
  // (FewRowsPairs) loads and stores the sums of the column after it.
  alignas(64) float sums[(kSmallGemmMaxColumns + 1) * kWidth];
  std::fill(sums, sums + (n + 1) * kWidth, 0.0f);
  const FewRowsChunkFn<Rows>* chunks = kFewRowsChunks<kRegs, Rows>.data();
  int largest = kColumnChunk<kRegs>;
  if (wide_asked) {
    chunks = kRegs == 2 ? kFewRowsChunksWide<Rows>.data()
                        : kFewRowsChunksPairs<Rows>.data();
    largest = kRegs == 2 ? kWideChunk : kPairChunk;
  }
  // B's rows [r0, r0 + rows) from b, with their rows of A at a_rows.
  auto sum_rows = [&](int r0, int rows, const float* a_rows, const Rows& b) {
    ForEachChunk(n, largest, [&](int begin, int size) {
      chunks[size - 1](rows, a_rows, m, b.From(begin), sums + begin * kWidth,
                       begin == 0 ? k - r0 : 0);
    });
  };
  // The kernels read kWidth values from each row of A: its last rows, where
  // that would run past A's end, are read from a padded copy: tail * m <
  // kWidth values (tail < ceil(kWidth / m)), plus one row's read past them.
  const int tail = std::min(k, (kWidth + m - 1) / m - 1);
  const int body = k - tail;
  alignas(64) float padded[2 * kWidth] = {};
  std::memcpy(padded, a + static_cast<size_t>(body) * m,
              sizeof(float) * tail * m);
  walk([&](int r0, int rows, const Rows& b) {
    const int in_place = std::clamp(body - r0, 0, rows);
    if (in_place > 0) {
      sum_rows(r0, in_place, a + static_cast<size_t>(r0) * m, b);
    }
    if (in_place < rows) {
      sum_rows(r0 + in_place, rows - in_place,
               padded + static_cast<size_t>(r0 + in_place - body) * m,
               b.Skip(in_place));
    }
  });
  for (int i = 0; i < m; ++i) {
    float* row = c + static_cast<size_t>(i) * n;
    for (int j = 0; j < n; ++j) {
      row[j] = Scaled(alpha, sums[j * kWidth + i], beta, row[j]);
    }
  }
}

// B dense, k x n: blocks of kSumBlock rows, whose rows of B stay in L1
// from one chunk of columns to the next.
template <int kRegs>
void FewRowsDense(int m, int n, int k, float alpha, const float* a,
                  const float* b, float beta, float* c, bool wide_asked) {
  FewRows<kRegs, DenseRows>(
      m, n, k, alpha, a,
      [&](auto visit) {
        for (int r0 = 0; r0 < k; r0 += kSumBlock) {
          visit(r0, std::min(kSumBlock, k - r0),
                DenseRows{b + static_cast<size_t>(r0) * n,
                          static_cast<size_t>(n)});
        }
      },
      beta, c, wide_asked);
}

// B the patches: an output row's windows at a time.
template <int kRegs>
void FewRowsOfPatches(int m, int n, int k, float alpha, const float* a,
                      const ImagePatches& b, float* c, bool wide_asked) {
  const int batch = k / (b.out_height * b.out_width);
  int offsets[kSmallGemmMaxColumns];
  WindowOffsets(b, offsets);
  FewRows<kRegs, PatchRows>(
      m, n, k, alpha, a,
      [&](auto visit) {
        ForEachOutputRow(b, batch, [&](size_t r0, const float* corner) {
          visit(static_cast<int>(r0), b.out_width, PatchRows{corner, offsets});
        });
      },
      0.0f, c, wide_asked);
}

// C = alpha * patches * op(B) (+ bias), an output row's windows at a time,
// in runs of nearly equal sizes up to the kernels' rows in flight.
template <typename Rows>
using FewColumnsRowsFn = void (*)(int, int, int, int, float, const Rows&,
                                  const float*, float, float*, const float*);
template <int kRegs, typename Rows, int... kSizes>
constexpr std::array<FewColumnsRowsFn<Rows>, sizeof...(kSizes)> RowsTable(
    std::integer_sequence<int, kSizes...>) {
  return {&FewColumnsRows<kRegs, kSizes + 1, Rows>...};
}
template <typename Rows, int... kSizes>
constexpr std::array<FewColumnsRowsFn<Rows>, sizeof...(kSizes)> WideRowsTable(
    std::integer_sequence<int, kSizes...>) {
  return {&FewColumnsRowsWide<kSizes + 1, Rows>...};
}
template <int kRegs>
constexpr std::array<FewColumnsRowsFn<PatchRows>, kRowsInFlight<kRegs>>
    kRowsOfPatches = RowsTable<kRegs, PatchRows>(
        std::make_integer_sequence<int, kRowsInFlight<kRegs>>());
constexpr std::array<FewColumnsRowsFn<PatchRows>, kWideRows>
    kWideRowsOfPatches =
        WideRowsTable<PatchRows>(std::make_integer_sequence<int, kWideRows>());

constexpr int kMaxPatchPairs = 16;
using FewColumnsPatchPairsFn = void (*)(int, int, int, int, float, const float*,
                                        const int*, const float*, float*,
                                        const float*);
template <int... kSizes>
constexpr std::array<FewColumnsPatchPairsFn, sizeof...(kSizes)> PatchPairsTable(
    std::integer_sequence<int, kSizes...>) {
  return {&FewColumnsPatchPairs<kSizes + 1>...};
}
constexpr std::array<FewColumnsPatchPairsFn, kMaxPatchPairs> kPatchPairs =
    PatchPairsTable(std::make_integer_sequence<int, kMaxPatchPairs>());

// FewColumnsOfPatches over n <= 8 with AVX-512: each output row's windows
// two at a time (FewColumnsPatchPairs), in runs of nearly equal sizes, and
// an odd row's last window alone (FewColumnsRows, the same FMAs).
// b_rows and bias_row are FewColumnsRows<1, ...>'s.
void FewColumnsOfPatchPairs(const ImagePatches& a, int m, int n, int k,
                            float alpha, const int* offsets,
                            const float* b_rows, const float* bias_row,
                            float* c, int batch) {
  alignas(64) float b_pairs[kSmallGemmMaxInner * 2 * kLanes];
  for (int i = 0; i < k; ++i) {
    for (int j = 0; j < 2 * kLanes; ++j) {
      b_pairs[i * 2 * kLanes + j] = b_rows[i * kLanes + j / 2];
    }
  }
  alignas(64) float bias_pairs[2 * kLanes];
  if (bias_row != nullptr) {
    for (int j = 0; j < 2 * kLanes; ++j) bias_pairs[j] = bias_row[j % kLanes];
  }
  const int pairs = a.out_width / 2;
  ForEachOutputRow(a, batch, [&](size_t r, const float* corner) {
    ForEachChunk(pairs, kMaxPatchPairs, [&](int begin, int size) {
      kPatchPairs[size - 1](m, static_cast<int>(r) + 2 * begin, n, k, alpha,
                            corner + 2 * begin, offsets, b_pairs, c,
                            bias_row == nullptr ? nullptr : bias_pairs);
    });
    if (a.out_width % 2 == 1) {
      const int last = a.out_width - 1;
      FewColumnsRows<1, 1>(m, static_cast<int>(r) + last, n, k, alpha,
                           PatchRows{corner + last, offsets}, b_rows, 0.0f, c,
                           bias_row);
    }
  });
}

template <int kRegs>
void FewColumnsOfPatches(const ImagePatches& a, int m, int n, int k,
                         float alpha, const float* b, bool trans_b,
                         const float* bias, float* c, bool wide) {
  alignas(64) float b_rows[kSmallGemmMaxInner * kRegs * kLanes];
  StageB<kRegs>(n, k, b, trans_b, b_rows);
  alignas(64) float bias_row[kRegs * kLanes] = {};
  if (bias != nullptr) std::copy(bias, bias + n, bias_row);
  const FewColumnsRowsFn<PatchRows>* rows = kRowsOfPatches<kRegs>.data();
  int largest = kRowsInFlight<kRegs>;
  if (kRegs == 2 && wide) {
    rows = kWideRowsOfPatches.data();
    largest = kWideRows;
  }
  int offsets[kSmallGemmMaxInner];
  WindowOffsets(a, offsets);
  const int batch = m / (a.out_height * a.out_width);
  if (kRegs == 1 && wide) {
    FewColumnsOfPatchPairs(a, m, n, k, alpha, offsets, b_rows,
                           bias == nullptr ? nullptr : bias_row, c, batch);
    return;
  }
  ForEachOutputRow(a, batch, [&](size_t r, const float* corner) {
    ForEachChunk(a.out_width, largest, [&](int begin, int size) {
      rows[size - 1](m, static_cast<int>(r) + begin, n, k, alpha,
                     PatchRows{corner + begin, offsets}, b_rows, 0.0f, c,
                     bias == nullptr ? nullptr : bias_row);
    });
  });
}

}  // namespace

namespace {

using ProductRowFn = void (*)(const float*, int, const float*, int, int,
                              float*);
constexpr int kProductRowRegs = 16;
template <int... kSizes>
constexpr std::array<ProductRowFn, sizeof...(kSizes)> ProductRowTable(
    std::integer_sequence<int, kSizes...>) {
  return {&ProductRow<kSizes + 1>...};
}
constexpr std::array<ProductRowFn, kProductRowRegs> kProductRows =
    ProductRowTable(std::make_integer_sequence<int, kProductRowRegs>());

}  // namespace

void Col2ImOfProduct(const WindowGeometry& g, int batch, int m, const float* dy,
                     const float* w, float* dx) {
  const int k = g.patch();
  const size_t row_values = static_cast<size_t>(g.width) * g.channels;
  const size_t image_values = row_values * g.height;
  std::fill(dx, dx + batch * image_values, 0.0f);
  alignas(64) float window[kSmallGemmMaxInner];
  const float* d = dy;
  for (int n = 0; n < batch; ++n) {
    float* image = dx + n * image_values;
    for (int oy = 0; oy < g.out_height; ++oy) {
      for (int ox = 0; ox < g.out_width; ++ox, d += m) {
        ForEachChunk((k + 15) / 16, kProductRowRegs, [&](int begin, int regs) {
          kProductRows[regs - 1](d, m, w, k, begin * 16, window);
        });
        // As Col2Im: each kernel row's columns inside the image are one run.
        ForEachWindowRun(
            g, oy, ox, [&](int ky, int iy, int first, int last, int x) {
              AddRun(window + (static_cast<size_t>(ky) * g.kernel + first) *
                                  g.channels,
                     (last - first) * g.channels,
                     image + iy * row_values +
                         static_cast<size_t>(x) * g.channels);
            });
      }
    }
  }
}

bool SmallGemmSupported() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

bool SmallGemmHasAvx512() { return HaveAvx512(); }

void GemmFewColumns(int m, int n, int k, float alpha, const float* a,
                    const float* b, bool trans_b, float beta, float* c,
                    SmallGemmUnits units) {
  if (n <= kLanes) {
    FewColumns<1>(m, n, k, alpha, a, b, trans_b, beta, c, false);
  } else {
    FewColumns<2>(m, n, k, alpha, a, b, trans_b, beta, c,
                  units == SmallGemmUnits::kWidest && HaveAvx512());
  }
}

void GemmFewRows(int m, int n, int k, float alpha, const float* a,
                 const float* b, float beta, float* c, SmallGemmUnits units) {
  if (m <= kLanes) {
    FewRowsDense<1>(m, n, k, alpha, a, b, beta, c,
                    units == SmallGemmUnits::kWidest && HaveAvx512());
  } else {
    FewRowsDense<2>(m, n, k, alpha, a, b, beta, c,
                    units == SmallGemmUnits::kWidest && HaveAvx512());
  }
}

void GemmFewColumnsOfPatches(const ImagePatches& a, int m, int n, int k,
                             float alpha, const float* b, bool trans_b,
                             const float* bias, float* c,
                             SmallGemmUnits units) {
  if (n <= kLanes) {
    FewColumnsOfPatches<1>(a, m, n, k, alpha, b, trans_b, bias, c,
                           units == SmallGemmUnits::kWidest && HaveAvx512());
  } else {
    FewColumnsOfPatches<2>(a, m, n, k, alpha, b, trans_b, bias, c,
                           units == SmallGemmUnits::kWidest && HaveAvx512());
  }
}

namespace {

// GemmFewRowsOfPatches by PatchPairs, an output row at a time.
template <int kKernel>
void FewRowsOfPatchPairs(int m, int k, float alpha, const float* a,
                         const ImagePatches& b, float* c, float* column_sums) {
  constexpr int kColumns = kKernel * kKernel;
  alignas(64) float sums[(kColumns + 1) * kLanes] = {};
  alignas(64) float columns[2 * kLanes] = {};
  const int batch = k / (b.out_height * b.out_width);
  ForEachOutputRow(b, batch, [&](size_t r0, const float* corner) {
    PatchPairs<kKernel>(b.out_width, a + r0 * m, m, corner, b.row_stride, sums,
                        columns);
  });
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < kColumns; ++j) {
      c[static_cast<size_t>(i) * kColumns + j] =
          Scaled(alpha, sums[j * kLanes + i], 0.0f, 0.0f);
    }
  }
  if (column_sums != nullptr) std::copy(columns, columns + m, column_sums);
}

}  // namespace

void GemmFewRowsOfPatches(int m, int n, int k, float alpha, const float* a,
                          const ImagePatches& b, float* c, float* column_sums,
                          SmallGemmUnits units) {
  if (m <= kLanes && units == SmallGemmUnits::kWidest && HaveAvx512()) {
    switch (b.kernel) {
      case 3:
        return FewRowsOfPatchPairs<3>(m, k, alpha, a, b, c, column_sums);
      case 5:
        return FewRowsOfPatchPairs<5>(m, k, alpha, a, b, c, column_sums);
      case 7:
        return FewRowsOfPatchPairs<7>(m, k, alpha, a, b, c, column_sums);
      default:
        break;
    }
  }
  if (column_sums != nullptr) {
    std::fill(column_sums, column_sums + m, 0.0f);
    for (int r = 0; r < k; ++r) {
      for (int i = 0; i < m; ++i) {
        column_sums[i] += a[static_cast<size_t>(r) * m + i];
      }
    }
  }
  if (m <= kLanes) {
    FewRowsOfPatches<1>(m, n, k, alpha, a, b, c,
                        units == SmallGemmUnits::kWidest && HaveAvx512());
  } else {
    FewRowsOfPatches<2>(m, n, k, alpha, a, b, c,
                        units == SmallGemmUnits::kWidest && HaveAvx512());
  }
}

#else  // !MONSOON_SMALL_GEMM_X86: the backend never calls these.

bool SmallGemmSupported() { return false; }
bool SmallGemmHasAvx512() { return false; }

void GemmFewColumns(int m, int n, int k, float alpha, const float* a,
                    const float* b, bool trans_b, float beta, float* c,
                    SmallGemmUnits /*units*/) {
  for (int r = 0; r < m; ++r) {
    for (int j = 0; j < n; ++j) {
      float sum = 0;
      for (int i = 0; i < k; ++i) {
        sum += a[static_cast<size_t>(r) * k + i] *
               (trans_b ? b[static_cast<size_t>(j) * k + i]
                        : b[static_cast<size_t>(i) * n + j]);
      }
      float& out = c[static_cast<size_t>(r) * n + j];
      out = Scaled(alpha, sum, beta, out);
    }
  }
}

void GemmFewRows(int m, int n, int k, float alpha, const float* a,
                 const float* b, float beta, float* c,
                 SmallGemmUnits /*units*/) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      float sum = 0;
      for (int r = 0; r < k; ++r) {
        sum += a[static_cast<size_t>(r) * m + i] *
               b[static_cast<size_t>(r) * n + j];
      }
      float& out = c[static_cast<size_t>(i) * n + j];
      out = Scaled(alpha, sum, beta, out);
    }
  }
}

namespace {
float PatchValue(const ImagePatches& p, int r, int i) {
  const int per_image = p.out_height * p.out_width;
  const int n = r / per_image;
  const int oy = r % per_image / p.out_width;
  const int ox = r % p.out_width;
  return p.images[static_cast<size_t>(n) * p.image_stride +
                  static_cast<size_t>(oy + i / p.kernel) * p.row_stride + ox +
                  i % p.kernel];
}
}  // namespace

void GemmFewColumnsOfPatches(const ImagePatches& a, int m, int n, int k,
                             float alpha, const float* b, bool trans_b,
                             const float* bias, float* c,
                             SmallGemmUnits /*units*/) {
  for (int r = 0; r < m; ++r) {
    for (int j = 0; j < n; ++j) {
      float sum = 0;
      for (int i = 0; i < k; ++i) {
        sum +=
            PatchValue(a, r, i) * (trans_b ? b[static_cast<size_t>(j) * k + i]
                                           : b[static_cast<size_t>(i) * n + j]);
      }
      float& out = c[static_cast<size_t>(r) * n + j];
      out = alpha * sum;
      if (bias != nullptr) out += bias[j];
    }
  }
}

void GemmFewRowsOfPatches(int m, int n, int k, float alpha, const float* a,
                          const ImagePatches& b, float* c, float* column_sums,
                          SmallGemmUnits /*units*/) {
  if (column_sums != nullptr) {
    std::fill(column_sums, column_sums + m, 0.0f);
    for (int r = 0; r < k; ++r) {
      for (int i = 0; i < m; ++i) {
        column_sums[i] += a[static_cast<size_t>(r) * m + i];
      }
    }
  }
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      float sum = 0;
      for (int r = 0; r < k; ++r) {
        sum += a[static_cast<size_t>(r) * m + i] * PatchValue(b, r, j);
      }
      c[static_cast<size_t>(i) * n + j] = alpha * sum;
    }
  }
}

void Col2ImOfProduct(const WindowGeometry& g, int batch, int m, const float* dy,
                     const float* w, float* dx) {
  // Never called here (SmallGemmHasAvx512() is false); the definition, for
  // the record.
  const int k = g.patch();
  const size_t row_values = static_cast<size_t>(g.width) * g.channels;
  std::fill(dx, dx + batch * row_values * g.height, 0.0f);
  size_t position = 0;
  for (int n = 0; n < batch; ++n) {
    for (int oy = 0; oy < g.out_height; ++oy) {
      for (int ox = 0; ox < g.out_width; ++ox, ++position) {
        for (int j = 0; j < k; ++j) {
          const int c = j % g.channels;
          const int kx = j / g.channels % g.kernel;
          const int ky = j / (g.channels * g.kernel);
          const int iy = oy * g.stride - g.padding + ky;
          const int ix = ox * g.stride - g.padding + kx;
          if (iy < 0 || iy >= g.height || ix < 0 || ix >= g.width) continue;
          float sum = 0;
          for (int i = 0; i < m; ++i) {
            sum += dy[position * m + i] * w[static_cast<size_t>(i) * k + j];
          }
          dx[(n * g.height + iy) * row_values +
             static_cast<size_t>(ix) * g.channels + c] += sum;
        }
      }
    }
  }
}

#endif  // MONSOON_SMALL_GEMM_X86

}  // namespace monsoon::worker
