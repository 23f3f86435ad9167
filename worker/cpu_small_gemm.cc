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

// Rows [r, r + kRows) of C from A's rows there; b_rows is op(B), a row of
// kRegs * 8 values per i.
template <int kRegs, int kRows>
MONSOON_AVX2 void FewColumnsRows(int m, int r, int n, int k, float alpha,
                                 const float* a, const float* b_rows,
                                 float beta, float* c) {
  __m256 acc[kRows][kRegs];
#pragma GCC unroll 16
  for (int q = 0; q < kRows; ++q) {
#pragma GCC unroll 2
    for (int v = 0; v < kRegs; ++v) acc[q][v] = _mm256_setzero_ps();
  }
  const float* rows = a + static_cast<size_t>(r) * k;
  PrefetchNextRows(rows, kRows, r, m, k);
  for (int i = 0; i < k; ++i) {
    __m256 b[kRegs];
#pragma GCC unroll 2
    for (int v = 0; v < kRegs; ++v) {
      b[v] = _mm256_load_ps(b_rows + (i * kRegs + v) * kLanes);
    }
#pragma GCC unroll 16
    for (int q = 0; q < kRows; ++q) {
      const __m256 x = _mm256_broadcast_ss(rows + q * k + i);
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
        _mm256_storeu_ps(out + v * kLanes, _mm256_mul_ps(scale, acc[q][v]));
      }
      continue;
    }
    alignas(32) float sums[kRegs * kLanes];
#pragma GCC unroll 2
    for (int v = 0; v < kRegs; ++v) {
      _mm256_store_ps(sums + v * kLanes, acc[q][v]);
    }
    for (int j = 0; j < n; ++j) out[j] = Scaled(alpha, sums[j], beta, out[j]);
  }
}

// The same with the small side (9 to 16) in one AVX-512 register, where the
// CPU has AVX-512: one FMA where AVX2 takes two, and 32 registers hold 24
// rows' sums. Each value of C is the same FMAs in the same order as in
// FewColumnsRows<2, ...>, so the same bits.
constexpr int kWideRows = 24;

template <int kRows>
MONSOON_AVX512 void FewColumnsRowsWide(int m, int r, int n, int k, float alpha,
                                       const float* a, const float* b_rows,
                                       float beta, float* c) {
  __m512 acc[kRows];
#pragma GCC unroll 32
  for (int q = 0; q < kRows; ++q) acc[q] = _mm512_setzero_ps();
  const float* rows = a + static_cast<size_t>(r) * k;
  PrefetchNextRows(rows, kRows, r, m, k);
  for (int i = 0; i < k; ++i) {
    const __m512 b = _mm512_load_ps(b_rows + i * 2 * kLanes);
#pragma GCC unroll 32
    for (int q = 0; q < kRows; ++q) {
      acc[q] = _mm512_fmadd_ps(_mm512_set1_ps(rows[q * k + i]), b, acc[q]);
    }
  }
  const __m512 scale = _mm512_set1_ps(alpha);
#pragma GCC unroll 32
  for (int q = 0; q < kRows; ++q) {
    float* out = c + static_cast<size_t>(r + q) * n;
    if (beta == 0.0f && n == 2 * kLanes) {
      _mm512_storeu_ps(out, _mm512_mul_ps(scale, acc[q]));
      continue;
    }
    alignas(64) float sums[2 * kLanes];
    _mm512_store_ps(sums, acc[q]);
    for (int j = 0; j < n; ++j) out[j] = Scaled(alpha, sums[j], beta, out[j]);
  }
}

