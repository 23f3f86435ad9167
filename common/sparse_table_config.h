// The checks of a run's sparse tables (proto/sparse_table.proto), shared by
// the config's resolution (every daemon refuses a bad table at start) and
// the shard's tables. Pure functions; thread-safe.
#ifndef MONSOON_COMMON_SPARSE_TABLE_CONFIG_H_
#define MONSOON_COMMON_SPARSE_TABLE_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"
#include "proto/sparse_table.pb.h"

namespace monsoon::common {

// Slots of a table's rows are 32-bit.
inline constexpr int64_t kMaxSparseRows = (int64_t{1} << 31) - 1;
inline constexpr int kMaxSparseDim = 4096;
inline constexpr uint32_t kMaxSparseBuckets = uint32_t{1} << 24;

// INVALID_ARGUMENT, naming the table, the field and its bounds, for a
// table config out of range (see SparseTableConfig).
absl::Status ValidateSparseTable(const SparseTableConfig& config);

// Each table's check, names distinct, and `buckets` in [1, 2^24].
absl::Status ValidateSparseTables(
    const google::protobuf::RepeatedPtrField<SparseTableConfig>& tables,
    uint32_t buckets);

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_SPARSE_TABLE_CONFIG_H_
