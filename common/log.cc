#include "common/log.h"

#include <unistd.h>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"
#include "proto/log.pb.h"

ABSL_FLAG(monsoon::common::LogFormat, log_format,
          monsoon::common::LogFormat::kText,
          "How log lines look on stderr: text (\"2026-11-23T22:51:07.123Z "
          "INFO shard 0: ...\") or json (one object per line with time, level "
          "and message, for log collectors).");

namespace monsoon::common {
namespace {

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kError:
      return "ERROR";
  }
  return "INFO";
}

}  // namespace

bool AbslParseFlag(absl::string_view text, LogFormat* format,
                   std::string* error) {
  if (text == "text") {
    *format = LogFormat::kText;
    return true;
  }
  if (text == "json") {
    *format = LogFormat::kJson;
    return true;
  }
  *error = "must be text or json";
  return false;
}

LogFormat CurrentLogFormat() { return absl::GetFlag(FLAGS_log_format); }

std::string AbslUnparseFlag(LogFormat format) {
  return format == LogFormat::kJson ? "json" : "text";
}

std::string FormatLogLine(LogFormat format, LogLevel level, absl::Time time,
                          absl::string_view message) {
  const std::string when =
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", time, absl::UTCTimeZone());
  if (format == LogFormat::kText) {
    return absl::StrCat(when, " ", LevelName(level), " ", message);
  }
  LogRecord record;
  record.set_time(when);
  record.set_level(LevelName(level));
  record.set_message(std::string(message));
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(record, &json, options)
           .ok()) {
    // Only for a message that is not UTF-8: the text line instead.
    return FormatLogLine(LogFormat::kText, level, time, message);
  }
  return json;
}

void LogLine(LogLevel level, absl::string_view message) {
  std::string line = FormatLogLine(absl::GetFlag(FLAGS_log_format), level,
                                   absl::Now(), message);
  line += '\n';
  // One write(2) per line: POSIX keeps it whole on a pipe up to PIPE_BUF,
  // and the launcher splits its children's output by line.
  size_t written = 0;
  while (written < line.size()) {
    ssize_t n =
        ::write(STDERR_FILENO, line.data() + written, line.size() - written);
    if (n <= 0) return;
    written += static_cast<size_t>(n);
  }
}

}  // namespace monsoon::common
