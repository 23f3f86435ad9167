#include "common/flag_env.h"

#include <cstdlib>
#include <string>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace monsoon::common {

absl::Status ApplyFlagEnvironment(
    std::initializer_list<absl::string_view> flags) {
  for (absl::string_view name : flags) {
    const std::string variable =
        absl::StrCat("MONSOON_", absl::AsciiStrToUpper(name));
    const char* value = std::getenv(variable.c_str());
    if (value == nullptr) continue;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) {
      return absl::InternalError(absl::StrCat("no flag --", name));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "environment variable ", variable, "='", value, "': ", error));
    }
  }
  return absl::OkStatus();
}

}  // namespace monsoon::common
