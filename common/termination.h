// TerminationWatcher turns SIGTERM and SIGINT into an absl::Notification that
// a daemon's main thread waits on, so that shutdown runs as ordinary code
// rather than inside a signal handler.
//
// The signal handler only writes the signal number to a pipe (which is
// async-signal-safe), whichever thread the kernel picks to run it; a
// SignalPipeWatch's own thread reads the pipe. Libraries that start threads
// before main() (OpenBLAS does) therefore cannot swallow the signal. At most
// one watcher may exist at a time, since handlers are process-wide;
// construct it in main(). Thread-safe.
#ifndef MONSOON_COMMON_TERMINATION_H_
#define MONSOON_COMMON_TERMINATION_H_

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"

namespace monsoon::common {

// Reads signal numbers, one byte each, from the pipe `read_fd` on a thread
// of its own and notifies notified() at the first that is one of
// `signals` (the others are read and dropped). The destructor writes byte 0
// to `write_fd`, which ends the thread. The pipe stays the caller's, and
// must outlive the watch. read_fd -1: nothing is watched. The pipe may be
// another's too: Python's wakeup fd (signal.set_wakeup_fd) carries the
// number of every signal with a Python handler. Thread-safe.
class SignalPipeWatch {
 public:
  SignalPipeWatch(int read_fd, int write_fd, std::vector<int> signals);
  ~SignalPipeWatch();
  SignalPipeWatch(const SignalPipeWatch&) = delete;
  SignalPipeWatch& operator=(const SignalPipeWatch&) = delete;

  const absl::Notification& notified() const { return notified_; }
  // The signal that notified; 0 before.
  int signal() const { return signal_.load(); }

 private:
  void Run();

  const int read_fd_;
  const int write_fd_;
  const std::vector<int> signals_;
  absl::Notification notified_;
  std::atomic<int> signal_{0};
  std::thread thread_;
};

class TerminationWatcher {
 public:
  TerminationWatcher();
  ~TerminationWatcher();  // joins the watch's thread
  TerminationWatcher(const TerminationWatcher&) = delete;
  TerminationWatcher& operator=(const TerminationWatcher&) = delete;

  // Notified when SIGTERM or SIGINT arrives.
  const absl::Notification& terminated() const { return watch_->notified(); }
  // The signal received (0 until then).
  int signal() const { return watch_->signal(); }

 private:
  // [0] read by the watch, [1] written by the handler; -1 when it could not
  // be made (the signals then keep their default action).
  int pipe_[2] = {-1, -1};
  std::unique_ptr<SignalPipeWatch> watch_;
};

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_TERMINATION_H_
