#include "common/onebit.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "absl/strings/str_cat.h"

namespace monsoon::common {
namespace {

// v where `keep`, else +0.0f, by masking its bits: compilers turn a
// conditional here into a branch, which a random sign mispredicts half the
// time (ten times slower, measured).
inline float KeepIf(float v, bool keep) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  bits &= 0u - static_cast<uint32_t>(keep);
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

// One bucket's two sides: the sums of its negative and non-negative values
// in double precision, and how many are non-negative.
struct Sides {
  double negative_sum = 0;
  double non_negative_sum = 0;
  int64_t non_negative = 0;
};

// The definition: each side summed one value at a time, in index order.
// `v` holds the bucket's values g + r.
Sides SumInOrder(const float* v, size_t n) {
  Sides sides;
  for (size_t i = 0; i < n; ++i) {
    const bool up = v[i] >= 0;
    sides.non_negative_sum += static_cast<double>(KeepIf(v[i], up));
    sides.negative_sum += static_cast<double>(KeepIf(v[i], !up));
    sides.non_negative += up;
  }
  return sides;
}

// v = g + r, kept in r, one value at a time.
void AddResidual(const float* g, float* r, size_t n) {
  for (size_t i = 0; i < n; ++i) r[i] = g[i] + r[i];
}

// The bits of a bucket's values v (in r), and r = v minus its side's mean.
void Pack(float* r, size_t n, const float pair[2], uint8_t* bits) {
  for (size_t first = 0; first < n; first += 8) {
    const size_t last = std::min(n, first + 8);
    unsigned byte = 0;
    for (size_t i = first; i < last; ++i) {
      const float v = r[i];
      const bool up = v >= 0;
      byte |= static_cast<unsigned>(up) << (i - first);
      r[i] = v - pair[static_cast<int>(up)];  // an index, not a branch
    }
    *bits++ = static_cast<uint8_t>(byte);
  }
}

#if defined(__x86_64__)

// The same passes eight values at a time with AVX2, where the processor has
// it; results are bit for bit those of the definition above.
//
// The sides are summed in eight lanes, not in index order. That gives the
// same doubles whenever every partial sum is exact, whatever the order:
// each value is a multiple of 2^(e_min - 150), where e_min is the smallest
// biased exponent among the bucket's nonzero values (denormals count as 1),
// and |sum| < n * 2^(e_max - 126), so all fit a double's 53 bits when
// e_max - e_min + ceil(log2 n) <= 29. Gradients in one bucket usually span
// far less; a bucket that does not (or holds NaN or Inf, exponent 255) is
// summed again in order.
__attribute__((target("avx2"))) bool SumExactAvx2(const float* g, float* r,
                                                  size_t n, Sides* sides) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256i magnitude_bits = _mm256_set1_epi32(0x7fffffff);
  __m256d negative[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
  __m256d non_negative[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
  __m256i count = _mm256_setzero_si256();
  // A float's magnitude bits order as its magnitude does: the largest and
  // the smallest nonzero magnitude give the exponent range. Zeros are left
  // out by turning them into all ones, which the unsigned minimum ignores.
  __m256i largest = _mm256_setzero_si256();
  __m256i smallest = _mm256_set1_epi32(-1);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v =
        _mm256_add_ps(_mm256_loadu_ps(g + i), _mm256_loadu_ps(r + i));
    _mm256_storeu_ps(r + i, v);
    const __m256i magnitude =
        _mm256_and_si256(_mm256_castps_si256(v), magnitude_bits);
    largest = _mm256_max_epu32(largest, magnitude);
    smallest = _mm256_min_epu32(
        smallest,
        _mm256_or_si256(magnitude,
                        _mm256_cmpeq_epi32(magnitude, _mm256_setzero_si256())));
    const __m256 up = _mm256_cmp_ps(v, zero, _CMP_GE_OQ);
    count = _mm256_sub_epi32(count, _mm256_castps_si256(up));
    const __m256 pos = _mm256_and_ps(v, up);
    const __m256 neg = _mm256_andnot_ps(up, v);
    non_negative[0] = _mm256_add_pd(
        non_negative[0], _mm256_cvtps_pd(_mm256_castps256_ps128(pos)));
    non_negative[1] = _mm256_add_pd(
        non_negative[1], _mm256_cvtps_pd(_mm256_extractf128_ps(pos, 1)));
    negative[0] = _mm256_add_pd(negative[0],
                                _mm256_cvtps_pd(_mm256_castps256_ps128(neg)));
    negative[1] = _mm256_add_pd(negative[1],
                                _mm256_cvtps_pd(_mm256_extractf128_ps(neg, 1)));
  }
  alignas(32) uint32_t lanes_max[8], lanes_min[8], lanes_count[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes_max), largest);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes_min), smallest);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes_count), count);
  alignas(32) double sums[2][8];
  _mm256_store_pd(sums[0], negative[0]);
  _mm256_store_pd(sums[0] + 4, negative[1]);
  _mm256_store_pd(sums[1], non_negative[0]);
  _mm256_store_pd(sums[1] + 4, non_negative[1]);
  uint32_t max_magnitude = 0, min_magnitude = 0xffffffffu;
  Sides out;
  for (int lane = 0; lane < 8; ++lane) {
    max_magnitude = std::max(max_magnitude, lanes_max[lane]);
    min_magnitude = std::min(min_magnitude, lanes_min[lane]);
    out.non_negative += lanes_count[lane];
    out.negative_sum += sums[0][lane];
    out.non_negative_sum += sums[1][lane];
  }
  for (; i < n; ++i) {
    const float v = g[i] + r[i];
    r[i] = v;
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude != 0) {
      max_magnitude = std::max(max_magnitude, magnitude);
      min_magnitude = std::min(min_magnitude, magnitude);
    }
    const bool up = v >= 0;
    out.non_negative += up;
    (up ? out.non_negative_sum : out.negative_sum) += static_cast<double>(v);
  }
  const uint32_t max_e = max_magnitude >> 23;  // 0 when all are zero
  const uint32_t min_e = std::max<uint32_t>(min_magnitude >> 23, 1);
  int ceil_log2 = 0;
  while ((size_t{1} << ceil_log2) < n) ++ceil_log2;
  if (max_magnitude != 0 &&
      static_cast<int>(max_e) - static_cast<int>(min_e) + ceil_log2 > 29) {
    return false;
  }
  *sides = out;
  return true;
}

