// SparseTable: one shard's part of a sparse table (proto/config.proto's
// SparseTableConfig): rows of `dim` float32 values keyed by 64-bit ids, in
// one slab, each row's optimizer state beside its values, created when an
// admitted id is first pushed and evicted by the config's rules. A pull of
// an id without a row reads the row's initial values (a pure function of
// the run's seed, the table's name and the id), so pulls never allocate and
// a row reads the same before and after it is created.
//
// Every push is checked whole before anything is written: sizes, repeated
// ids, non-finite values, and room under max_rows.
//
// The slab is one mapping of max_rows rows reserved at creation (address
// space only: pages are committed as rows are made, and a growing table is
// never copied, so memory stays within the rows held), with a hint for huge
// pages: a push touches rows anywhere in a table of hundreds of MB, where
// 4 KiB pages cost a TLB miss a row (where the kernel grants them).
//
// Thread-safe: one mutex per table. (Hogwild's lock-free rows come with the
// wire that feeds them.)
#ifndef MONSOON_SERVER_SPARSE_TABLE_H_
#define MONSOON_SERVER_SPARSE_TABLE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "proto/sparse_table.pb.h"

namespace monsoon::server {

// Counters since the table was made.
struct SparseTableStats {
  int64_t rows = 0;          // held now
  int64_t bytes = 0;         // the slab and the index, about
  int64_t created = 0;       // rows created
  int64_t evicted = 0;       // rows evicted (at max_rows or unseen)
  int64_t row_updates = 0;   // rows updated by pushes
  int64_t not_admitted = 0;  // row gradients dropped: id not admitted yet
  int64_t refused_pushes = 0;  // pushes refused whole (any reason)
};

// What one push did.
struct SparsePushResult {
  int64_t updated = 0;       // rows updated (created ones included)
  int64_t created = 0;       // rows created by this push
  int64_t not_admitted = 0;  // gradients dropped: id not admitted yet
  int64_t evicted = 0;       // rows evicted: to make room, or unseen
};

class SparseTable {
 public:
  // INVALID_ARGUMENT, naming the field and its bounds, for a config out of
  // range (see SparseTableConfig). `seed`: the run's.
  static absl::StatusOr<std::unique_ptr<SparseTable>> Create(
      const SparseTableConfig& config, uint64_t seed);
  ~SparseTable();
  SparseTable(const SparseTable&) = delete;

  // The most memory a table of `config` (valid) takes on one shard once it
  // holds max_rows rows: the rows with their optimizer state, each row's
  // slot and free-list entry (in vectors up to twice their size) and its
  // entries in the id index (at the index's lowest load, just after it
  // grew) and, with admission, in the counts of ids not admitted.
  static uint64_t BytesAtMaxRows(const SparseTableConfig& config);
  SparseTable& operator=(const SparseTable&) = delete;

  const SparseTableConfig& config() const { return config_; }
  int dim() const { return dim_; }

  // The rows of `ids` (repeats allowed) into `out`, ids.size() * dim()
  // values in order. INVALID_ARGUMENT when `out` has another size.
  absl::Status Pull(absl::Span<const uint64_t> ids,
                    absl::Span<float> out) const;

  // Applies one push: `grads` holds a row gradient (dim() values) per id, in
  // order; the ids are distinct (a worker sums a batch's repeats). `step`
  // (the shard's version) marks the rows pushed, for eviction by age: with
  // evict_unseen_steps, a push whose step is SweepEvery() past the last
  // sweep's evicts the rows then unseen (EvictUnseen). The rows move at the
  // table's learning_rate, else `run_learning_rate`.
  // INVALID_ARGUMENT for sizes that disagree, a repeated id, a non-finite
  // gradient or learning rate; RESOURCE_EXHAUSTED when the rows it would
  // create do not fit under max_rows (REFUSE), or are more than max_rows.
  // Nothing is written then.
  absl::StatusOr<SparsePushResult> Push(absl::Span<const uint64_t> ids,
                                        absl::Span<const float> grads,
                                        float run_learning_rate,
                                        int64_t step);

