#include "common/accept_guard.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>

#include "common/log.h"

namespace monsoon::common {
namespace {

using AcceptFn = int (*)(int, sockaddr*, socklen_t*, int);

AcceptFn RealAccept4() {
  static const AcceptFn real =
      reinterpret_cast<AcceptFn>(dlsym(RTLD_NEXT, "accept4"));
  return real;
}

// 0: not armed. Otherwise the lowest descriptor number that is shed: the
// kernel hands out the lowest free number, so a new connection's number is
// at least the count of descriptors open below it.
std::atomic<int> shed_from{0};
std::atomic<int> spare_fd{-1};
std::atomic<int64_t> shed{0};
std::atomic<int64_t> last_log_ms{0};

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void NoteShed(const char* why) {
  const int64_t total = shed.fetch_add(1, std::memory_order_relaxed) + 1;
  const int64_t now = NowMs();
  int64_t last = last_log_ms.load(std::memory_order_relaxed);
  if (now - last < 10000 || !last_log_ms.compare_exchange_strong(
                                last, now, std::memory_order_relaxed)) {
    return;
  }
  LogWarning(
      "closed an incoming connection at once (%s; %d so far): this process "
      "has %d descriptors open of its limit of %d. Raise the limit (ulimit "
      "-n, a container's --ulimit nofile) or connect fewer clients; the "
      "server goes on serving",
      why, total, OpenFileDescriptors(), FileDescriptorLimit());
}

// Takes one pending connection with the spare descriptor and closes it.
// False when there was none to take (the backlog is empty) or the spare is
// gone.
bool ShedWithSpare(int listener, int flags) {
  const int spare = spare_fd.exchange(-1);
  if (spare < 0) return false;
  ::close(spare);
  const int conn = RealAccept4()(listener, nullptr, nullptr, flags);
  const int saved = errno;
  if (conn >= 0) ::close(conn);
  spare_fd.store(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  errno = saved;
  if (conn < 0) return false;
  NoteShed("out of file descriptors");
  return true;
}

}  // namespace

void ArmAcceptGuard(int reserve) {
  const int64_t limit = FileDescriptorLimit();
  if (limit <= 0) return;
  const int64_t from = std::max<int64_t>(limit - std::max(reserve, 0),
                                         std::min<int64_t>(limit, 16));
  if (spare_fd.load() < 0) {
    spare_fd.store(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  }
  shed_from.store(static_cast<int>(std::min<int64_t>(from, 1 << 30)));
}

int64_t ConnectionsShed() { return shed.load(std::memory_order_relaxed); }

int64_t OpenFileDescriptors() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int64_t count = 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  ::closedir(dir);
  return count - 1;  // the directory's own descriptor
}

int64_t FileDescriptorLimit() {
  rlimit limit;
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return -1;
  if (limit.rlim_cur == RLIM_INFINITY) return int64_t{1} << 30;
  return static_cast<int64_t>(limit.rlim_cur);
}

}  // namespace monsoon::common

extern "C" int accept4(int listener, sockaddr* address, socklen_t* length,
                       int flags) {
  using namespace monsoon::common;
  const AcceptFn real = RealAccept4();
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  const int from = shed_from.load(std::memory_order_relaxed);
  if (from == 0) return real(listener, address, length, flags);
  // Until a connection is returned or the backlog is empty (EAGAIN): the
  // listener's readiness is edge-triggered, so a connection left behind
  // would wait for the next one to arrive. The backlog is bounded
  // (somaxconn), and so is this loop.
  while (true) {
    const int conn = real(listener, address, length, flags);
    if (conn >= 0) {
      if (conn < from) return conn;
      ::close(conn);
      NoteShed("near the file limit");
      continue;
    }
    if (errno != EMFILE && errno != ENFILE) return -1;
    if (!ShedWithSpare(listener, flags)) {
      errno = EAGAIN;
      return -1;
    }
  }
}
