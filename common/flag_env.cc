#include "common/flag_env.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <string>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
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

absl::Status CheckFlagNames(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;  // the rest are positional
    if (arg.size() < 2 || arg[0] != '-') continue;
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    const absl::string_view name = arg.substr(0, arg.find('='));
    // Abseil's own flags, handled by its parser rather than registered.
    static constexpr absl::string_view kBuiltIn[] = {
        "help",     "helpfull",  "helpshort",  "helppackage",
        "helpon",   "helpmatch", "version",    "only_check_args",
        "flagfile", "fromenv",   "tryfromenv", "undefok"};
    if (std::find(std::begin(kBuiltIn), std::end(kBuiltIn), name) !=
        std::end(kBuiltIn)) {
      continue;
    }
    if (absl::FindCommandLineFlag(name) != nullptr) continue;
    if (absl::StartsWith(name, "no") &&
        absl::FindCommandLineFlag(name.substr(2)) != nullptr) {
      continue;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("unknown flag '", argv[i], "' (--help lists the flags)"));
  }
  return absl::OkStatus();
}

}  // namespace monsoon::common
