// Per-run credentials: a secret token that every daemon of a run reads from
// a file and that every RPC carries as "authorization: Bearer <token>"
// metadata. The shards compare it in constant time. Stateless functions;
// thread-safe.
#ifndef MONSOON_COMMON_AUTH_H_
#define MONSOON_COMMON_AUTH_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace monsoon::common {

// The metadata key the token travels under (lower case, as gRPC wants).
inline constexpr char kAuthMetadataKey[] = "authorization";

// The fewest characters a token may have: shorter ones can be guessed.
inline constexpr int kMinTokenLength = 16;

// The token in `path`, without surrounding white space. INVALID_ARGUMENT
// naming the file when it cannot be read, or the token is shorter than
// kMinTokenLength or holds characters other than printable ASCII (it goes
// into HTTP/2 headers).
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// The metadata value for `token`: "Bearer <token>".
std::string BearerValue(absl::string_view token);

// Whether `value` (the metadata received) is BearerValue(token), compared in
// time that does not depend on where they differ.
bool BearerMatches(absl::string_view value, absl::string_view token);

// A fresh token: 32 random bytes from the system's generator, in hex.
absl::StatusOr<std::string> NewToken();

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_AUTH_H_
