#include "common/onebit.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace monsoon::common {

uint64_t OneBitBuckets(uint64_t n, int bucket_size) {
  return (n + bucket_size - 1) / bucket_size;
}

uint64_t OneBitBitsBytes(uint64_t n, int bucket_size) {
  const uint64_t full = n / bucket_size;
  const uint64_t rest = n % bucket_size;
  return full * ((bucket_size + 7) / 8) + (rest + 7) / 8;
}

void OneBitEncode(absl::Span<const float> gradient, absl::Span<float> residual,
                  int bucket_size, OneBitEncoded* out) {
  const size_t n = gradient.size();
  for (size_t begin = 0; begin < n; begin += bucket_size) {
    const size_t end = std::min(n, begin + bucket_size);
    double sums[2] = {0, 0};
    int64_t counts[2] = {0, 0};
    for (size_t i = begin; i < end; ++i) {
      const float v = gradient[i] + residual[i];
      residual[i] = v;  // v for now; the quantization loss below
      const int side = v >= 0 ? 1 : 0;
      sums[side] += v;
      ++counts[side];
    }
    float scales[2];
    for (int side = 0; side < 2; ++side) {
      scales[side] =
          counts[side] > 0 ? static_cast<float>(sums[side] / counts[side]) : 0;
    }
    const size_t bytes = (end - begin + 7) / 8;
    const size_t at = out->bits.size();
    out->bits.resize(at + bytes, '\0');
    for (size_t i = begin; i < end; ++i) {
      const float v = residual[i];
      const int side = v >= 0 ? 1 : 0;
      if (side) {
        const size_t k = i - begin;
        out->bits[at + k / 8] =
            static_cast<char>(out->bits[at + k / 8] | (1u << (k % 8)));
      }
      residual[i] = v - scales[side];
    }
    out->scales.append(reinterpret_cast<const char*>(scales), sizeof(scales));
  }
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
