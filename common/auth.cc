#include "common/auth.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace monsoon::common {

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  if (in) text << in.rdbuf();
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the auth token file ", path));
  }
  const std::string token(absl::StripAsciiWhitespace(text.str()));
  if (token.size() < static_cast<size_t>(kMinTokenLength)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the auth token in ", path, " has ", token.size(),
                     " characters; use at least ", kMinTokenLength,
                     " (e.g. openssl rand -hex 32)"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat("the auth token in ", path,
                       " holds a character that is not printable ASCII"));
    }
  }
  return token;
}

std::string BearerValue(absl::string_view token) {
  return absl::StrCat("Bearer ", token);
}

bool BearerMatches(absl::string_view value, absl::string_view token) {
  const std::string expected = BearerValue(token);
  // The lengths are not secret (every run's token has its own); the bytes
  // are.
  return value.size() == expected.size() &&
         CRYPTO_memcmp(value.data(), expected.data(), expected.size()) == 0;
}

absl::StatusOr<std::string> NewToken() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("the system's random generator failed");
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

}  // namespace monsoon::common
