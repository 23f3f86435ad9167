// Float32 tensors on the wire: raw little-endian bytes. Stateless.
#ifndef MONSOON_COMMON_FLOAT_BYTES_H_
#define MONSOON_COMMON_FLOAT_BYTES_H_

#include <cstring>
#include <string>

#include "absl/base/config.h"
#include "absl/types/span.h"

namespace monsoon::common {

#if !defined(ABSL_IS_LITTLE_ENDIAN)
#error "Monsoon's wire format is little-endian float32; port FloatsToBytes."
#endif

// Appends the values' bytes to `out`.
inline void AppendFloatBytes(absl::Span<const float> values, std::string* out) {
  out->append(reinterpret_cast<const char*>(values.data()),
              values.size() * sizeof(float));
}

// Copies bytes.size() / 4 values into `out`; the caller checks that the size
// is a multiple of 4 and that `out` is large enough.
inline void CopyBytesToFloats(const std::string& bytes, float* out) {
  std::memcpy(out, bytes.data(), bytes.size());
}

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_FLOAT_BYTES_H_
