// tools/local_cluster's helpers that need no cluster: the --device check
// and the search for consecutive free ports.
#include "tools/local_cluster.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace monsoon::tools {
namespace {

using ::testing::HasSubstr;

TEST(CheckDeviceNameTest, TakesTheBackendsNames) {
  for (const char* name : {"cpu", "auto", "cuda", "cuda:0", "cuda:7"}) {
    EXPECT_TRUE(CheckDeviceName(name).ok()) << name;
  }
}

TEST(CheckDeviceNameTest, RefusesAnythingElseNamingIt) {
  for (const char* name : {"", "gpu", "CUDA", "cuda:", "cuda:-1", "cuda:x",
                           "cuda:1:2", "cpu:0"}) {
    const absl::Status status = CheckDeviceName(name);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(status.message(),
                HasSubstr(absl::StrCat("--device='", name, "'")));
  }
}

// Whether 127.0.0.1:port can be bound now.
bool Bindable(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok =
      bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return ok;
}

TEST(FreePortRangeTest, FindsFreePortsBelowTheEphemeralRange) {
  int ephemeral_low = 0;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral_low;
  for (int count : {1, 7, 17}) {
    absl::StatusOr<int> first = FreePortRange(count);
    ASSERT_TRUE(first.ok()) << first.status();
    if (ephemeral_low > 10000 + count) {
      EXPECT_GE(*first, 10000);
      EXPECT_LE(*first + count, ephemeral_low);
    }
    for (int port = *first; port < *first + count; ++port) {
      EXPECT_TRUE(Bindable(port)) << port;
    }
  }
}

}  // namespace
}  // namespace monsoon::tools
