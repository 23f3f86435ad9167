// tools/local_cluster's helpers that need no cluster: the --device and
// seconds checks and the search for consecutive free ports.
#include "tools/local_cluster.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <limits>

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

TEST(CheckRunSecondsTest, TakesAnIntervalAndALimitOrNone) {
  EXPECT_TRUE(CheckRunSeconds(0.5, 0).ok());
  EXPECT_TRUE(CheckRunSeconds(3600, 120.5).ok());
  EXPECT_TRUE(CheckRunSeconds(0.001, 1e9).ok());
}

TEST(CheckRunSecondsTest, RefusesImpossibleSecondsNamingTheFlag) {
  const double nan = std::nan("");
  const double inf = std::numeric_limits<double>::infinity();
  for (double interval : {0.0, -1.0, 3601.0, nan, inf}) {
    const absl::Status status = CheckRunSeconds(interval, 0);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << interval;
    EXPECT_THAT(status.message(),
                HasSubstr(absl::StrCat("--eval_interval_s=", interval, ":")));
  }
  for (double limit : {-1.0, -0.001, nan, inf}) {
    const absl::Status status = CheckRunSeconds(2, limit);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << limit;
    EXPECT_THAT(status.message(),
                HasSubstr(absl::StrCat("--time_limit_s=", limit, ":")));
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
