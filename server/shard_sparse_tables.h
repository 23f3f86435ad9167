// ShardSparseTables: one shard's part of the run's sparse tables
// (TrainingConfig.sparse_tables): a SparseTable each, holding the rows of
// the ids whose virtual bucket (common/sparse_ids.h) this shard owns, and
// the decoding of the wire's row calls (ParameterService.SparsePull,
// SparsePush) onto them. The caller's checks (run, shard, session) are the
// Shard's; the checks of ids, tables and sizes are here.
//
// Thread-safe: the set is constant after Create, each table locks itself.
#ifndef MONSOON_SERVER_SHARD_SPARSE_TABLES_H_
#define MONSOON_SERVER_SHARD_SPARSE_TABLES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/config.pb.h"
#include "proto/service.pb.h"
#include "server/sparse_table.h"

namespace monsoon::server {

class ShardSparseTables {
 public:
  // The tables of `resolved` on shard `shard` of `num_shards`.
  // INVALID_ARGUMENT for a table out of range or fewer buckets than shards;
  // RESOURCE_EXHAUSTED when the tables at their max_rows would take more
  // than `memory_bytes` (0: this process's, common::MemoryLimitBytes), naming
  // each table's share, so that a shard is refused at its start rather than
  // killed by the kernel as its tables fill; RESOURCE_EXHAUSTED from a
  // table that cannot reserve its rows.
  static absl::StatusOr<std::unique_ptr<ShardSparseTables>> Create(
      const TrainingConfig& resolved, int shard, int num_shards,
      uint64_t memory_bytes = 0);

  // The most ids one call may carry.
  static constexpr int kMaxIdsPerCall = 1 << 20;

  bool empty() const { return tables_.empty(); }
  const std::vector<std::unique_ptr<SparseTable>>& tables() const {
    return tables_;
  }
  uint32_t buckets() const { return buckets_; }

  // The table named `name`: NOT_FOUND, naming the run's tables.
  absl::StatusOr<SparseTable*> Find(const std::string& name) const;

  // FAILED_PRECONDITION naming the first id whose bucket another shard
  // owns, and that shard; INVALID_ARGUMENT for more than kMaxIdsPerCall.
  absl::Status CheckIdsAreMine(absl::Span<const uint64_t> ids) const;

  // The rows of a pull; a push applied at `learning_rate`, `step` marking
  // its rows (the shard's version). The errors of Find, CheckIdsAreMine and
  // SparseTable::Push; INVALID_ARGUMENT for gradients of the wrong size.
  absl::StatusOr<SparsePullResponse> Pull(
      const SparsePullRequest& request) const;
  absl::StatusOr<SparsePushResponse> Push(const SparsePushRequest& request,
                                          float learning_rate, int64_t step);

 private:
  ShardSparseTables(int shard, int num_shards, uint32_t buckets,
                    std::vector<std::unique_ptr<SparseTable>> tables);

  // Constant after construction.
  const int shard_;
  const int num_shards_;
  const uint32_t buckets_;
  const std::vector<std::unique_ptr<SparseTable>> tables_;
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_SHARD_SPARSE_TABLES_H_
