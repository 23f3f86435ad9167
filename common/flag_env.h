// Flags from the environment: MONSOON_<FLAG NAME IN UPPER CASE> sets a flag's
// value before the command line is parsed, so that containers can pass
// everything as environment variables and a command-line flag still wins.
// Call from main() only, before absl::ParseCommandLine. Not thread-safe.
#ifndef MONSOON_COMMON_FLAG_ENV_H_
#define MONSOON_COMMON_FLAG_ENV_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace monsoon::common {

// Sets every flag of this program that a MONSOON_<NAME> variable names (NAME
// is the flag's name in upper case; Abseil's own flags such as --help are
// left out). Returns the MONSOON_ variables that name no flag, sorted, for
// the caller to warn about: usually a flag renamed since the variable was
// set, or a typo. INVALID_ARGUMENT names a variable whose value does not
// parse.
absl::StatusOr<std::vector<std::string>> ApplyFlagEnvironment();

// ApplyFlagEnvironment for a daemon's main(): logs a warning, prefixed with
// `program`, for each variable that names no flag.
absl::Status ApplyFlagEnvironmentAndWarn(absl::string_view program);

// INVALID_ARGUMENT naming the first command-line argument that looks like a
// flag (--name or --name=value; --noname for booleans) but names no defined
// flag. Abseil's parser exits with code 1 on those; daemons call this first
// so that they can exit with code 2 (a configuration error, not retried).
absl::Status CheckFlagNames(int argc, char** argv);

// Makes --help (and --helpshort) list the flags defined in `main_file` and
// in the libraries every daemon shares (common/log.cc: --log_format), and
// in `also` (paths relative to the workspace, such as
// "tools/config_flags.cc"). Call from main() before parsing.
void ShowFlagsInHelp(const std::string& main_file,
                     const std::vector<std::string>& also = {});

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_FLAG_ENV_H_