template <int kRegs>
void FewColumns(int m, int n, int k, float alpha, const float* a,
                const float* b, bool trans_b, float beta, float* c, bool wide) {
  // Row i of op(B), zero past n.
  alignas(64) float b_rows[kSmallGemmMaxInner * kRegs * kLanes];
  for (int i = 0; i < k; ++i) {
    for (int j = 0; j < kRegs * kLanes; ++j) {
      b_rows[i * kRegs * kLanes + j] =
          j >= n ? 0.0f
                 : (trans_b ? b[static_cast<size_t>(j) * k + i]
                            : b[static_cast<size_t>(i) * n + j]);
    }
  }
  if (kRegs == 2 && wide) {
    int r = 0;
    for (; r + kWideRows <= m; r += kWideRows) {
      FewColumnsRowsWide<kWideRows>(m, r, n, k, alpha, a, b_rows, beta, c);
    }
    for (; r < m; ++r) {
      FewColumnsRowsWide<1>(m, r, n, k, alpha, a, b_rows, beta, c);
    }
    return;
  }
  constexpr int kRows = kRowsInFlight<kRegs>;
  int r = 0;
  for (; r + kRows <= m; r += kRows) {
    FewColumnsRows<kRegs, kRows>(m, r, n, k, alpha, a, b_rows, beta, c);
  }
  for (; r < m; ++r) {
    FewColumnsRows<kRegs, 1>(m, r, n, k, alpha, a, b_rows, beta, c);
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
inline void PrefetchRowsOfB(const float* b, int ldb, int r, int b_rows,
                            const char** next) {
  const int ahead = std::min(r + kPrefetchRows + 1, b_rows);
  const char* end =
      reinterpret_cast<const char*>(b + static_cast<size_t>(ahead) * ldb);
  for (; *next < end; *next += 64) _mm_prefetch(*next, _MM_HINT_T0);
}

// sums[j] += sum over r < rows of b[r * ldb + j] * a[r * m .. + m), for j <
// kChunk. Reads kRegs * 8 values at each a + r * m: the caller makes sure
// they exist; lanes past m are masked to 0. Where `b_rows` (B's rows from
// b on) is not 0, streams them ahead into L1: a block's first chunk does,
// the others find them there.
template <int kRegs, int kChunk>
MONSOON_AVX2 void FewRowsChunk(int rows, const float* a, int m, const float* b,
                               int ldb, float* sums, int b_rows) {
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
  const char* next = reinterpret_cast<const char*>(b);
  for (int r = 0; r < rows; ++r) {
    __m256 row[kRegs];
#pragma GCC unroll 2
    for (int v = 0; v < kRegs; ++v) {
      row[v] = _mm256_and_ps(
          _mm256_loadu_ps(a + static_cast<size_t>(r) * m + v * kLanes),
          mask[v]);
    }
    const float* b_row = b + static_cast<size_t>(r) * ldb;
    if (b_rows > 0) PrefetchRowsOfB(b, ldb, r, b_rows, &next);
#pragma GCC unroll 16
    for (int j = 0; j < kChunk; ++j) {
      const __m256 x = _mm256_broadcast_ss(b_row + j);
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

template <int kChunk>
MONSOON_AVX512 void FewRowsChunkWide(int rows, const float* a, int m,
                                     const float* b, int ldb, float* sums,
                                     int b_rows) {
  const __mmask16 mask = static_cast<__mmask16>((1u << m) - 1);
  __m512 acc[kChunk];
#pragma GCC unroll 32
  for (int j = 0; j < kChunk; ++j) {
    acc[j] = _mm512_load_ps(sums + j * 2 * kLanes);
  }
  const char* next = reinterpret_cast<const char*>(b);
  for (int r = 0; r < rows; ++r) {
    const __m512 row =
        _mm512_maskz_loadu_ps(mask, a + static_cast<size_t>(r) * m);
    const float* b_row = b + static_cast<size_t>(r) * ldb;
    if (b_rows > 0) PrefetchRowsOfB(b, ldb, r, b_rows, &next);
#pragma GCC unroll 32
    for (int j = 0; j < kChunk; ++j) {
      acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(b_row[j]), row, acc[j]);
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

template <int kColumns>
MONSOON_AVX512 void FewRowsPairs(int rows, const float* a, int m,
                                 const float* b, int ldb, float* sums,
                                 int b_rows) {
  constexpr int kPairs = (kColumns + 1) / 2;
  // Lane l of the interleaved layout from the sums' layout and back, and
  // A's value i to lanes 2i and 2i + 1.
  const __m512i to_pairs =
      _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
  const __m512i from_pairs =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const __m512i spread =
      _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const __mmask16 row_mask = static_cast<__mmask16>((1u << m) - 1);
  __m512 acc[kPairs];
#pragma GCC unroll 16
  for (int p = 0; p < kPairs; ++p) {
    // A chunk may begin at an odd column: 32-byte aligned only.
    acc[p] = FullPermute(to_pairs, _mm512_loadu_ps(sums + p * 2 * kLanes));
  }
  const char* next = reinterpret_cast<const char*>(b);
  for (int r = 0; r < rows; ++r) {
    const __m512 row = FullPermute(
        spread,
        _mm512_maskz_loadu_ps(row_mask, a + static_cast<size_t>(r) * m));
    const float* b_row = b + static_cast<size_t>(r) * ldb;
    if (b_rows > 0) PrefetchRowsOfB(b, ldb, r, b_rows, &next);
#pragma GCC unroll 16
    for (int p = 0; p < kColumns / 2; ++p) {
      double pair;
      std::memcpy(&pair, b_row + 2 * p, sizeof(pair));
      acc[p] =
          _mm512_fmadd_ps(row, _mm512_castpd_ps(_mm512_set1_pd(pair)), acc[p]);
    }
    if (kColumns % 2 == 1) {
      acc[kPairs - 1] = _mm512_mask3_fmadd_ps(
          row, _mm512_set1_ps(b_row[kColumns - 1]), acc[kPairs - 1],
          static_cast<__mmask16>(0x5555));
    }
  }
#pragma GCC unroll 16
  for (int p = 0; p < kPairs; ++p) {
    _mm512_storeu_ps(sums + p * 2 * kLanes, FullPermute(from_pairs, acc[p]));
  }
}

#undef MONSOON_AVX2
#undef MONSOON_AVX512

// A chunk kernel by chunk size: table[s - 1] sums chunks of s, where
// pick(std::integral_constant<int, s>) is that size's kernel.
using FewRowsChunkFn = void (*)(int, const float*, int, const float*, int,
                                float*, int);
template <typename Pick, int... kSizes>
constexpr std::array<FewRowsChunkFn, sizeof...(kSizes)> ChunkTable(
    Pick pick, std::integer_sequence<int, kSizes...>) {
  return {pick(std::integral_constant<int, kSizes + 1>())...};
}
template <int kRegs>
constexpr std::array<FewRowsChunkFn, kColumnChunk<kRegs>> kFewRowsChunks =
    ChunkTable(
        [](auto size) -> FewRowsChunkFn {
          return &FewRowsChunk<kRegs, decltype(size)::value>;
        },
        std::make_integer_sequence<int, kColumnChunk<kRegs>>());
constexpr std::array<FewRowsChunkFn, kWideChunk> kFewRowsChunksWide =
    ChunkTable(
        [](auto size) -> FewRowsChunkFn {
          return &FewRowsChunkWide<decltype(size)::value>;
        },
        std::make_integer_sequence<int, kWideChunk>());
constexpr std::array<FewRowsChunkFn, kPairChunk> kFewRowsChunksPairs =
    ChunkTable(
        [](auto size) -> FewRowsChunkFn {
          return &FewRowsPairs<decltype(size)::value>;
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

template <int kRegs>
void FewRows(int m, int n, int k, float alpha, const float* a, const float* b,
             float beta, float* c, bool wide_asked) {
  constexpr int kWidth = kRegs * kLanes;
  // One column more than n may take: an odd chunk's last pair of columns
  // (FewRowsPairs) loads and stores the sums of the column after it.
  alignas(64) float sums[(kSmallGemmMaxColumns + 1) * kWidth];
  std::fill(sums, sums + (n + 1) * kWidth, 0.0f);
  const FewRowsChunkFn* chunks = kFewRowsChunks<kRegs>.data();
  int largest = kColumnChunk<kRegs>;
  if (wide_asked) {
    chunks =
        kRegs == 2 ? kFewRowsChunksWide.data() : kFewRowsChunksPairs.data();
    largest = kRegs == 2 ? kWideChunk : kPairChunk;
  }
  // B's rows [r0, r0 + rows), with their rows of A at a_rows.
  auto sum_rows = [&](int r0, int rows, const float* a_rows) {
    const float* b_rows = b + static_cast<size_t>(r0) * n;
    ForEachChunk(n, largest, [&](int begin, int size) {
      chunks[size - 1](rows, a_rows, m, b_rows + begin, n,
                       sums + begin * kWidth, begin == 0 ? k - r0 : 0);
    });
  };
  // The kernels read kWidth values from each row of A: its last rows, where
  // that would run past A's end, are read from a padded copy.
  const int tail = std::min(k, (kWidth + m - 1) / m - 1);
  const int body = k - tail;
  for (int r0 = 0; r0 < body; r0 += kSumBlock) {
    sum_rows(r0, std::min(kSumBlock, body - r0),
             a + static_cast<size_t>(r0) * m);
  }
  if (tail > 0) {
    // tail * m < kWidth values (tail < ceil(kWidth / m)), plus one row's
    // read past them.
    alignas(64) float padded[2 * kWidth] = {};
    std::memcpy(padded, a + static_cast<size_t>(body) * m,
                sizeof(float) * tail * m);
    sum_rows(body, tail, padded);
  }
  for (int i = 0; i < m; ++i) {
    float* row = c + static_cast<size_t>(i) * n;
    for (int j = 0; j < n; ++j) {
      row[j] = Scaled(alpha, sums[j * kWidth + i], beta, row[j]);
    }
  }
}

}  // namespace

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
    FewRows<1>(m, n, k, alpha, a, b, beta, c,
               units == SmallGemmUnits::kWidest && HaveAvx512());
  } else {
    FewRows<2>(m, n, k, alpha, a, b, beta, c,
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

#endif  // MONSOON_SMALL_GEMM_X86

}  // namespace monsoon::worker