__attribute__((target("avx2"))) void PackAvx2(float* r, size_t n,
                                              const float pair[2],
                                              uint8_t* bits) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 negative = _mm256_set1_ps(pair[0]);
  const __m256 non_negative = _mm256_set1_ps(pair[1]);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(r + i);
    const __m256 up = _mm256_cmp_ps(v, zero, _CMP_GE_OQ);
    *bits++ = static_cast<uint8_t>(_mm256_movemask_ps(up));
    _mm256_storeu_ps(
        r + i, _mm256_sub_ps(v, _mm256_blendv_ps(negative, non_negative, up)));
  }
  if (i < n) Pack(r + i, n - i, pair, bits);
}

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

#else

bool HasAvx2() { return false; }

#endif  // __x86_64__

}  // namespace

uint64_t OneBitBuckets(uint64_t n, int bucket_size) {
  return (n + bucket_size - 1) / bucket_size;
}

uint64_t OneBitBitsBytes(uint64_t n, int bucket_size) {
  const uint64_t full = n / bucket_size;
  const uint64_t rest = n % bucket_size;
  return full * ((bucket_size + 7) / 8) + (rest + 7) / 8;
}

void OneBitEncode(const float* gradient, float* residual, size_t n,
                  int bucket_size, uint8_t* bits, float* scales) {
  const bool avx2 = HasAvx2();
  for (size_t begin = 0; begin < n; begin += bucket_size) {
    const size_t len = std::min<size_t>(n - begin, bucket_size);
    const float* g = gradient + begin;
    float* r = residual + begin;
    Sides sides;
#if defined(__x86_64__)
    if (!avx2 || !SumExactAvx2(g, r, len, &sides)) {
      if (!avx2) AddResidual(g, r, len);
      sides = SumInOrder(r, len);  // r holds v = g + r either way
    }
#else
    AddResidual(g, r, len);
    sides = SumInOrder(r, len);
#endif
    const int64_t negative = static_cast<int64_t>(len) - sides.non_negative;
    const float pair[2] = {
        negative > 0 ? static_cast<float>(sides.negative_sum / negative) : 0.0f,
        sides.non_negative > 0
            ? static_cast<float>(sides.non_negative_sum / sides.non_negative)
            : 0.0f};
#if defined(__x86_64__)
    if (avx2) {
      PackAvx2(r, len, pair, bits);
    } else {
      Pack(r, len, pair, bits);
    }
#else
    Pack(r, len, pair, bits);
#endif
    bits += (len + 7) / 8;
    *scales++ = pair[0];
    *scales++ = pair[1];
  }
}

