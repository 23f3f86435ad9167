// Flags from the environment: MONSOON_<FLAG NAME IN UPPER CASE> sets a flag's
// value before the command line is parsed, so that containers can pass
// everything as environment variables and a command-line flag still wins.
// Call from main() only, before absl::ParseCommandLine. Not thread-safe.
#ifndef MONSOON_COMMON_FLAG_ENV_H_
#define MONSOON_COMMON_FLAG_ENV_H_

#include <initializer_list>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace monsoon::common {

// INVALID_ARGUMENT names the variable whose value does not parse.
absl::Status ApplyFlagEnvironment(
    std::initializer_list<absl::string_view> flags);

// INVALID_ARGUMENT naming the first command-line argument that looks like a
// flag (--name or --name=value; --noname for booleans) but names no defined
// flag. Abseil's parser exits with code 1 on those; daemons call this first
// so that they can exit with code 2 (a configuration error, not retried).
absl::Status CheckFlagNames(int argc, char** argv);

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_FLAG_ENV_H_
