// ParseChaos: the faults of a --chaos specification, with exact fields, and
// the errors for what cannot be injected.
#include "tools/chaos.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace monsoon::tools {
namespace {

using ::monsoon::testutil::StatusIs;
using ::testing::HasSubstr;

TEST(ParseChaosTest, ReadsKillsAndStopsInTimeOrder) {
  ASSERT_OK_AND_ASSIGN(
      std::vector<Fault> faults,
      ParseChaos("kill:worker0@20s, stop:server0@5s+10s,kill:server1@2.5",
                 /*servers=*/2, /*workers=*/2));
  ASSERT_EQ(faults.size(), 3u);
  EXPECT_EQ(faults[0].kind, Fault::Kind::kKill);
  EXPECT_TRUE(faults[0].server);
  EXPECT_EQ(faults[0].index, 1);
  EXPECT_EQ(faults[0].at_s, 2.5);
  EXPECT_EQ(faults[0].target(), "server 1");
  EXPECT_EQ(faults[1].kind, Fault::Kind::kStop);
  EXPECT_EQ(faults[1].at_s, 5);
  EXPECT_EQ(faults[1].for_s, 10);
  EXPECT_EQ(faults[1].text, "stop:server0@5s+10s");
  EXPECT_FALSE(faults[2].server);
  EXPECT_EQ(faults[2].index, 0);
  EXPECT_EQ(faults[2].at_s, 20);
}

TEST(ParseChaosTest, EmptyIsNoFault) {
  ASSERT_OK_AND_ASSIGN(std::vector<Fault> faults, ParseChaos("", 2, 2));
  EXPECT_TRUE(faults.empty());
}

TEST(ParseChaosTest, RefusesWhatCannotBeInjected) {
  EXPECT_THAT(ParseChaos("crash:server0@1s", 2, 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'crash:server0@1s': the action must be "
                                 "kill or stop")));
  EXPECT_THAT(ParseChaos("kill:server2@1s", 2, 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("this run has 2 servers, numbered from 0")));
  EXPECT_THAT(ParseChaos("kill:worker-1@1s", 2, 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("this run has 2 workers")));
  EXPECT_THAT(ParseChaos("kill:evaluator@1s", 2, 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("serverN or workerN")));
  EXPECT_THAT(ParseChaos("kill:server0", 2, 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("@TIME")));
  EXPECT_THAT(
      ParseChaos("kill:server0@-1s", 2, 2).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("seconds >= 0")));
  EXPECT_THAT(ParseChaos("stop:server0@1s", 2, 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a stop needs how long")));
  EXPECT_THAT(ParseChaos("stop:server0@1s+0s", 2, 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a stop needs how long")));
  EXPECT_THAT(ParseChaos("kill:server0@1s+2s", 2, 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a kill takes no duration")));
}

}  // namespace
}  // namespace monsoon::tools
