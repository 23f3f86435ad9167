#include "common/termination.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

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

SignalPipeWatch::SignalPipeWatch(int read_fd, int write_fd,
                                 std::vector<int> signals)
    : read_fd_(read_fd), write_fd_(write_fd), signals_(std::move(signals)) {
  if (read_fd_ < 0) return;
  thread_ = std::thread([this] { Run(); });
}

SignalPipeWatch::~SignalPipeWatch() {
  if (!thread_.joinable()) return;
  const unsigned char stop = 0;
  while (::write(write_fd_, &stop, 1) < 0) {
    if (errno == EAGAIN) {  // a full pipe (a non-blocking end): wait a turn
      pollfd room = {write_fd_, POLLOUT, 0};
      ::poll(&room, 1, 10);
    } else if (errno != EINTR) {
      break;
    }
  }
  thread_.join();
}

void SignalPipeWatch::Run() {
  for (;;) {
    unsigned char byte = 0;
    const ssize_t n = ::read(read_fd_, &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {  // a non-blocking end: wait for a byte
      pollfd ready = {read_fd_, POLLIN, 0};
      ::poll(&ready, 1, -1);
      continue;
    }
    // Byte 0 comes from the destructor: no signal.
    if (n != 1 || byte == 0) return;
    if (!notified_.HasBeenNotified() &&
        std::find(signals_.begin(), signals_.end(), byte) != signals_.end()) {
      signal_.store(byte);
      notified_.Notify();
    }
  }
}

TerminationWatcher::TerminationWatcher() {
  if (::pipe(pipe_) != 0) {
    pipe_[0] = pipe_[1] = -1;
    // Nothing watched: signals keep their default action, the process just
    // exits.
    watch_ = std::make_unique<SignalPipeWatch>(-1, -1, std::vector<int>());
    return;
  }
  watch_ = std::make_unique<SignalPipeWatch>(pipe_[0], pipe_[1],
                                             std::vector<int>{SIGTERM, SIGINT});
  g_signal_pipe.store(pipe_[1]);
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

TerminationWatcher::~TerminationWatcher() {
  if (pipe_[1] >= 0) {
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGINT, SIG_DFL);
    g_signal_pipe.store(-1);
  }
  watch_.reset();
  if (pipe_[1] >= 0) {
    ::close(pipe_[0]);
    ::close(pipe_[1]);
  }
}

}  // namespace monsoon::common
