#include "tools/delay_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace monsoon::tools {
namespace {

absl::StatusOr<sockaddr_in> ParseAddress(const std::string& text) {
  const size_t colon = text.rfind(':');
  int port = -1;
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(text.substr(colon + 1), &port) || port < 0 ||
      port > 65535 ||
      inet_pton(AF_INET, text.substr(0, colon).c_str(), &address.sin_addr) !=
          1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text, "' is not IPv4 HOST:PORT with a port from 0 to 65535"));
  }
  address.sin_port = htons(static_cast<uint16_t>(port));
  return address;
}

// One direction of one connection: a reader stamps what it reads, a writer
// sends each chunk once its time has come.
class Pipe {
 public:
  Pipe(int from, int to, absl::Duration delay, std::atomic<bool>* stopping)
      : from_(from), to_(to), delay_(delay), stopping_(stopping) {}

  void Read() {
    std::vector<char> buffer(1 << 16);
    while (!stopping_->load()) {
      pollfd p{from_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = read(from_, buffer.data(), buffer.size());
      if (n <= 0) {
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        break;
      }
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({absl::Now() + delay_,
                        std::string(buffer.data(), static_cast<size_t>(n))});
      ready_.notify_one();
    }
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    ready_.notify_one();
  }

  void Write() {
    while (!stopping_->load()) {
      std::pair<absl::Time, std::string> chunk;
      {
        // A std::condition_variable: ThreadSanitizer sees it synchronize,
        // unlike the system Abseil's (uninstrumented) conditions.
        std::unique_lock<std::mutex> lock(mu_);
        ready_.wait_for(lock, std::chrono::milliseconds(100),
                        [this] { return !queue_.empty() || closed_; });
        if (queue_.empty()) {
          if (closed_) break;
          continue;
        }
        chunk = std::move(queue_.front());
        queue_.pop_front();
      }
      const absl::Duration wait = chunk.first - absl::Now();
      if (wait > absl::ZeroDuration()) absl::SleepFor(wait);
      const char* data = chunk.second.data();
      size_t left = chunk.second.size();
      while (left > 0 && !stopping_->load()) {
        const ssize_t n = write(to_, data, left);
        if (n > 0) {
          data += n;
          left -= static_cast<size_t>(n);
        } else if (n < 0 && errno != EINTR && errno != EAGAIN) {
          left = 0;
          stopping_->store(true);  // the peer is gone: end the connection
        }
      }
    }
    // What was read has been written: pass the end of stream on.
    shutdown(to_, SHUT_WR);
  }

 private:
  const int from_;
  const int to_;
  const absl::Duration delay_;
  std::atomic<bool>* const stopping_;
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::pair<absl::Time, std::string>> queue_;  // guarded by mu_
  bool closed_ = false;                                   // guarded by mu_
};

class DelayProxyImpl : public DelayProxy {
 public:
  DelayProxyImpl(int listen_fd, int port, sockaddr_in target,
                 absl::Duration delay)
      : listen_fd_(listen_fd), port_(port), target_(target), delay_(delay) {
    acceptor_ = std::thread([this] { Accept(); });
  }

  ~DelayProxyImpl() override {
    stopping_.store(true);
    acceptor_.join();
    close(listen_fd_);
    std::vector<std::thread> threads;
    {
      absl::MutexLock lock(&mu_);
      threads = std::move(threads_);
    }
    for (std::thread& thread : threads) thread.join();
    absl::MutexLock lock(&mu_);
    for (int fd : fds_) close(fd);
  }

  int port() const override { return port_; }

 private:
  void Accept() {
    while (!stopping_.load()) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      const int client = accept(listen_fd_, nullptr, nullptr);
      if (client < 0) continue;
      const int server = socket(AF_INET, SOCK_STREAM, 0);
      if (server < 0 ||
          connect(server, reinterpret_cast<const sockaddr*>(&target_),
                  sizeof(target_)) != 0) {
        // The target refuses: so does the proxy, by closing at once.
        if (server >= 0) close(server);
        close(client);
        continue;
      }
      const int one = 1;
      setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      absl::MutexLock lock(&mu_);
      fds_.push_back(client);
      fds_.push_back(server);
      for (auto [from, to] :
           {std::pair(client, server), std::pair(server, client)}) {
        pipes_.push_back(std::make_unique<Pipe>(from, to, delay_, &stopping_));
        Pipe* pipe = pipes_.back().get();
        threads_.emplace_back([pipe] { pipe->Read(); });
        threads_.emplace_back([pipe] { pipe->Write(); });
      }
    }
  }

  const int listen_fd_;
  const int port_;
  const sockaddr_in target_;
  const absl::Duration delay_;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Pipe>> pipes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<DelayProxy>> DelayProxy::Start(
    const std::string& listen, const std::string& target,
    absl::Duration delay) {
  if (delay < absl::ZeroDuration() || delay > absl::Seconds(10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "delay must be from 0 to 10 s, got ", absl::FormatDuration(delay)));
  }
  absl::StatusOr<sockaddr_in> listen_address = ParseAddress(listen);
  if (!listen_address.ok()) return listen_address.status();
  absl::StatusOr<sockaddr_in> target_address = ParseAddress(target);
  if (!target_address.ok()) return target_address.status();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  socklen_t length = sizeof(*listen_address);
  if (fd < 0 ||
      bind(fd, reinterpret_cast<sockaddr*>(&*listen_address),
           sizeof(*listen_address)) != 0 ||
      ::listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&*listen_address), &length) !=
          0) {
    const int error = errno;
    if (fd >= 0) close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, ": ", std::strerror(error)));
  }
  return std::make_unique<DelayProxyImpl>(fd, ntohs(listen_address->sin_port),
                                          *target_address, delay);
}

}  // namespace monsoon::tools
