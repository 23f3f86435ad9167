// RunningTime: a stopwatch for a test's "this took less than X" that does
// not count time the test's process did not run (a SIGSTOP, a paused or
// migrated machine), which no bound survives. A thread notes the time every
// 20 ms; a gap of over a second between two notes counts as not run.
// Test-only.
#ifndef MONSOON_TESTS_RUNNING_TIME_H_
#define MONSOON_TESTS_RUNNING_TIME_H_

#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace monsoon::testutil {

class RunningTime {
 public:
  RunningTime()
      : start_(absl::Now()), last_(start_), thread_([this] {
          while (!done_.WaitForNotificationWithTimeout(kEvery)) {
            absl::MutexLock lock(&mu_);
            NoteLocked(absl::Now());
          }
        }) {}
  ~RunningTime() {
    done_.Notify();
    thread_.join();
  }
  RunningTime(const RunningTime&) = delete;
  RunningTime& operator=(const RunningTime&) = delete;

  // The time since construction, less the time the process did not run.
  absl::Duration Elapsed() {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    NoteLocked(now);
    return now - start_ - stopped_;
  }

 private:
  static constexpr absl::Duration kEvery = absl::Milliseconds(20);

  void NoteLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (now - last_ > absl::Seconds(1)) stopped_ += now - last_ - kEvery;
    last_ = now;
  }

  const absl::Time start_;
  absl::Mutex mu_;
  absl::Time last_ ABSL_GUARDED_BY(mu_);
  absl::Duration stopped_ ABSL_GUARDED_BY(mu_);
  absl::Notification done_;
  std::thread thread_;  // last: starts once the rest is set
};

}  // namespace monsoon::testutil

#endif  // MONSOON_TESTS_RUNNING_TIME_H_
