#include "common/sparse_ids.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace monsoon::common {
namespace {

TEST(SparseIdsTest, ShardsOwnContiguousRangesThatCoverEveryBucketOnce) {
  for (uint32_t buckets : {1u, 7u, 64u, 1000u}) {
    for (int shards = 1; shards <= static_cast<int>(std::min(buckets, 9u));
         ++shards) {
      uint32_t next = 0;
      for (int s = 0; s < shards; ++s) {
        const BucketRange range = BucketsOfShard(s, buckets, shards);
        EXPECT_EQ(range.first, next) << buckets << " " << shards << " " << s;
        EXPECT_GE(range.last, range.first);
        for (uint32_t b = range.first; b < range.last; ++b) {
          ASSERT_EQ(ShardOfBucket(b, buckets, shards), s)
              << "bucket " << b << " of " << buckets << ", " << shards
              << " shards";
        }
        next = range.last;
      }
      EXPECT_EQ(next, buckets);
    }
  }
}

TEST(SparseIdsTest, TheDefaultBucketsSplitEvenlyOverThreeShards) {
  EXPECT_EQ(BucketsOfShard(0, kDefaultSparseBuckets, 3).last, 21845u);
  EXPECT_EQ(BucketsOfShard(1, kDefaultSparseBuckets, 3).last, 43690u);
  EXPECT_EQ(BucketsOfShard(2, kDefaultSparseBuckets, 3).last, 65536u);
  EXPECT_EQ(ShardOfBucket(21844, kDefaultSparseBuckets, 3), 0);
  EXPECT_EQ(ShardOfBucket(21845, kDefaultSparseBuckets, 3), 1);
  EXPECT_EQ(ShardOfBucket(65535, kDefaultSparseBuckets, 3), 2);
}

TEST(SparseIdsTest, ConsecutiveIdsSpreadOverEveryBucket) {
  // 16,000 ids 0, 1, 2, ... into 16 buckets: each within a fifth of 1,000.
  std::vector<int> count(16, 0);
  for (uint64_t id = 0; id < 16000; ++id) ++count[BucketOfId(id, 16)];
  for (int b = 0; b < 16; ++b) {
    EXPECT_GT(count[b], 800) << "bucket " << b;
    EXPECT_LT(count[b], 1200) << "bucket " << b;
  }
}

TEST(SparseIdsTest, ReshardingMovesBucketsNotIds) {
  // An id's shard on any shard count follows from its bucket alone.
  for (uint64_t id : {0ull, 1ull, 12345ull, ~0ull}) {
    const uint32_t bucket = BucketOfId(id, kDefaultSparseBuckets);
    for (int shards : {1, 2, 3, 5}) {
      EXPECT_EQ(ShardOfId(id, kDefaultSparseBuckets, shards),
                ShardOfBucket(bucket, kDefaultSparseBuckets, shards));
    }
  }
}

TEST(SparseIdsTest, HashesAreStableAcrossVersions) {
  // Rows on disk and in running shards are placed by these values: a change
  // would move every row. (The values come from a separate Python
  // transcription of SplitMix64 and FNV-1a.)
  EXPECT_EQ(BucketOfId(0, kDefaultSparseBuckets), 52655u);
  EXPECT_EQ(BucketOfId(1, kDefaultSparseBuckets), 23745u);
  EXPECT_EQ(HashStringId(""), 14087677454934409008ull);
  EXPECT_EQ(HashStringId("user_42"), 15946063111477081955ull);
  EXPECT_NE(HashStringId("a"), HashStringId("b"));
}

}  // namespace
}  // namespace monsoon::common
