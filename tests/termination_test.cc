#include "common/termination.h"

#include <csignal>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace monsoon::common {
namespace {

// A signal sent to the process notifies the watcher, whichever thread the
// kernel runs the handler on, and a watcher made after another one was
// destroyed watches again.
TEST(TerminationTest, SigtermAndThenSigintNotifyTheirWatcher) {
  {
    TerminationWatcher watcher;
    EXPECT_EQ(watcher.signal(), 0);
    EXPECT_FALSE(watcher.terminated().HasBeenNotified());
    ASSERT_EQ(std::raise(SIGTERM), 0);
    ASSERT_TRUE(
        watcher.terminated().WaitForNotificationWithTimeout(absl::Seconds(30)));
    EXPECT_EQ(watcher.signal(), SIGTERM);
  }
  TerminationWatcher again;
  EXPECT_FALSE(again.terminated().HasBeenNotified());
  ASSERT_EQ(std::raise(SIGINT), 0);
  ASSERT_TRUE(
      again.terminated().WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(again.signal(), SIGINT);
}

}  // namespace
}  // namespace monsoon::common
