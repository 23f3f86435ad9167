#include "tests/tcp_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace monsoon::testutil {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  return address;
}

// Writes all of data[0, n), polling with a timeout so that a stop is seen.
bool WriteAll(int fd, const char* data, ssize_t n,
              const std::atomic<bool>& stopping) {
  while (n > 0 && !stopping.load()) {
    const ssize_t written = write(fd, data, static_cast<size_t>(n));
    if (written > 0) {
      data += written;
      n -= written;
    } else if (written < 0 && errno != EAGAIN && errno != EINTR) {
      return false;
    }
  }
  return n == 0;
}

}  // namespace

TcpProxy::TcpProxy(int target_port) : target_port_(target_port) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = Loopback(0);
  socklen_t length = sizeof(address);
  if (listen_fd_ < 0 ||
      bind(listen_fd_, reinterpret_cast<sockaddr*>(&address),
           sizeof(address)) != 0 ||
      listen(listen_fd_, 16) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) !=
          0) {
    ADD_FAILURE() << "TcpProxy cannot listen";
    return;
  }
  port_ = ntohs(address.sin_port);
  acceptor_ = std::thread([this] { Accept(); });
}

TcpProxy::~TcpProxy() {
  stopping_.store(true);
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> forwarders;
  {
    absl::MutexLock lock(&mu_);
    forwarders.swap(forwarders_);
  }
  for (std::thread& forwarder : forwarders) forwarder.join();
  if (listen_fd_ >= 0) close(listen_fd_);
}

std::string TcpProxy::address() const {
  return absl::StrCat("127.0.0.1:", port_);
}

void TcpProxy::Accept() {
  while (!stopping_.load()) {
    pollfd ready = {listen_fd_, POLLIN, 0};
    if (poll(&ready, 1, 50) <= 0) continue;
    const int client = accept(listen_fd_, nullptr, nullptr);
    if (client < 0) continue;
    const int server = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in target = Loopback(target_port_);
    if (server < 0 || connect(server, reinterpret_cast<sockaddr*>(&target),
                              sizeof(target)) != 0) {
      close(client);
      if (server >= 0) close(server);
      continue;
    }
    absl::MutexLock lock(&mu_);
    forwarders_.emplace_back(
        [this, client, server] { Forward(client, server); });
  }
}

void TcpProxy::Forward(int client, int server) {
  char buffer[65536];
  bool open = true;
  while (open && !stopping_.load()) {
    if (frozen_.load()) {
      // Silent: nothing is read, so nothing reaches either side.
      usleep(10000);
      continue;
    }
    pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
    if (poll(fds, 2, 50) <= 0) continue;
    for (int i = 0; i < 2 && open; ++i) {
      if (fds[i].revents == 0) continue;
      const ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      open = n > 0 && WriteAll(i == 0 ? server : client, buffer, n, stopping_);
    }
  }
  close(client);
  close(server);
}

}  // namespace monsoon::testutil
