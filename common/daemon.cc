#include "common/daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/flag_env.h"
#include "common/log.h"
#include "common/process_tuning.h"

namespace monsoon::common {
namespace {

// strerror's text for `error`, from any thread.
std::string ErrnoText(int error) {
  char buffer[256];
  return strerror_r(error, buffer, sizeof(buffer));  // GNU: may not use buffer
}

// Writes all of `contents` to `fd`; false with errno set when it cannot.
bool WriteAll(int fd, absl::string_view contents) {
  while (!contents.empty()) {
    const ssize_t n = write(fd, contents.data(), contents.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    contents.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

int Fail(absl::string_view program, int code, const absl::Status& status) {
  LogError("%s: %s", program, status.ToString());
  return code;
}

int Fail(absl::string_view program, int code, absl::string_view message) {
  LogError("%s: %s", program, message);
  return code;
}

absl::Status StartDaemon(const DaemonInfo& info, int argc, char** argv,
                         std::unique_ptr<TerminationWatcher>* termination) {
  if (info.tune_process) TuneProcess();
  absl::SetProgramUsageMessage(info.usage);
  if (termination != nullptr) {
    *termination = std::make_unique<TerminationWatcher>();
  }
  if (absl::Status env = ApplyFlagEnvironmentAndWarn(info.program); !env.ok()) {
    return env;
  }
  if (absl::Status names = CheckFlagNames(argc, argv); !names.ok()) {
    return names;
  }
  ShowFlagsInHelp(info.main_file, info.more_flag_files);
  absl::ParseCommandLine(argc, argv);
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents) {
  const std::string tmp = path + ".tmp";
  // The mode std::ofstream creates files with (less the umask).
  const int fd =
      open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) {
    const int error = errno;
    return absl::InternalError(
        absl::StrCat("cannot write ", tmp, ": ", ErrnoText(error)));
  }
  int error = WriteAll(fd, contents) ? 0 : errno;
  // close() may report a write that failed late (a full disk over NFS).
  if (close(fd) != 0 && error == 0) error = errno;
  if (error != 0) {
    unlink(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("cannot write ", tmp, ": ", ErrnoText(error)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    error = errno;  // before unlink() sets it
    unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path,
                                            ": ", ErrnoText(error)));
  }
  return absl::OkStatus();
}

}  // namespace monsoon::common
