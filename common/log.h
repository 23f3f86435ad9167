// Log lines on stderr, one write per line so that lines from several
// threads never interleave. Each line has a date and time (UTC, to the
// millisecond) and a level; --log_format=json (a flag of every binary that
// logs) makes each line one JSON object instead (LogRecord in
// proto/log.proto: time, level, message), for log collectors. Thread-safe.
#ifndef MONSOON_COMMON_LOG_H_
#define MONSOON_COMMON_LOG_H_

#include <string>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace monsoon::common {

enum class LogLevel { kInfo, kWarning, kError };
enum class LogFormat { kText, kJson };

// Text: "2026-11-23T22:51:07.123Z INFO message"; JSON:
// {"time":"2026-11-23T22:51:07.123Z","level":"INFO","message":"message"}.
// Without the newline.
std::string FormatLogLine(LogFormat format, LogLevel level, absl::Time time,
                          absl::string_view message);

// Writes `message` at `level` in --log_format's format, with a newline.
void LogLine(LogLevel level, absl::string_view message);
inline void LogLine(absl::string_view message) {
  LogLine(LogLevel::kInfo, message);
}

template <typename... Args>
void Log(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(LogLevel::kInfo, absl::StrFormat(format, args...));
}
// Something went wrong that the daemon rides out (a lost shard, a
// refused registration, an ignored setting).
template <typename... Args>
void LogWarning(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(LogLevel::kWarning, absl::StrFormat(format, args...));
}
// Something failed: the daemon stops, or work was lost or refused.
template <typename... Args>
void LogError(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(LogLevel::kError, absl::StrFormat(format, args...));
}

// --log_format's value (launchers pass it on to their daemons).
LogFormat CurrentLogFormat();

// For the flag: "text" or "json".
bool AbslParseFlag(absl::string_view text, LogFormat* format,
                   std::string* error);
std::string AbslUnparseFlag(LogFormat format);

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_LOG_H_
