// TerminationWatcher turns SIGTERM and SIGINT into an absl::Notification that
// a daemon's main thread waits on, so that shutdown runs as ordinary code
// rather than inside a signal handler.
//
// The signal handler only writes the signal number to a pipe (which is
// async-signal-safe), whichever thread the kernel picks to run it; the
// watcher's own thread reads the pipe. Libraries that start threads before
// main() (OpenBLAS does) therefore cannot swallow the signal. At most one
// watcher may exist at a time, since handlers are process-wide; construct it
// in main(). Thread-safe.
#ifndef MONSOON_COMMON_TERMINATION_H_
#define MONSOON_COMMON_TERMINATION_H_

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"

namespace monsoon::common {

class TerminationWatcher {
 public:
  TerminationWatcher();
  ~TerminationWatcher();  // joins the watcher thread
  TerminationWatcher(const TerminationWatcher&) = delete;
  TerminationWatcher& operator=(const TerminationWatcher&) = delete;

  // Notified when SIGTERM or SIGINT arrives.
  const absl::Notification& terminated() const { return terminated_; }
  // The signal received (0 until then).
  int signal() const { return signal_.load(); }

 private:
  absl::Notification terminated_;
  std::atomic<int> signal_{0};
  int pipe_[2] = {-1, -1};  // [0] read by thread_, [1] written by the handler
  std::thread thread_;
};

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_TERMINATION_H_
