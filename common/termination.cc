#include "common/termination.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>

namespace monsoon::common {
namespace {

// The handler can reach only process-wide state; TerminationWatcher sets it
// before installing the handler and clears it after restoring the default.
std::atomic<int> g_signal_pipe{-1};

void OnSignal(int sig) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  const int fd = g_signal_pipe.load();
  if (fd >= 0) {
    [[maybe_unused]] ssize_t n = ::write(fd, &byte, 1);
  }
  errno = saved_errno;
}

}  // namespace

TerminationWatcher::TerminationWatcher() {
  if (::pipe(pipe_) != 0) {
    pipe_[0] = pipe_[1] = -1;
    return;  // signals keep their default action: the process just exits
  }
  g_signal_pipe.store(pipe_[1]);
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  thread_ = std::thread([this] {
    unsigned char byte = 0;
    ssize_t n;
    do {
      n = ::read(pipe_[0], &byte, 1);
    } while (n < 0 && errno == EINTR);
    // Byte 0 comes from the destructor: no signal.
    if (n == 1 && byte != 0) {
      signal_.store(byte);
      terminated_.Notify();
    }
  });
}

TerminationWatcher::~TerminationWatcher() {
  if (pipe_[1] < 0) return;
  ::signal(SIGTERM, SIG_DFL);
  ::signal(SIGINT, SIG_DFL);
  g_signal_pipe.store(-1);
  const unsigned char wake = 0;
  [[maybe_unused]] ssize_t n = ::write(pipe_[1], &wake, 1);
  thread_.join();
  ::close(pipe_[0]);
  ::close(pipe_[1]);
}

}  // namespace monsoon::common
