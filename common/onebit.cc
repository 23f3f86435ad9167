#include "common/onebit.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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
  // Branch-free on the sign, which is close to random: each side's sum takes
  // a zero for values of the other side, which leaves it exactly as it was,
  // and bits are gathered a byte at a time.
  const float* g = gradient;
  float* r = residual;
  for (size_t begin = 0; begin < n; begin += bucket_size) {
    const size_t end = std::min(n, begin + bucket_size);
    double negative_sum = 0, non_negative_sum = 0;
    int64_t non_negative = 0;
    for (size_t i = begin; i < end; ++i) {
      const float v = g[i] + r[i];
      r[i] = v;  // v for now; the quantization loss below
      const bool up = v >= 0;
      non_negative_sum += static_cast<double>(KeepIf(v, up));
      negative_sum += static_cast<double>(KeepIf(v, !up));
      non_negative += up;
    }
    const int64_t negative = static_cast<int64_t>(end - begin) - non_negative;
    const float pair[2] = {
        negative > 0 ? static_cast<float>(negative_sum / negative) : 0.0f,
        non_negative > 0 ? static_cast<float>(non_negative_sum / non_negative)
                         : 0.0f};
    for (size_t first = begin; first < end; first += 8) {
      const size_t last = std::min(end, first + 8);
      unsigned byte = 0;
      for (size_t i = first; i < last; ++i) {
        const float v = r[i];
        const bool up = v >= 0;
        byte |= static_cast<unsigned>(up) << (i - first);
        r[i] = v - pair[static_cast<int>(up)];  // an index, not a branch
      }
      *bits++ = static_cast<uint8_t>(byte);
    }
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

absl::Status OneBitDecode(const std::string& bits, const std::string& scales,
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
