#include "worker/sparse_rows.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace monsoon::worker {
namespace {

using ::testing::ElementsAre;

TEST(SparseRowsTest, RepeatsAreSentOnceWithTheirGradientsSummed) {
  const std::vector<uint64_t> ids = {7, 3, 7, 9, 3, 7};
  const UniqueIds unique = Deduplicate(ids);
  EXPECT_THAT(unique.ids, ElementsAre(7u, 3u, 9u));
  EXPECT_THAT(unique.where, ElementsAre(0u, 1u, 0u, 2u, 1u, 0u));
  // dim 2: id 7 sums rows 0, 2 and 5; id 3 rows 1 and 4.
  const std::vector<float> grads = {1, 10, 2, 20, 3, 30, 4, 40, 5, 50, 6, 60};
  EXPECT_THAT(SumRepeats(unique, grads, 2),
              ElementsAre(1 + 3 + 6, 10 + 30 + 60, 2 + 5, 20 + 50, 4, 40));
  EXPECT_THAT(ExpandRows(unique, {0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f}, 2),
              ElementsAre(0.5f, 1.5f, 2.5f, 3.5f, 0.5f, 1.5f, 4.5f, 5.5f, 2.5f,
                          3.5f, 0.5f, 1.5f));
}

TEST(SparseRowsTest, NoIdsNoRows) {
  const UniqueIds unique = Deduplicate({});
  EXPECT_TRUE(unique.ids.empty());
  EXPECT_TRUE(SumRepeats(unique, {}, 4).empty());
  EXPECT_TRUE(ExpandRows(unique, {}, 4).empty());
}

}  // namespace
}  // namespace monsoon::worker
