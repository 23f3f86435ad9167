#include "common/free_ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"

namespace monsoon::common {

absl::StatusOr<int> FreePortRange(int count) {
  auto bind_loopback = [](int port) -> int {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      close(fd);
      return -1;
    }
    return fd;
  };
  // Below the kernel's range of ephemeral ports where there is room: a port
  // in that range that is free now can be taken by any process's next
  // outgoing connection (a worker's, to a shard) before the daemon it was
  // meant for binds it. Else the kernel's pick of a free port, then the
  // ones after it.
  int ephemeral_low = 32768;  // Linux's default
  int read_low = 0;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
      range >> read_low && read_low > 0) {
    ephemeral_low = read_low;
  }
  const int below_low = 10000;
  const int below_high = ephemeral_low - count;  // first port at most this
  std::mt19937 random(std::random_device{}());
  for (int attempt = 0; attempt < 200; ++attempt) {
    int first = 0;
    if (attempt < 100 && below_high > below_low) {
      first = std::uniform_int_distribution<int>(below_low, below_high)(random);
    } else {
      const int probe = bind_loopback(0);
      if (probe < 0) break;
      sockaddr_in bound{};
      socklen_t length = sizeof(bound);
      getsockname(probe, reinterpret_cast<sockaddr*>(&bound), &length);
      close(probe);
      first = ntohs(bound.sin_port);
    }
    if (first + count > 65536) continue;
    std::vector<int> held;
    for (int port = first; port < first + count; ++port) {
      const int fd = bind_loopback(port);
      if (fd < 0) break;
      held.push_back(fd);
    }
    const bool all = static_cast<int>(held.size()) == count;
    for (int fd : held) close(fd);
    if (all) return first;
  }
  return absl::UnavailableError(
      absl::StrCat("found no ", count,
                   " consecutive free ports on 127.0.0.1 for metrics; "
                   "give --metrics_port=PORT, or 0 for no metrics"));
}

}  // namespace monsoon::common
