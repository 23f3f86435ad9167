#include "common/flag_env.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <string>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"

extern "C" char** environ;

namespace monsoon::common {
namespace {

// Abseil's own flags, handled by its parser rather than by the program.
bool IsBuiltInFlag(absl::string_view name) {
  static constexpr absl::string_view kBuiltIn[] = {
      "help",     "helpfull",  "helpshort",  "helppackage",
      "helpon",   "helpmatch", "version",    "only_check_args",
      "flagfile", "fromenv",   "tryfromenv", "undefok"};
  return std::find(std::begin(kBuiltIn), std::end(kBuiltIn), name) !=
         std::end(kBuiltIn);
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ApplyFlagEnvironment() {
  constexpr absl::string_view kPrefix = "MONSOON_";
  std::vector<std::string> ignored;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const absl::string_view assignment = *entry;
    const size_t equals = assignment.find('=');
    if (equals == absl::string_view::npos ||
        !absl::StartsWith(assignment, kPrefix)) {
      continue;
    }
    const std::string variable(assignment.substr(0, equals));
    const std::string value(assignment.substr(equals + 1));
    const std::string name =
        absl::AsciiStrToLower(variable.substr(kPrefix.size()));
    absl::CommandLineFlag* flag =
        IsBuiltInFlag(name) ? nullptr : absl::FindCommandLineFlag(name);
    if (flag == nullptr) {
      ignored.push_back(variable);
      continue;
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "environment variable ", variable, "='", value, "': ", error));
    }
  }
  std::sort(ignored.begin(), ignored.end());
  return ignored;
}

absl::Status ApplyFlagEnvironmentAndWarn(absl::string_view program) {
  absl::StatusOr<std::vector<std::string>> ignored = ApplyFlagEnvironment();
  if (!ignored.ok()) return ignored.status();
  for (const std::string& variable : *ignored) {
    LogWarning(
        "%s: environment variable %s names no flag of %s; ignored "
        "(--help lists the flags)",
        program, variable, program);
  }
  return absl::OkStatus();
}

void ShowFlagsInHelp(const std::string& main_file,
                     const std::vector<std::string>& also) {
  std::vector<std::string> files = also;
  files.push_back(main_file);
  files.push_back("common/log.cc");
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [files](absl::string_view path) {
    for (const std::string& file : files) {
      if (absl::StrContains(path, file)) return true;
    }
    return false;
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
}

absl::Status CheckFlagNames(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;  // the rest are positional
    if (arg.size() < 2 || arg[0] != '-') continue;
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    const absl::string_view name = arg.substr(0, arg.find('='));
    if (IsBuiltInFlag(name)) continue;
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
