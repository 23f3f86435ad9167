#include "tools/delay_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace monsoon::tools {
namespace {

using ::testing::HasSubstr;

sockaddr_in Loopback(int port) {
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  return address;
}

// Echoes every byte of one connection back, on 127.0.0.1.
class EchoServer {
 public:
  EchoServer() {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address = Loopback(0);
    socklen_t length = sizeof(address);
    bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    listen(listen_fd_, 4);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] {
      const int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      char buffer[1 << 16];
      ssize_t n;
      while ((n = read(fd, buffer, sizeof(buffer))) > 0) {
        ssize_t sent = 0;
        while (sent < n) {
          const ssize_t w = write(fd, buffer + sent, n - sent);
          if (w <= 0) break;
          sent += w;
        }
      }
      close(fd);
    });
  }
  ~EchoServer() {
    shutdown(listen_fd_, SHUT_RDWR);
    close(listen_fd_);
    thread_.join();
  }
  int port() const { return port_; }

 private:
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = Loopback(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
      0) {
    close(fd);
    return -1;
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

bool ReadAll(int fd, char* data, size_t n) {
  while (n > 0) {
    const ssize_t r = read(fd, data, n);
    if (r <= 0) return false;
    data += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// The round trip through the proxy takes the delay twice (there and back):
// the fastest of 20 is within 10% above 2 x 20 ms, and none is faster.
TEST(DelayProxyTest, ARoundTripTakesTheDelayEachWay) {
  EchoServer echo;
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<DelayProxy> proxy,
      DelayProxy::Start("127.0.0.1:0", absl::StrCat("127.0.0.1:", echo.port()),
                        absl::Milliseconds(20)));
  const int fd = Connect(proxy->port());
  ASSERT_GE(fd, 0);
  absl::Duration fastest = absl::InfiniteDuration();
  for (int i = 0; i < 20; ++i) {
    const char byte = static_cast<char>(i);
    const absl::Time start = absl::Now();
    ASSERT_EQ(write(fd, &byte, 1), 1);
    char back = 0;
    ASSERT_TRUE(ReadAll(fd, &back, 1));
    const absl::Duration rtt = absl::Now() - start;
    EXPECT_EQ(back, byte);
    EXPECT_GE(rtt, absl::Milliseconds(40));
    fastest = std::min(fastest, rtt);
  }
  EXPECT_LE(fastest, absl::Milliseconds(44));
  close(fd);
}

// A megabyte goes through whole and in order.
TEST(DelayProxyTest, ForwardsEveryByteInOrder) {
  EchoServer echo;
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<DelayProxy> proxy,
      DelayProxy::Start("127.0.0.1:0", absl::StrCat("127.0.0.1:", echo.port()),
                        absl::Milliseconds(1)));
  const int fd = Connect(proxy->port());
  ASSERT_GE(fd, 0);
  std::string sent(1 << 20, '\0');
  for (size_t i = 0; i < sent.size(); ++i) {
    sent[i] = static_cast<char>((i * 131) % 251);
  }
  std::thread writer([&] {
    size_t done = 0;
    while (done < sent.size()) {
      const ssize_t w = write(fd, sent.data() + done, sent.size() - done);
      if (w <= 0) break;
      done += static_cast<size_t>(w);
    }
  });
  std::string received(sent.size(), '\0');
  EXPECT_TRUE(ReadAll(fd, received.data(), received.size()));
  writer.join();
  EXPECT_EQ(received, sent);
  close(fd);
}

TEST(DelayProxyTest, BadAddressesAndDelaysAreClearErrors) {
  EXPECT_THAT(DelayProxy::Start("127.0.0.1:0", "nowhere", absl::ZeroDuration()),
              testutil::StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("IPv4 HOST:PORT")));
  EXPECT_THAT(
      DelayProxy::Start("127.0.0.1:0", "127.0.0.1:1", absl::Milliseconds(-1)),
      testutil::StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("delay")));
}

}  // namespace
}  // namespace monsoon::tools
