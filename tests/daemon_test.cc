#include "common/daemon.h"

#include <signal.h>

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace monsoon::common {
namespace {

using ::monsoon::testutil::FreshDir;
using ::monsoon::testutil::IsOk;
using ::monsoon::testutil::ReadFile;
using ::monsoon::testutil::StatusIs;
using ::monsoon::testutil::WriteFile;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Contents(const std::string& path) {
  std::string text;
  EXPECT_TRUE(ReadFile(path, &text)) << path;
  return text;
}

TEST(WriteFileAtomicallyTest, WritesTheNewContentsOverTheOld) {
  const std::string path = FreshDir("writes") + "/port";
  WriteFile(path, "5000\n");

  ASSERT_THAT(WriteFileAtomically(path, "5001\n"), IsOk());

  EXPECT_EQ(Contents(path), "5001\n");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(WriteFileAtomicallyTest, CreatesAFileThatWasNotThere) {
  const std::string path = FreshDir("creates") + "/curve.textproto";

  ASSERT_THAT(WriteFileAtomically(path, "points {}\n"), IsOk());

  EXPECT_EQ(Contents(path), "points {}\n");
}

TEST(WriteFileAtomicallyTest, LeavesTheOldContentsWhenItCannotWrite) {
  const std::string path = FreshDir("blocked") + "/metrics.json";
  WriteFile(path, "{\"old\": true}\n");
  // A folder where the temporary file would go: opening it for writing
  // fails, whoever runs the test (root too).
  std::filesystem::create_directory(path + ".tmp");

  EXPECT_THAT(WriteFileAtomically(path, "{\"new\": true}\n"),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("cannot write " + path + ".tmp: ")));

  EXPECT_EQ(Contents(path), "{\"old\": true}\n");
}

TEST(WriteFileAtomicallyTest, NamesTheFileAndTheReasonForAMissingFolder) {
  const std::string path = FreshDir("missing") + "/no/such/folder/port";

  EXPECT_THAT(WriteFileAtomically(path, "5000\n"),
              StatusIs(absl::StatusCode::kInternal,
                       AllOf(HasSubstr("cannot write " + path + ".tmp"),
                             HasSubstr("No such file or directory"))));
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(FailTest, ReturnsTheCodeItIsGiven) {
  EXPECT_EQ(Fail("daemon_test", kExitConfigError,
                 absl::InvalidArgumentError("--rank=3 is out of range")),
            2);
  EXPECT_EQ(Fail("daemon_test", kExitFailure, "cannot write port"), 1);
  EXPECT_EQ(Fail("daemon_test", 130, absl::CancelledError("interrupted")), 130);
}

TEST(FailTest, LogsTheProgramAndTheStatus) {
  testing::internal::CaptureStderr();
  Fail("ps_test", kExitConfigError, absl::InvalidArgumentError("bad flag"));
  Fail("ps_test", kExitFailure, "plain message");
  const std::string logged = testing::internal::GetCapturedStderr();

  EXPECT_THAT(logged, HasSubstr("ps_test: INVALID_ARGUMENT: bad flag\n"));
  EXPECT_THAT(logged, HasSubstr("ps_test: plain message\n"));
}

TEST(ExitCodeTest, ConstantsAndSignalsHaveTheirConventionalValues) {
  EXPECT_EQ(kExitOk, 0);
  EXPECT_EQ(kExitFailure, 1);
  EXPECT_EQ(kExitConfigError, 2);
  EXPECT_EQ(ExitCodeForSignal(SIGTERM), 143);
  EXPECT_EQ(ExitCodeForSignal(SIGINT), 130);
}

}  // namespace
}  // namespace monsoon::common
