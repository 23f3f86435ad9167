// What every Monsoon daemon's main() shares: the exit codes that launchers
// and Kubernetes act on, the one way a main() gives up (Fail), the start of
// main() (StartDaemon: process tuning, usage, flags from the environment and
// the command line), and replacing a file so that a reader sees the old
// contents or the new, never half a file (WriteFileAtomically).
//
// StartDaemon is for main() only, before any thread of the program's own
// starts; the rest is thread-safe (WriteFileAtomically for different paths).
#ifndef MONSOON_COMMON_DAEMON_H_
#define MONSOON_COMMON_DAEMON_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/termination.h"

namespace monsoon::common {

// Exit codes. A configuration error (a bad flag, variable or config) is not
// worth restarting: launchers and Kubernetes Jobs tell it from a failure
// that a restart may cure.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitConfigError = 2;

// The exit code of a daemon that stops because of `signal` (SIGTERM,
// SIGINT), as a shell reports a process killed by it.
constexpr int ExitCodeForSignal(int signal) { return 128 + signal; }

// Logs "<program>: <status.ToString()>" as an error and returns `code`, for
// `return Fail(...)` in main().
int Fail(absl::string_view program, int code, const absl::Status& status);
// Logs "<program>: <message>" as an error and returns `code`.
int Fail(absl::string_view program, int code, absl::string_view message);

// Who a daemon is, for StartDaemon.
struct DaemonInfo {
  // Prefixes its log lines ("ps_server").
  std::string program;
  // What --help prints above the flags.
  std::string usage;
  // The file that defines its flags, relative to the workspace
  // ("server/ps_server_main.cc"), and other files whose flags --help lists
  // too ("worker/client_flags.cc"); see ShowFlagsInHelp.
  std::string main_file;
  std::vector<std::string> more_flag_files;
  // Whether to apply TuneProcess (common/process_tuning.h) first.
  bool tune_process = true;
};

// The start of a daemon's main(), in this order: TuneProcess (if
// info.tune_process), the usage message, a TerminationWatcher into
// `*termination` (if not null), flags from MONSOON_* variables (warning
// about variables that name no flag), a check that every command-line flag
// exists, --help's flag list, and the command line. Not OK (a variable that
// does not parse, a flag that does not exist) means a configuration error:
// return Fail(info.program, kExitConfigError, status). As
// absl::ParseCommandLine, exits the process for --help and for a bad value
// on the command line.
absl::Status StartDaemon(const DaemonInfo& info, int argc, char** argv,
                         std::unique_ptr<TerminationWatcher>* termination);

// Writes `contents` to PATH.tmp and renames it to `path`, so that a reader
// of `path` sees the old contents or the new, never part of them. Atomic for
// readers, not durable: there is no fsync. INTERNAL naming the file and the
// system's reason ("cannot write PATH.tmp: No such file or directory") when
// it fails; `path` is then as it was, and PATH.tmp is removed.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents);

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_DAEMON_H_
