#include "common/histogram.h"

#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace monsoon::common {
namespace {

using ::testing::ElementsAre;

TEST(HistogramTest, EachValueCountsInTheFirstBucketAtLeastIt) {
  Histogram histogram({1, 2, 4});
  // A value equal to a bound is in that bound's bucket ("le").
  for (double value : {0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 9.0}) {
    histogram.Observe(value);
  }
  const Histogram::Snapshot snapshot = histogram.Read();
  EXPECT_THAT(snapshot.upper_bounds, ElementsAre(1, 2, 4));
  EXPECT_THAT(snapshot.cumulative, ElementsAre(2u, 4u, 6u));
  EXPECT_EQ(snapshot.count, 7u);  // 9 only in +Inf's
  EXPECT_EQ(snapshot.sum, 21.0);
}

TEST(HistogramTest, NothingObservedIsAllZero) {
  const Histogram::Snapshot snapshot = Histogram({1, 2}).Read();
  EXPECT_THAT(snapshot.cumulative, ElementsAre(0u, 0u));
  EXPECT_EQ(snapshot.count, 0u);
  EXPECT_EQ(snapshot.sum, 0.0);
}

TEST(HistogramTest, DurationBucketsAscendFrom50MicrosecondsTo10Seconds) {
  const std::vector<double>& bounds = DurationBuckets();
  ASSERT_FALSE(bounds.empty());
  EXPECT_EQ(bounds.front(), 50e-6);
  EXPECT_EQ(bounds.back(), 10.0);
  for (size_t i = 1; i < bounds.size(); ++i) {
    EXPECT_LT(bounds[i - 1], bounds[i]);
  }
}

// Observations from several threads at once are all counted, and summed
// exactly (small integers: no rounding).
TEST(HistogramTest, ConcurrentObservationsAreAllCounted) {
  Histogram histogram({1, 2});
  constexpr int kThreads = 4;
  constexpr int kEach = 10000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&histogram, t] {
      for (int i = 0; i < kEach; ++i) histogram.Observe(t % 2 == 0 ? 1 : 3);
    });
  }
  for (std::thread& thread : threads) thread.join();
  const Histogram::Snapshot snapshot = histogram.Read();
  EXPECT_THAT(snapshot.cumulative, ElementsAre(2u * kEach, 2u * kEach));
  EXPECT_EQ(snapshot.count, 4u * kEach);
  EXPECT_EQ(snapshot.sum, 2.0 * kEach * 1 + 2.0 * kEach * 3);
}

}  // namespace
}  // namespace monsoon::common
