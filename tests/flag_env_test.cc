#include "common/flag_env.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

ABSL_FLAG(int, test_rank, 0, "a flag for this test");
ABSL_FLAG(bool, test_verbose, false, "a boolean flag for this test");

namespace monsoon::common {
namespace {

using ::monsoon::testutil::IsOk;
using ::monsoon::testutil::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

absl::Status Check(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return CheckFlagNames(static_cast<int>(argv.size()), argv.data());
}

TEST(CheckFlagNamesTest, AcceptsDefinedFlagsInEveryForm) {
  EXPECT_THAT(
      Check({"bin", "--test_rank=3", "-test_rank", "4", "--test_verbose",
             "--notest_verbose", "positional", "--help", "--helpfull"}),
      IsOk());
}

TEST(CheckFlagNamesTest, RefusesAnUnknownFlagWithItsName) {
  EXPECT_THAT(Check({"bin", "--test_rank=1", "--test_rnak=2"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'--test_rnak=2'")));
  EXPECT_THAT(Check({"bin", "--nosuchflag"}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(CheckFlagNamesTest, StopsAtDoubleDash) {
  EXPECT_THAT(Check({"bin", "--", "--anything"}), IsOk());
}

TEST(ApplyFlagEnvironmentTest, SetsAFlagFromItsVariableAndReportsBadValues) {
  setenv("MONSOON_TEST_RANK", "7", 1);
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> ignored,
                       ApplyFlagEnvironment());
  EXPECT_THAT(ignored, IsEmpty());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_rank), 7);
  setenv("MONSOON_TEST_RANK", "seven", 1);
  EXPECT_THAT(ApplyFlagEnvironment().status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("MONSOON_TEST_RANK='seven'")));
  EXPECT_EQ(absl::GetFlag(FLAGS_test_rank), 7);
  unsetenv("MONSOON_TEST_RANK");
}

TEST(ApplyFlagEnvironmentTest, ReturnsVariablesThatNameNoFlag) {
  setenv("MONSOON_TEST_VERBOSE", "true", 1);
  setenv("MONSOON_TEST_RANKK", "3", 1);  // a typo
  setenv("MONSOON_HELP", "1", 1);        // Abseil's own: not taken
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> ignored,
                       ApplyFlagEnvironment());
  EXPECT_THAT(ignored, ElementsAre("MONSOON_HELP", "MONSOON_TEST_RANKK"));
  EXPECT_TRUE(absl::GetFlag(FLAGS_test_verbose));
  unsetenv("MONSOON_TEST_VERBOSE");
  unsetenv("MONSOON_TEST_RANKK");
  unsetenv("MONSOON_HELP");
}

}  // namespace
}  // namespace monsoon::common
