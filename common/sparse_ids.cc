#include "common/sparse_ids.h"

#include "common/model_layout.h"

namespace monsoon::common {

uint32_t BucketOfId(uint64_t id, uint32_t buckets) {
  return static_cast<uint32_t>(SplitMix64(id) % buckets);
}

int ShardOfBucket(uint32_t bucket, uint32_t buckets, int shards) {
  // The inverse of BucketsOfShard: the largest s with s * B / S <= bucket.
  // 64-bit products: B and S are at most 2^32.
  return static_cast<int>(
      ((static_cast<uint64_t>(bucket) + 1) * static_cast<uint64_t>(shards) -
       1) /
      buckets);
}

BucketRange BucketsOfShard(int shard, uint32_t buckets, int shards) {
  const uint64_t b = buckets;
  const uint64_t s = static_cast<uint64_t>(shards);
  return {static_cast<uint32_t>(static_cast<uint64_t>(shard) * b / s),
          static_cast<uint32_t>((static_cast<uint64_t>(shard) + 1) * b / s)};
}

uint64_t HashStringId(absl::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a's offset basis
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;  // FNV-1a's prime
  }
  return SplitMix64(h);
}

}  // namespace monsoon::common
