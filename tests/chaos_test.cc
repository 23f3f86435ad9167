// ParseChaos: the faults of a --chaos specification, with exact fields, and
// the errors for what cannot be injected.
#include "tools/chaos.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace monsoon::tools {
namespace {

using ::monsoon::testutil::IsOkAndHolds;
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
                                 "kill, stop, add or remove")));
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

TEST(ParseChaosTest, ElasticRunsAddWorkersOfTheNextRanksAndRemoveThem) {
  ASSERT_OK_AND_ASSIGN(
      std::vector<Fault> faults,
      ParseChaos("remove:worker1@20s,add:worker@10s,kill:worker3@30s,"
                 "add:worker@12s",
                 /*servers=*/2, /*workers=*/2, /*elastic=*/true));
  ASSERT_EQ(faults.size(), 4u);
  EXPECT_EQ(faults[0].kind, Fault::Kind::kAdd);
  EXPECT_FALSE(faults[0].server);
  EXPECT_EQ(faults[0].index, 2);
  EXPECT_EQ(faults[1].kind, Fault::Kind::kAdd);
  EXPECT_EQ(faults[1].index, 3);
  EXPECT_EQ(faults[1].at_s, 12);
  EXPECT_EQ(faults[2].kind, Fault::Kind::kRemove);
  EXPECT_EQ(faults[2].index, 1);
  EXPECT_EQ(faults[3].kind, Fault::Kind::kKill);
  EXPECT_EQ(faults[3].index, 3);
  EXPECT_EQ(RanksFor(faults, 2), 4);
}

// --workers=MIN:MAX: MIN started, MAX ranks (every daemon's --num_workers).
TEST(WorkerCountTest, MinMaxGivesTheRunRoomToGrow) {
  ASSERT_OK_AND_ASSIGN(WorkerCount plain, ParseWorkerCount("4", false));
  EXPECT_EQ(plain.start, 4);
  EXPECT_EQ(plain.max, 0);
  ASSERT_OK_AND_ASSIGN(WorkerCount range, ParseWorkerCount("2:6", true));
  EXPECT_EQ(range.start, 2);
  EXPECT_EQ(range.max, 6);
  ASSERT_OK_AND_ASSIGN(std::vector<Fault> adds,
                       ParseChaos("add:worker@1s,add:worker@2s", 2, 2, true));
  // Without MAX, one rank per add; with it, MAX, whatever the adds.
  EXPECT_THAT(RanksFor(adds, plain), IsOkAndHolds(6));
  EXPECT_THAT(RanksFor(adds, WorkerCount{2, 0}), IsOkAndHolds(4));
  EXPECT_THAT(RanksFor(adds, range), IsOkAndHolds(6));
  EXPECT_THAT(RanksFor({}, range), IsOkAndHolds(6));
  EXPECT_THAT(RanksFor(adds, WorkerCount{2, 3}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--chaos adds 2 workers to the 2 started: "
                                 "more than --workers=2:3")));
  const std::pair<const char*, const char*> refused[] = {
      {"", "give a count such as 4"},
      {"two", "give a count such as 4"},
      {"2:", "give a count such as 4"},
      {"1:2:3", "give a count such as 4"},
      {"0", "counts must be in [1, 256]"},
      {"2:300", "counts must be in [1, 256]"},
      {"4:2", "MAX is below MIN"},
  };
  for (const auto& [text, why] : refused) {
    EXPECT_THAT(ParseWorkerCount(text, true),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(why)))
        << text;
  }
  EXPECT_THAT(ParseWorkerCount("2:6", false),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("add --elastic")));
}

TEST(ParseChaosTest, RefusesMembershipChangesThatCannotBe) {
  EXPECT_THAT(ParseChaos("add:worker@1s", 2, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("only an elastic run (--elastic)")));
  EXPECT_THAT(ParseChaos("add:worker1@1s", 2, 2, true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("write add:worker@TIME")));
  EXPECT_THAT(ParseChaos("remove:server1@1s", 2, 2, true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("write remove:workerN@TIME")));
  EXPECT_THAT(ParseChaos("remove:worker0@1s+2s", 2, 2, true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a remove takes no duration")));
  EXPECT_THAT(ParseChaos("remove:worker0@1s,kill:worker1@2s", 2, 2, true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'kill:worker1@2s': it would take the run's "
                                 "last worker away")));
  EXPECT_THAT(ParseChaos("remove:worker2@1s", 2, 2, true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("ranks 0 to 1 (2 at the start and 0 added)")));
  EXPECT_THAT(ParseChaos("remove:worker2@1s,add:worker@5s", 2, 2, true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("worker 2 is not in the run by then")));
  EXPECT_THAT(ParseChaos("remove:worker0@1s,remove:worker0@2s", 2, 2, true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("worker 0 is not in the run by then")));
  // Outside elastic runs a killed worker is restarted: killing every one
  // is allowed.
  EXPECT_TRUE(ParseChaos("kill:worker0@1s,kill:worker1@1s", 2, 2).ok());
}

}  // namespace
}  // namespace monsoon::tools
