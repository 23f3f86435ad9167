// Timestamped log lines on stderr, one write per line so that lines from
// several threads never interleave. Thread-safe.
#ifndef MONSOON_COMMON_LOG_H_
#define MONSOON_COMMON_LOG_H_

#include <string>

#include "absl/strings/str_format.h"

namespace monsoon::common {

// Writes "HH:MM:SS.mmm message\n" to stderr.
void LogLine(const std::string& message);

template <typename... Args>
void Log(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(absl::StrFormat(format, args...));
}

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_LOG_H_
