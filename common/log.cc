#include "common/log.h"

#include <unistd.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace monsoon::common {

void LogLine(const std::string& message) {
  std::string line =
      absl::FormatTime("%H:%M:%E3S ", absl::Now(), absl::LocalTimeZone());
  line += message;
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
