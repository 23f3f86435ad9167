#include "tools/emulated_network.h"

#include <unistd.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace monsoon::tools {
namespace {

using ::monsoon::testutil::IsOk;
using ::monsoon::testutil::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Output(const std::string& command) {
  std::string out;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[512];
  while (fgets(buffer, sizeof(buffer), pipe) != nullptr) out += buffer;
  pclose(pipe);
  return out;
}

TEST(ParseWorkerRatesTest, RanksAndRatesWithoutDelay) {
  ASSERT_OK_AND_ASSIGN(auto rates, ParseWorkerRates("1:20mbit,0:500kbit"));
  EXPECT_EQ(rates, (std::map<int, int64_t>{{0, 500000}, {1, 20000000}}));
  ASSERT_OK_AND_ASSIGN(auto none, ParseWorkerRates(""));
  EXPECT_TRUE(none.empty());
  for (const char* bad :
       {"1", "x:20mbit", "-1:20mbit", "1:fast", "1:20mbit,1:10mbit"}) {
    EXPECT_THAT(ParseWorkerRates(bad),
                testutil::StatusIs(absl::StatusCode::kInvalidArgument))
        << bad;
  }
}

TEST(ParseLinkTest, ReadsRateAndDelay) {
  absl::StatusOr<LinkSpec> link = ParseLink("100mbit,2ms");
  ASSERT_THAT(link.status(), IsOk());
  EXPECT_EQ(link->rate_bits_per_s, 100000000);
  EXPECT_EQ(link->delay_ms, 2.0);
  EXPECT_EQ(link->text, "100mbit,2ms");
  link = ParseLink("1.5gbit");
  ASSERT_THAT(link.status(), IsOk());
  EXPECT_EQ(link->rate_bits_per_s, 1500000000);
  EXPECT_EQ(link->delay_ms, 0);
  link = ParseLink("500kbit,250us");
  ASSERT_THAT(link.status(), IsOk());
  EXPECT_EQ(link->rate_bits_per_s, 500000);
  EXPECT_DOUBLE_EQ(link->delay_ms, 0.25);
}

TEST(ParseLinkTest, RefusesWhatItCannotRead) {
  for (const char* bad : {"", "100", "fast", "100mbps", "-5mbit", "100mbit,2",
                          "100mbit,2ms,3", "0mbit", "100mbit,-1ms"}) {
    EXPECT_THAT(
        ParseLink(bad).status(),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("RATE[,DELAY]")))
        << bad;
  }
}

TEST(EmulatedNetworkTest, CreatesShapedHostsAndRemovesThemAll) {
  if (!CheckNetworkPrivileges().ok()) {
    GTEST_SKIP() << "needs root or CAP_NET_ADMIN and iproute2: "
                 << CheckNetworkPrivileges();
  }
  absl::StatusOr<LinkSpec> link = ParseLink("100mbit,2ms");
  ASSERT_THAT(link.status(), IsOk());
  absl::StatusOr<std::unique_ptr<EmulatedNetwork>> network =
      EmulatedNetwork::Create(2, 1, *link);
  ASSERT_THAT(network.status(), IsOk());
  const std::vector<std::string> namespaces = (*network)->namespaces();
  ASSERT_EQ(namespaces.size(), 3u);
  const HostPlacement& placement = (*network)->placement();
  EXPECT_EQ(placement.server_prefix.size(), 2u);
  EXPECT_EQ(placement.worker_prefix.size(), 1u);
  EXPECT_EQ(placement.worker_addresses.size(), 2u);
  EXPECT_EQ(placement.control_addresses.size(), 2u);
  EXPECT_THAT(placement.worker_addresses[1], HasSubstr(":5000"));
  const std::string listed = Output("/usr/sbin/ip netns list");
  for (const std::string& ns : namespaces) {
    EXPECT_THAT(listed, HasSubstr(ns));
    // Shaped to 100 Mbit/s by netem or, where the kernel lacks it, tbf.
    EXPECT_THAT(Output("/usr/sbin/tc -n " + ns + " qdisc show dev eth0"),
                HasSubstr("rate 100Mbit"))
        << ns;
  }
  // A worker host reaches a server host's address over the data bridge.
  const std::string server_ip = placement.worker_addresses[0].substr(
      0, placement.worker_addresses[0].find(':'));
  EXPECT_THAT(Output("/usr/sbin/ip netns exec " + namespaces[2] +
                     " /usr/sbin/ip route get " + server_ip),
              HasSubstr("dev eth0"));
  // And a server host another's, the same way: with --replicas the updates
  // one forwards to its backup cross the shaped links as pushes do.
  const std::string other_server_ip = placement.worker_addresses[1].substr(
      0, placement.worker_addresses[1].find(':'));
  EXPECT_THAT(Output("/usr/sbin/ip netns exec " + namespaces[0] +
                     " /usr/sbin/ip route get " + other_server_ip),
              HasSubstr("dev eth0"));

  ASSERT_THAT((*network)->TearDown(), IsOk());
  const std::string after = Output("/usr/sbin/ip netns list");
  for (const std::string& ns : namespaces) {
    EXPECT_THAT(after, Not(HasSubstr(ns)));
  }
  EXPECT_THAT(Output("/usr/sbin/ip link show"),
              Not(HasSubstr(absl::StrCat("mon", getpid(), "d"))));
  EXPECT_THAT((*network)->TearDown(), IsOk());  // idempotent
}

}  // namespace
}  // namespace monsoon::tools
