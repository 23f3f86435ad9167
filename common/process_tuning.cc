#include "common/process_tuning.h"

#include <malloc.h>
#include <sys/resource.h>

#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "common/accept_guard.h"

namespace monsoon::common {

void KeepFreedMemory() {
  // Blocks below this come from the heap, not from mmap (32 MiB is glibc's
  // largest dynamic threshold; setting it also stops glibc moving it).
  constexpr int kMmapThreshold = 32 << 20;
  // Free memory at a heap's top stays mapped up to this much.
  constexpr int kTrimThreshold = 256 << 20;
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) {
    mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
  }
  if (std::getenv("MALLOC_TRIM_THRESHOLD_") == nullptr) {
    mallopt(M_TRIM_THRESHOLD, kTrimThreshold);
  }
}

void TuneProcess() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  KeepFreedMemory();
  // As many files as the system lets this process have.
  rlimit files;
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 &&
      files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  // Whatever the limit, accepting never uses it up (common/accept_guard.h).
  ArmAcceptGuard();
}

}  // namespace monsoon::common
