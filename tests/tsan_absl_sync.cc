// ThreadSanitizer support for tests (bazel test --config=tsan): makes the
// synchronization of the system's Abseil visible to TSAN.
//
// Debian's libabsl_synchronization.so is not built with -fsanitize=thread,
// so TSAN does not see absl::Mutex, absl::CondVar, absl::Notification or
// absl::BlockingCounter synchronize anything, and reports every access to
// data they guard (ShardState, the update rules, and gRPC's own state, since
// gRPC's gpr_mu is an absl::Mutex) as a race. This file interposes those
// classes' out-of-line methods: each wrapper tells TSAN what the real one
// does (lock, unlock, release, acquire) and calls the real one, found with
// dlsym(RTLD_NEXT). Abseil's calls to itself go through the PLT as well, so
// a thread-local depth keeps nested calls from being annotated twice.
//
// Without -fsanitize=thread this file compiles to nothing. It must be linked
// into the test executable itself (linkstatic, alwayslink), whose symbols
// come first in the dynamic linker's search order. The other half of the
// TSAN support is tsan_suppressions.txt, for what still cannot be seen:
// gRPC's own hand-offs between threads.

#if defined(__SANITIZE_THREAD__)
#define MONSOON_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MONSOON_TSAN 1
#endif
#endif

#ifdef MONSOON_TSAN

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

#define MONSOON_STRINGIZE_INNER(x) #x
#define MONSOON_STRINGIZE(x) MONSOON_STRINGIZE_INNER(x)

