// Where a sparse table's rows live: 64-bit ids hash into a run's fixed
// number of virtual buckets, and each shard owns a contiguous range of
// buckets (XDL's scheme). A run on another shard count moves whole buckets
// between shards, never single ids, so a checkpoint reshards by bucket.
// String ids (libsvm features written as words) hash to 64 bits first.
// Pure functions, the same on every platform; thread-safe.
#ifndef MONSOON_COMMON_SPARSE_IDS_H_
#define MONSOON_COMMON_SPARSE_IDS_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace monsoon::common {

// The buckets of a run unless its config says otherwise.
inline constexpr uint32_t kDefaultSparseBuckets = 65536;

// The bucket of `id`, in [0, buckets): a mixed hash, so that dense ranges
// of ids (0, 1, 2, ...) spread over every bucket. `buckets` > 0.
uint32_t BucketOfId(uint64_t id, uint32_t buckets);

// The shard that owns `bucket`: shard s owns [s * B / S, (s + 1) * B / S).
// `shards` in [1, buckets].
int ShardOfBucket(uint32_t bucket, uint32_t buckets, int shards);

// Shard `shard`'s buckets, [first, last).
struct BucketRange {
  uint32_t first = 0;
  uint32_t last = 0;
};
BucketRange BucketsOfShard(int shard, uint32_t buckets, int shards);

// The shard that holds `id`'s row.
inline int ShardOfId(uint64_t id, uint32_t buckets, int shards) {
  return ShardOfBucket(BucketOfId(id, buckets), buckets, shards);
}

// A string id as a 64-bit one (FNV-1a, then mixed), stable across
// processes and versions.
uint64_t HashStringId(absl::string_view text);

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_SPARSE_IDS_H_
