#include "common/auc.h"

#include <cmath>

#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace monsoon::common {
namespace {

using ::monsoon::testutil::IsOkAndHolds;
using ::monsoon::testutil::StatusIs;

TEST(AucTest, CountsOrderedPairsAndTiesAsHalf) {
  // Positives 0.8 and 0.4, negatives 0.6 and 0.2: of the 4 pairs, 3 are
  // ordered right.
  EXPECT_THAT(Auc({0.8f, 0.6f, 0.4f, 0.2f}, {1, 0, 1, 0}), IsOkAndHolds(0.75));
  EXPECT_THAT(Auc({0.9f, 0.1f}, {1, 0}), IsOkAndHolds(1.0));
  EXPECT_THAT(Auc({0.9f, 0.1f}, {0, 1}), IsOkAndHolds(0.0));
  // A tie between a positive and a negative counts half.
  EXPECT_THAT(Auc({0.5f, 0.5f, 0.1f}, {1, 0, 0}), IsOkAndHolds(0.75));
}

TEST(AucTest, OneClassOrSizesThatDifferHaveNoAuc) {
  EXPECT_THAT(Auc({0.1f, 0.2f}, {1, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Auc({0.1f}, {1, 0}), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(AucTest, LogLossOnKnownNumbers) {
  // -(log 0.8 + log(1 - 0.4)) / 2.
  EXPECT_THAT(LogLoss({0.8f, 0.4f}, {1, 0}),
              IsOkAndHolds(-(std::log(static_cast<double>(0.8f)) +
                             std::log(1 - static_cast<double>(0.4f))) /
                           2));
  // Clamped: a certain wrong answer costs -log(1e-7), not infinity.
  EXPECT_THAT(LogLoss({0.0f}, {1}), IsOkAndHolds(-std::log(1e-7)));
  EXPECT_THAT(LogLoss({}, {}), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace monsoon::common