  // Evicts the rows last pushed before `step` - evict_unseen_steps (none
  // when that is 0); returns how many. Push calls it every SweepEvery()
  // steps; the step of the last sweep is in snapshots, so that two copies
  // of the table given the same pushes sweep at the same steps.
  int64_t EvictUnseen(int64_t step);
  // Steps between two sweeps for unseen rows: a tenth of
  // evict_unseen_steps, at least 1 (so a row goes at most a tenth later
  // than its age allows, and a sweep's pass over the rows is spread).
  int64_t SweepEvery() const;

  // Whether `id` has a row.
  bool Contains(uint64_t id) const;
  // `id`'s initial values into `out` (dim() values).
  void InitialRow(uint64_t id, absl::Span<float> out) const;

  SparseTableStats stats() const;

  // The table's rows, their state and its admission counts. `buckets`: the
  // run's virtual buckets, recorded for Restore.
  SparseTableSnapshot Snapshot(uint32_t buckets) const;

  // Adds the rows of `snapshot` (another shard's, or this one's before a
  // restart) whose bucket is in `range` of `buckets`, values and state bit
  // for bit, and their admission counts. Everything is checked first:
  // FAILED_PRECONDITION for a snapshot of another table (name, dim,
  // optimizer) or bucket count; DATA_LOSS for sizes that disagree, a
  // non-finite value or an accumulator not above 0; INVALID_ARGUMENT for an
  // id already here or twice in it; RESOURCE_EXHAUSTED when the rows would
  // pass max_rows. Nothing is added then. Returns the rows added.
  absl::StatusOr<int64_t> Restore(const SparseTableSnapshot& snapshot,
                                  uint32_t first_bucket, uint32_t last_bucket,
                                  uint32_t buckets);
  // Drops every row and admission count (a copy about to be restored over;
  // the counters stay).
  void Clear();

 private:
  SparseTable(const SparseTableConfig& config, uint64_t seed, float* slab,
              size_t slab_bytes);

  struct Slot {
    uint64_t id = 0;
    int64_t last_pushed = 0;
  };
  // Whether the push that makes `count` pushes of `id` admits it.
  bool Admits(uint64_t id, uint32_t count) const;
  // A free slot for `id` with its initial values and state.
  uint32_t NewRow(uint64_t id, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts the least recently pushed rows outside `keep`: `needed`, or a
  // tenth of max_rows if more (the sweep's cost spread over the pushes that
  // follow), as far as there are rows to evict; returns how many.
  int64_t EvictLeastRecent(int64_t needed,
                           const absl::flat_hash_set<uint64_t>& keep)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictSlot(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t EvictUnseenLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyRow(float* row, const float* grad, float learning_rate) const;
  // Starts loading slot's row and its Slot into the cache (nothing for
  // kNoSlot in the .cc).
  void PrefetchRow(uint32_t slot) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const SparseTableConfig config_;
  const int dim_;
  const int state_floats_;  // per row: 0 (sgd), 1 (row-wise), dim (adagrad)
  const int stride_;        // dim_ + state_floats_
  const uint64_t row_seed_;  // the run's seed mixed with the table's name
  const float init_scale_;
  float* const slab_;  // max_rows rows; slot s at s * stride_
  const size_t slab_bytes_;

  mutable absl::Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, uint32_t> index_ ABSL_GUARDED_BY(mu_);
  // Pushes seen of ids not admitted yet (admission by count or chance);
  // at most max_rows entries: when full it starts again.
  absl::flat_hash_map<uint64_t, uint32_t> pending_ ABSL_GUARDED_BY(mu_);
  SparseTableStats stats_ ABSL_GUARDED_BY(mu_);
  // The step of the last sweep for unseen rows.
  int64_t swept_at_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_SPARSE_TABLE_H_
