// ShardSparseTables: one shard's part of the run's sparse tables
// (TrainingConfig.sparse_tables): a SparseTable each, holding the rows of
// the ids whose virtual bucket (common/sparse_ids.h) this shard owns, and
// the decoding of the wire's row calls (ParameterService.SparsePull,
// SparsePush) onto them. The caller's checks (run, shard, session) are the
// Shard's; the checks of ids, tables and sizes are here.
//
// Row pushes are applied one at a time, counted (the range's row-push
// sequence) and, when numbered (SparsePushRequest.seq), each applied once
// per rank's session: a push sent again after a failure lost its answer is
// answered as a repeat. With --replicas=1 the primary hands each push it
// applied to its forward before answering it, in that order, and the backup
// applies the forwards by their place in the sequence
// (server/replication.h).
//
// Thread-safe: the set is constant after Create, each table locks itself,
// and pushes, copies and checkpoints of the rows take push_mu_.
#ifndef MONSOON_SERVER_SHARD_SPARSE_TABLES_H_
#define MONSOON_SERVER_SHARD_SPARSE_TABLES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "proto/checkpoint.pb.h"
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
  // `copies`: the ranges' tables this process holds (2 with --replicas=1:
  // its own and its neighbour's backup), each held to 1/copies of the
  // memory.
  static absl::StatusOr<std::unique_ptr<ShardSparseTables>> Create(
      const TrainingConfig& resolved, int shard, int num_shards,
      uint64_t memory_bytes = 0, int copies = 1);

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

  // A replicated range's primary: hands row push `seq`, which it applied at
  // version `step`, to the range's backup (Replication::ForwardRows) and
  // waits for it. Its error is the push's answer.
  using Forward = std::function<absl::Status(int64_t seq, int64_t step)>;

  // The rows of a pull; a push applied at the run's learning rate (or the
  // table's own), `step` marking its rows (the shard's version). A numbered
  // push (request.seq) this shard applied already in the caller's session is
  // answered with `repeat` set and nothing applied. With `forward`, each push
  // applied is forwarded before it is answered. The errors of Find,
  // CheckIdsAreMine and SparseTable::Push; INVALID_ARGUMENT for gradients of
  // the wrong size; the forward's.
  absl::StatusOr<SparsePullResponse> Pull(
      const SparsePullRequest& request) const;
  absl::StatusOr<SparsePushResponse> Push(const SparsePushRequest& request,
                                          int64_t step,
                                          const Forward& forward = nullptr);

  // Backup: a push the range's primary forwarded (request.from_primary) as
  // row push request.replica_seq. The primary forwards one at a time, in
  // order: one applied here already is answered OK (sent again), one that
  // is not the next is DATA_LOSS (the copies differ), as is one that fails
  // here. While a copy of the range is made (BeginRepair) forwards are held
  // and answered OK: they are in this process, and RestoreCopy applies
  // those the copy lacks.
  absl::Status ApplyForwarded(const SparsePushRequest& request);

  // Repair of a backup (Replication::BeginRepair): forwards are held from
  // now on; RestoreCopy replaces the rows, the row-push count and the
  // ranks' last pushes with the copy's (`copy`, of this range), then
  // applies the held forwards that come after it, in order (DATA_LOSS when
  // one is missing: the copy then follows no more). EndRepair drops what
  // was held (the copy failed).
  void BeginRepair();
  absl::Status RestoreCopy(const ShardCheckpoint& copy);
  void EndRepair();

  // Every table's rows (SparseTable::Snapshot), the row-push count and the
  // ranks' last pushes into `checkpoint`, between two pushes.
  void SaveTo(ShardCheckpoint* checkpoint) const;
  // The count and the ranks' last pushes of a checkpoint of this shard
  // (the rows are restored table by table, from any shard count).
  void RestoreMarks(const ShardCheckpoint& checkpoint);
  // Row pushes applied.
  int64_t row_pushes() const;

 private:
  ShardSparseTables(int shard, int num_shards, uint32_t buckets,
                    float run_learning_rate,
                    std::vector<std::unique_ptr<SparseTable>> tables);

  // Applies `request` at `step` (the checks and the tables' push).
  absl::StatusOr<SparsePushResponse> ApplyLocked(
      const SparsePushRequest& request, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(push_mu_);
  // ApplyForwarded's part once it is not held.
  absl::Status ApplyForwardedLocked(const SparsePushRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(push_mu_);
  // Whether `request` (numbered) was applied already in its session.
  bool AppliedLocked(const SparsePushRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(push_mu_);
  void MarkLocked(const SparsePushRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(push_mu_);
  void RestoreMarksLocked(const ShardCheckpoint& checkpoint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(push_mu_);

  // Constant after construction.
  const int shard_;
  const int num_shards_;
  const uint32_t buckets_;
  // TrainingConfig.learning_rate, the same on every copy of a range.
  const float run_learning_rate_;
  const std::vector<std::unique_ptr<SparseTable>> tables_;

  mutable absl::Mutex push_mu_;
  int64_t row_pushes_ ABSL_GUARDED_BY(push_mu_) = 0;
  struct Mark {
    uint64_t session = 0;
    uint64_t seq = 0;
  };
  absl::flat_hash_map<int, Mark> marks_ ABSL_GUARDED_BY(push_mu_);  // by rank
  // Backup being repaired: forwards held until the copy is in.
  bool holding_ ABSL_GUARDED_BY(push_mu_) = false;
  std::vector<SparsePushRequest> held_ ABSL_GUARDED_BY(push_mu_);
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_SHARD_SPARSE_TABLES_H_