// The real function whose mangled name is _ZN4absl<ns>`suffix` (or
// _ZNK4absl<ns>`suffix` for a const method).
void* RealSymbol(const char* head, const char* suffix) {
  const char* ns = MONSOON_STRINGIZE(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name = std::string(head) + "4absl" +
                           std::to_string(std::strlen(ns)) + ns + suffix;
  void* real = dlsym(RTLD_NEXT, name.c_str());
  if (real == nullptr) {
    std::fprintf(stderr, "tsan_absl_sync: no symbol %s\n", name.c_str());
    std::abort();
  }
  return real;
}

template <typename F>
F Real(const char* suffix) {
  return reinterpret_cast<F>(RealSymbol("_ZN", suffix));
}
template <typename F>
F RealConst(const char* suffix) {
  return reinterpret_cast<F>(RealSymbol("_ZNK", suffix));
}

// Only the outermost wrapper on a thread annotates.
thread_local int depth = 0;
class Outermost {
 public:
  Outermost() : outer_(depth++ == 0) {}
  ~Outermost() { --depth; }
  explicit operator bool() const { return outer_; }

 private:
  const bool outer_;
};

void PreLock(void* mu, unsigned flags) { __tsan_mutex_pre_lock(mu, flags); }
void PostLock(void* mu, unsigned flags) {
  __tsan_mutex_post_lock(mu, flags, 0);
}
void PreUnlock(void* mu, unsigned flags) { __tsan_mutex_pre_unlock(mu, flags); }
void PostUnlock(void* mu, unsigned flags) {
  __tsan_mutex_post_unlock(mu, flags);
}

// What Notification's inline HasBeenNotified() loads with acquire order.
struct NotificationLayout {
  absl::Mutex mutex;
  std::atomic<bool> notified_yet;
};
static_assert(sizeof(NotificationLayout) == sizeof(absl::Notification),
              "absl::Notification's layout changed");

void* NotifiedFlag(const absl::Notification* n) {
  return const_cast<char*>(reinterpret_cast<const char*>(n)) +
         offsetof(NotificationLayout, notified_yet);
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

// Mutex: exclusive and shared locking.

void Mutex::Lock() {
  static const auto real = Real<void (*)(Mutex*)>("5Mutex4LockEv");
  Outermost outer;
  if (outer) PreLock(this, 0);
  real(this);
  if (outer) PostLock(this, 0);
}

void Mutex::Unlock() {
  static const auto real = Real<void (*)(Mutex*)>("5Mutex6UnlockEv");
  Outermost outer;
  if (outer) PreUnlock(this, 0);
  real(this);
  if (outer) PostUnlock(this, 0);
}

bool Mutex::TryLock() {
  static const auto real = Real<bool (*)(Mutex*)>("5Mutex7TryLockEv");
  Outermost outer;
  if (outer) PreLock(this, __tsan_mutex_try_lock);
  const bool locked = real(this);
  if (outer) {
    PostLock(this, locked
                       ? __tsan_mutex_try_lock
                       : __tsan_mutex_try_lock | __tsan_mutex_try_lock_failed);
  }
  return locked;
}

void Mutex::ReaderLock() {
  static const auto real = Real<void (*)(Mutex*)>("5Mutex10ReaderLockEv");
  Outermost outer;
  if (outer) PreLock(this, __tsan_mutex_read_lock);
  real(this);
  if (outer) PostLock(this, __tsan_mutex_read_lock);
}

void Mutex::ReaderUnlock() {
  static const auto real = Real<void (*)(Mutex*)>("5Mutex12ReaderUnlockEv");
  Outermost outer;
  if (outer) PreUnlock(this, __tsan_mutex_read_lock);
  real(this);
  if (outer) PostUnlock(this, __tsan_mutex_read_lock);
}

bool Mutex::ReaderTryLock() {
  static const auto real = Real<bool (*)(Mutex*)>("5Mutex13ReaderTryLockEv");
  const unsigned flags = __tsan_mutex_read_lock | __tsan_mutex_try_lock;
  Outermost outer;
  if (outer) PreLock(this, flags);
  const bool locked = real(this);
  if (outer) {
    PostLock(this, locked ? flags : flags | __tsan_mutex_try_lock_failed);
  }
  return locked;
}

// Mutex: conditional locking. These return holding the lock whatever they
// return.

void Mutex::LockWhen(const Condition& cond) {
  static const auto real = Real<void (*)(Mutex*, const Condition&)>(
      "5Mutex8LockWhenERKNS0_9ConditionE");
  Outermost outer;
  if (outer) PreLock(this, 0);
  real(this, cond);
  if (outer) PostLock(this, 0);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  static const auto real = Real<void (*)(Mutex*, const Condition&)>(
      "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Outermost outer;
  if (outer) PreLock(this, __tsan_mutex_read_lock);
  real(this, cond);
  if (outer) PostLock(this, __tsan_mutex_read_lock);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  static const auto real =
      Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
          "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Outermost outer;
  if (outer) PreLock(this, 0);
  const bool result = real(this, cond, timeout);
  if (outer) PostLock(this, 0);
  return result;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Outermost outer;
  if (outer) PreLock(this, 0);
  const bool result = real(this, cond, deadline);
  if (outer) PostLock(this, 0);
  return result;
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond,
                                      absl::Duration timeout) {
  static const auto real =
      Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
          "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Outermost outer;
  if (outer) PreLock(this, __tsan_mutex_read_lock);
  const bool result = real(this, cond, timeout);
  if (outer) PostLock(this, __tsan_mutex_read_lock);
  return result;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond,
                                       absl::Time deadline) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Outermost outer;
  if (outer) PreLock(this, __tsan_mutex_read_lock);
  const bool result = real(this, cond, deadline);
  if (outer) PostLock(this, __tsan_mutex_read_lock);
  return result;
}

// Mutex: waiting while holding the lock, which Await may release and take
// again: modelled as an unlock followed by a lock. (Only exclusive holders
// are modelled; a reader that awaits is treated alike.)

void Mutex::Await(const Condition& cond) {
  static const auto real = Real<void (*)(Mutex*, const Condition&)>(
      "5Mutex5AwaitERKNS0_9ConditionE");
  Outermost outer;
  if (outer) {
    PreUnlock(this, 0);
    PostUnlock(this, 0);
  }
  real(this, cond);
  if (outer) {
    PreLock(this, 0);
    PostLock(this, 0);
  }
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  static const auto real =
      Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
          "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Outermost outer;
  if (outer) {
    PreUnlock(this, 0);
    PostUnlock(this, 0);
  }
  const bool result = real(this, cond, timeout);
  if (outer) {
    PreLock(this, 0);
    PostLock(this, 0);
  }
  return result;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Outermost outer;
  if (outer) {
    PreUnlock(this, 0);
    PostUnlock(this, 0);
  }
  const bool result = real(this, cond, deadline);
  if (outer) {
    PreLock(this, 0);
    PostLock(this, 0);
  }
  return result;
}

// CondVar: Wait releases `mu` and takes it again. Signal also releases the
// condition variable itself, for signallers that do not hold the mutex.

void CondVar::Wait(Mutex* mu) {
  static const auto real =
      Real<void (*)(CondVar*, Mutex*)>("7CondVar4WaitEPNS0_5MutexE");
  Outermost outer;
  if (outer) {
    PreUnlock(mu, 0);
    PostUnlock(mu, 0);
  }
  real(this, mu);
  if (outer) {
    PreLock(mu, 0);
    PostLock(mu, 0);
    __tsan_acquire(this);
  }
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  static const auto real = Real<bool (*)(CondVar*, Mutex*, absl::Duration)>(
      "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Outermost outer;
  if (outer) {
    PreUnlock(mu, 0);
    PostUnlock(mu, 0);
  }
  const bool result = real(this, mu, timeout);
  if (outer) {
    PreLock(mu, 0);
    PostLock(mu, 0);
    __tsan_acquire(this);
  }
  return result;
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  static const auto real = Real<bool (*)(CondVar*, Mutex*, absl::Time)>(
      "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Outermost outer;
  if (outer) {
    PreUnlock(mu, 0);
    PostUnlock(mu, 0);
  }
  const bool result = real(this, mu, deadline);
  if (outer) {
    PreLock(mu, 0);
    PostLock(mu, 0);
    __tsan_acquire(this);
  }
  return result;
}

void CondVar::Signal() {
  static const auto real = Real<void (*)(CondVar*)>("7CondVar6SignalEv");
  Outermost outer;
  if (outer) __tsan_release(this);
  real(this);
}

void CondVar::SignalAll() {
  static const auto real = Real<void (*)(CondVar*)>("7CondVar9SignalAllEv");
  Outermost outer;
  if (outer) __tsan_release(this);
  real(this);
}

// Notification: Notify releases; the waits acquire once notified. The inline
// HasBeenNotified() is an instrumented acquire load of notified_yet_, so
// Notify also releases at that address.

void Notification::Notify() {
  static const auto real =
      Real<void (*)(Notification*)>("12Notification6NotifyEv");
  Outermost outer;
  if (outer) {
    __tsan_release(this);
    __tsan_release(NotifiedFlag(this));
  }
  real(this);
}

void Notification::WaitForNotification() const {
  static const auto real = RealConst<void (*)(const Notification*)>(
      "12Notification19WaitForNotificationEv");
  Outermost outer;
  real(this);
  if (outer) __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(
    absl::Duration timeout) const {
  static const auto real =
      RealConst<bool (*)(const Notification*, absl::Duration)>(
          "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  Outermost outer;
  const bool notified = real(this, timeout);
  if (outer && notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(absl::Time deadline) const {
  static const auto real = RealConst<bool (*)(const Notification*, absl::Time)>(
      "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  Outermost outer;
  const bool notified = real(this, deadline);
  if (outer && notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

// BlockingCounter: each decrement releases; Wait acquires them all.

bool BlockingCounter::DecrementCount() {
  static const auto real =
      Real<bool (*)(BlockingCounter*)>("15BlockingCounter14DecrementCountEv");
  Outermost outer;
  if (outer) __tsan_release(this);
  return real(this);
}

void BlockingCounter::Wait() {
  static const auto real =
      Real<void (*)(BlockingCounter*)>("15BlockingCounter4WaitEv");
  Outermost outer;
  real(this);
  if (outer) __tsan_acquire(this);
}

ABSL_NAMESPACE_END
}  // namespace absl

#endif  // MONSOON_TSAN
