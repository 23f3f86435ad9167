// Small helpers shared by Monsoon's tests: resolved configs from text, a
// scratch folder, and writing plain, gzip and IDX files. Test-only;
// stateless apart from the files they write.
#ifndef MONSOON_TESTS_TEST_UTIL_H_
#define MONSOON_TESTS_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "proto/config.pb.h"

namespace monsoon::testutil {

// Parses and resolves a text-format TrainingConfig. A config that does not
// resolve is a mistake in the test: it is reported as a test failure and an
// empty config comes back.
TrainingConfig ResolvedConfig(absl::string_view text);

// The test's scratch folder ($TEST_TMPDIR under Bazel), without a trailing
// slash, and a path inside it.
std::string TempDir();
std::string TempPath(absl::string_view name);
// TempPath(name) as a new, empty folder (whatever was there is removed).
std::string FreshDir(absl::string_view name);

// Writes `bytes` to `path`, plain or gzip-compressed (zlib's gzwrite).
// Failures are reported as test failures.
void WriteFile(const std::string& path, absl::string_view bytes);
// The whole file at `path` into *bytes; false if it cannot be read.
bool ReadFile(const std::string& path, std::string* bytes);
void WriteGzipFile(const std::string& path, absl::string_view bytes);

// The bytes of an IDX file of unsigned bytes (type 0x08) with these
// dimensions and data; `data` is not checked against the dimensions, so that
// tests can build malformed files.
std::string IdxBytes(const std::vector<uint32_t>& dims,
                     const std::vector<uint8_t>& data);

// A port on 127.0.0.1 that was free a moment ago (0 if none was found),
// chosen at random below the kernel's ephemeral ports, so that no outgoing
// connection takes it before the test binds it (common::FreePortRange).
int FreePort();

}  // namespace monsoon::testutil

#endif  // MONSOON_TESTS_TEST_UTIL_H_
