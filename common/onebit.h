// 1-bit quantization with error feedback (Seide et al. 2014).
//
// A slice of n values is cut into buckets of `bucket_size` values (the last
// may be shorter). Per bucket, every value becomes one bit (1 where it is
// >= 0) and the bucket keeps two float32 reconstruction values: the mean of
// the values quantized to each side (0 for a side with no values). Decoding
// maps each bit back to its side's mean. The encoder adds the residual (what
// the previous encodings lost) to the gradient before quantizing and keeps
// the new loss: decoded + new residual == gradient + old residual, exactly
// up to float rounding.
//
// Wire layout of an encoded slice: `bits` holds each bucket's bits packed
// little-endian within bytes (value i of a bucket is bit i % 8 of byte
// i / 8), every bucket starting on a byte boundary; `scales` holds, per
// bucket, the float32 mean of the negative side then of the non-negative
// side, little-endian. Stateless functions; thread-safe.
#ifndef MONSOON_COMMON_ONEBIT_H_
#define MONSOON_COMMON_ONEBIT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace monsoon::common {

struct OneBitEncoded {
  std::string bits;
  std::string scales;
};

uint64_t OneBitBuckets(uint64_t n, int bucket_size);
// Bytes of packed bits for n values in buckets of bucket_size.
uint64_t OneBitBitsBytes(uint64_t n, int bucket_size);

// Quantizes v = gradient + residual, appending to `out`, and sets
// residual = v - decode(out). gradient.size() == residual.size().
void OneBitEncode(absl::Span<const float> gradient, absl::Span<float> residual,
                  int bucket_size, OneBitEncoded* out);

// The same into caller buffers: `bits` gets OneBitBitsBytes(n, bucket_size)
// bytes and `scales` 2 floats per bucket.
void OneBitEncode(const float* gradient, float* residual, size_t n,
                  int bucket_size, uint8_t* bits, float* scales);

// Decodes n = out.size() values. INVALID_ARGUMENT when the byte counts do
// not match n and bucket_size, or a scale is NaN or Inf; `out` is then
// unspecified.
absl::Status OneBitDecode(absl::string_view bits, absl::string_view scales,
                          int bucket_size, absl::Span<float> out);

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_ONEBIT_H_
