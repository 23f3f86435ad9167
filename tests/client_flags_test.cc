// ExpandServers: the shards' addresses from --servers and --num_shards.
#include "worker/client_flags.h"

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "common/daemon.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

ABSL_DECLARE_FLAG(double, connect_timeout_s);

namespace monsoon::worker {
namespace {

using ::monsoon::testutil::IsOkAndHolds;
using ::monsoon::testutil::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ExpandServersTest, APatternNamesEveryShardByItsIndex) {
  EXPECT_THAT(ExpandServers({"ps-{i}.ps:5000"}, 3),
              IsOkAndHolds(
                  ElementsAre("ps-0.ps:5000", "ps-1.ps:5000", "ps-2.ps:5000")));
}

TEST(ExpandServersTest, AListIsKeptAndMayBeCheckedAgainstTheCount) {
  const std::vector<std::string> list = {"a:1", "b:2"};
  EXPECT_THAT(ExpandServers(list, 0), IsOkAndHolds(ElementsAre("a:1", "b:2")));
  EXPECT_THAT(ExpandServers(list, 2), IsOkAndHolds(ElementsAre("a:1", "b:2")));
  EXPECT_THAT(ExpandServers(list, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("lists 2 shards but --num_shards=3")));
}

TEST(ExpandServersTest, APatternWithoutACountIsRefused) {
  EXPECT_THAT(ExpandServers({"ps-{i}.ps:5000"}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("give their count with --num_shards")));
}

TEST(ExpandServersTest, APatternInsideAListIsRefused) {
  EXPECT_THAT(ExpandServers({"ps-{i}.ps:5000", "b:2"}, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("only in a single address")));
}

TEST(ExpandServersTest, ACountOutOfRangeIsRefused) {
  EXPECT_THAT(ExpandServers({"ps-{i}.ps:5000"}, -1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("from 0 to 4096")));
  EXPECT_THAT(ExpandServers({"ps-{i}.ps:5000"}, 5000),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("from 0 to 4096")));
}

TEST(RefusedForHowItWasStartedTest, OnlyRefusalsThatRetryingCannotFix) {
  for (const absl::Status& status :
       {absl::FailedPreconditionError("config"),
        absl::AlreadyExistsError("rank"), absl::InvalidArgumentError("counts"),
        absl::UnauthenticatedError("token")}) {
    EXPECT_TRUE(RefusedForHowItWasStarted(status)) << status;
  }
  for (const absl::Status& status :
       {absl::UnavailableError("down"), absl::DeadlineExceededError("slow"),
        absl::CancelledError("stopped"), absl::InternalError("bug")}) {
    EXPECT_FALSE(RefusedForHowItWasStarted(status)) << status;
  }
}

TEST(ConnectWithClientFlagsTest, ABadFlagIsAConfigurationError) {
  PsClientOptions options;
  options.server_addresses = {"ps-{i}.ps:5000"};  // and no --num_shards
  int exit_code = -1;
  EXPECT_THAT(ConnectWithClientFlags(options, &exit_code),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("give their count with --num_shards")));
  EXPECT_EQ(exit_code, common::kExitConfigError);
}

TEST(ConnectWithClientFlagsTest, AShardThatDoesNotAnswerIsAFailure) {
  absl::FlagSaver saver;
  absl::SetFlag(&FLAGS_connect_timeout_s, 0.2);
  PsClientOptions options;
  options.server_addresses = {"127.0.0.1:1"};  // nothing listens there
  options.worker_rank = -1;
  int exit_code = -1;
  EXPECT_THAT(ConnectWithClientFlags(options, &exit_code),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(exit_code, common::kExitFailure);
}

}  // namespace
}  // namespace monsoon::worker