void OneBitEncode(absl::Span<const float> gradient, absl::Span<float> residual,
                  int bucket_size, OneBitEncoded* out) {
  const size_t n = gradient.size();
  const size_t bits_at = out->bits.size();
  out->bits.resize(bits_at + OneBitBitsBytes(n, bucket_size));
  // A string's bytes need not be aligned for floats: the scales go through
  // a vector.
  std::vector<float> scales(2 * OneBitBuckets(n, bucket_size));
  OneBitEncode(gradient.data(), residual.data(), n, bucket_size,
               reinterpret_cast<uint8_t*>(out->bits.data() + bits_at),
               scales.data());
  out->scales.append(reinterpret_cast<const char*>(scales.data()),
                     scales.size() * sizeof(float));
}

absl::Status OneBitDecode(absl::string_view bits, absl::string_view scales,
                          int bucket_size, absl::Span<float> out) {
  const uint64_t n = out.size();
  if (bucket_size < 1) {
    return absl::InvalidArgumentError("1-bit bucket size must be positive");
  }
  const uint64_t buckets = OneBitBuckets(n, bucket_size);
  if (bits.size() != OneBitBitsBytes(n, bucket_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("1-bit payload has ", bits.size(), " bytes of bits; ", n,
                     " values in buckets of ", bucket_size, " need ",
                     OneBitBitsBytes(n, bucket_size)));
  }
  if (scales.size() != buckets * 2 * sizeof(float)) {
    return absl::InvalidArgumentError(
        absl::StrCat("1-bit payload has ", scales.size() / (2 * sizeof(float)),
                     " buckets' scales (", scales.size(), " bytes); ", n,
                     " values in buckets of ", bucket_size, " need ", buckets));
  }
  size_t byte = 0;
  for (uint64_t b = 0; b < buckets; ++b) {
    float pair[2];
    std::memcpy(pair, scales.data() + b * sizeof(pair), sizeof(pair));
    if (!std::isfinite(pair[0]) || !std::isfinite(pair[1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "1-bit bucket ", b, " has a non-finite reconstruction value"));
    }
    const uint64_t begin = b * bucket_size;
    const uint64_t end = std::min<uint64_t>(n, begin + bucket_size);
    for (uint64_t i = begin; i < end; ++i) {
      const uint64_t k = i - begin;
      const bool set =
          (static_cast<uint8_t>(bits[byte + k / 8]) >> (k % 8)) & 1;
      out[i] = pair[set ? 1 : 0];
    }
    byte += (end - begin + 7) / 8;
  }
  return absl::OkStatus();
}

}  // namespace monsoon::common
