// ShardState: what every update rule of one shard shares: the shard's
// place in the model, its initial weights, a pool of buffers of its size,
// its version counter with the pulls waiting for a version, and its
// statistics. The weights themselves belong to the rule (update_rule.h):
// most rules publish each version as an immutable Weights, which pulls send
// without copying it. Thread-safe.
#ifndef MONSOON_SERVER_SHARD_STATE_H_
#define MONSOON_SERVER_SHARD_STATE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/histogram.h"
#include "common/model_layout.h"
#include "proto/service.pb.h"
#include "server/buffer_pool.h"
#include "server/data_queue.h"
#include "server/policies/staleness_bound.h"
#include "server/sessions.h"
#include "server/task_threads.h"

namespace monsoon::server {

class Weights;
// A reader's hold on one version of the weights (see Weights::Share).
using WeightsPtr = std::shared_ptr<const Weights>;

// One version of a shard's weights, owned by its update rule. Readers
// (pulls sending it, checkpoints) hold it through Share and see it
// unchanged; the rule writes it in place only while no reader holds it
// (unread()), else it writes the next version into a new buffer.
class Weights {
 public:
  Weights(int64_t version, FloatBufferPool::Buffer values, size_t size)
      : version_(version), values_(std::move(values)), size_(size) {}
  int64_t version() const { return version_; }
  absl::Span<const float> values() const {
    return absl::MakeConstSpan(values_.get(), size_);
  }

  // For the owning rule: the values to write, when unread() (and hogwild's
  // live weights, which it writes with relaxed atomics).
  float* mutable_data() const { return values_.get(); }
  void set_version(int64_t version) { version_ = version; }
  // No reader holds these weights: what readers did with them happened
  // before this returns true.
  bool unread() const { return readers_.load(std::memory_order_acquire) == 0; }

  // A reader's hold on `weights`: counted in unread() until released.
  static WeightsPtr Share(const std::shared_ptr<Weights>& weights);

 private:
  int64_t version_;
  const FloatBufferPool::Buffer values_;
  const size_t size_;
  mutable std::atomic<int64_t> readers_{0};
};

class ShardState {
 public:
  // Pushes with staleness >= this share the last histogram bucket.
  static constexpr int kStalenessBuckets = 1024;

  ShardState(const common::ModelLayout& layout, uint64_t seed, int shard,
             int num_shards);
  ShardState(const ShardState&) = delete;
  ShardState& operator=(const ShardState&) = delete;
  ~ShardState();

  int shard() const { return shard_; }
  int num_shards() const { return num_shards_; }
  common::ShardRange range() const { return range_; }
  size_t size() const { return range_.size(); }

  // Version 0: value i is InitialValue(layout, seed, range().begin + i),
  // or values[i] after SetInitialValues.
  std::shared_ptr<Weights> InitialWeights();
  // Version 0's values from elsewhere (an external model's initial-weights
  // file): size() of them. Call before the rule is made.
  void SetInitialValues(std::vector<float> values) {
    initial_values_ = std::move(values);
  }
  // Buffers of size() floats (pushes, new versions, snapshots).
  FloatBufferPool& buffers() { return buffers_; }
  // Weights of `version` in a pool buffer holding a copy of `values`.
  std::shared_ptr<Weights> MakeWeights(int64_t version,
                                       absl::Span<const float> values);

  int64_t version() const;

  // A callback that a pull registers; it runs once, without locks held.
  using Waiter = std::function<void()>;

  // Runs `ready` once the version is at least `min_version` and, with a
  // `clock_rank` (a worker's pull under bounded staleness, see
  // SetStalenessBound), once that worker is within the bound: at once on
  // this thread if both already hold (returns 0), else later on the thread
  // that advances the version or runs ReleaseWaiters (returns an id for
  // CancelWaiter). If they have not come by `deadline`, ExpireWaiters runs
  // `expired` instead (on its thread). Exactly one of ready, expired and a
  // successful CancelWaiter happens.
  uint64_t WhenVersionAtLeast(int64_t min_version, Waiter ready,
                              absl::Time deadline = absl::InfiniteFuture(),
                              Waiter expired = nullptr, int clock_rank = -1);

  // Bounded staleness (server/policies/staleness_bound.h): a pull of a
  // worker too far ahead of the slowest live worker of the bound's ranks
  // (not left, lease not run out: see Alive) waits until it is not. Call
  // before serving; without it nothing waits for clocks.
  void SetStalenessBound(StalenessBound bound);
  bool has_staleness_bound() const { return bound_.has_value(); }
  // The waiters that a change other than a new version let go (a slow
  // worker's lease ran out, or it left); the ticker runs them.
  std::vector<Waiter> ReleaseWaiters(absl::Time now);
  // For the log: each waiting worker held by the bound, with its clock and
  // the slowest live worker's ("rank 0 at step 12 waits for rank 1 at step
  // 7"); empty when none waits.
  std::vector<std::string> DescribeClockWaits(absl::Time now) const;
  // Runs, outside the lock, the `expired` of every waiter whose deadline is
  // before `now`, and forgets those waiters. ShardServer calls it every
  // fraction of a second.
  void ExpireWaiters(absl::Time now);

  // Removes a waiting callback. True if it was removed before it ran, in
  // which case it never will.
  bool CancelWaiter(uint64_t id);

  // Touches every worker rank whose call waits here for a version (a sync
  // barrier's pull, a pull held by the staleness bound): it is in touch,
  // however long the others take, and its lease does not run out
  // meanwhile. A call whose client went away is cancelled, and so no
  // longer touches its rank. ShardServer's ticker calls it.
  void TouchWaitingRanks();
  // Callbacks waiting for a version (pulls, sync push-pulls).
  size_t NumWaiting() const;

  // Sets the version (rules call it as they apply updates) and returns the
  // waiters it made ready; the caller runs them (RunWaiters) after releasing
  // its own locks.
  std::vector<Waiter> AdvanceVersion(int64_t version);
  // Sets the version, which may go back: the range's copy here was
  // replaced by another's (replication's repair of a fenced primary, which
  // had applied updates its backup refused). Waits for later versions go
  // on waiting.
  void ResetVersion(int64_t version);

  // Runs `ready`: the first on this thread, the others on the shard's
  // helper threads (one fewer than the cores), so that the pulls a version
  // releases (every sync worker's at once) start sending in parallel.
  // Returns once all have run.
  void RunWaiters(std::vector<Waiter> ready);

  // Rules bracket their writes to the weights with these, so that Stats can
  // report how many pushes wrote at the same moment, and the time each
  // write took goes into apply_seconds(). EndApply takes what BeginApply
  // returned.
  absl::Time BeginApply();
  void EndApply(absl::Time began);

  // Tests only: runs at every BeginApply, on the applying thread, so that a
  // test can hold one push inside its apply while another arrives. Set it
  // before any push; it is not synchronized.
  void set_apply_hook_for_testing(std::function<void()> hook) {
    apply_hook_ = std::move(hook);
  }

  // Workers' sessions and leases (server/sessions.h).
  Sessions& sessions() { return sessions_; }
  const Sessions& sessions() const { return sessions_; }
  void set_lease(absl::Duration lease) { sessions_.set_lease(lease); }
  absl::Duration lease() const { return sessions_.lease(); }
  // Sessions::Open. In an elastic run under bounded staleness, a rank
  // that joins starts at the slowest live member's clock, not at the
  // examples it has applied (none, for a new rank): it would hold every
  // member back until it caught up.
  absl::Status OpenSession(int rank, uint64_t session, uint64_t replaces = 0);
  void EndSession(int rank, uint64_t session) { sessions_.End(rank, session); }
  void EndSessionAsPrimaryDid(int rank, uint64_t session) {
    sessions_.EndAsPrimaryDid(rank, session);
  }
  bool HasLeft(int rank) const { return sessions_.HasLeft(rank); }
  absl::Status CheckSession(int rank, uint64_t session) const {
    return sessions_.Check(rank, session);
  }
  void Touch(int rank) { sessions_.Touch(rank); }
  void ForgiveStall(absl::Duration stall) { sessions_.Forgive(stall); }
  bool Alive(int rank, absl::Time now) const {
    return sessions_.Alive(rank, now);
  }
  absl::Duration SinceContact(int rank, absl::Time now) const {
    return sessions_.SinceContact(rank, now);
  }
  std::vector<std::pair<int, absl::Duration>> NewlyLapsed(absl::Time now) {
    return sessions_.NewlyLapsed(now);
  }
  std::map<int, absl::Time> LastContacts() const {
    return sessions_.LastContacts();
  }
  int NumRegistered() const { return sessions_.NumRegistered(); }

  // The time pulls waited for the staleness bound (observed by the service).
  common::Histogram& staleness_wait_seconds() {
    return staleness_wait_seconds_;
  }
  const common::Histogram& staleness_wait_seconds() const {
    return staleness_wait_seconds_;
  }

  // Distributions for metrics: each write of the weights (BeginApply to
  // EndApply), and in sync each push-pull's wait at the barrier, from its
  // push to its step's close (observed by the service).
  const common::Histogram& apply_seconds() const { return apply_seconds_; }
  common::Histogram& barrier_wait_seconds() { return barrier_wait_seconds_; }
  const common::Histogram& barrier_wait_seconds() const {
    return barrier_wait_seconds_;
  }

  // Checkpoint writes (ShardServer::SaveCheckpoint): when the last one that
  // succeeded ended (InfinitePast: none), how long each took, failures.
  void RecordCheckpoint(absl::Time ended, absl::Duration took, bool ok);
  struct CheckpointStats {
    absl::Time last_written = absl::InfinitePast();
    int64_t failures = 0;
  };
  CheckpointStats checkpoint_stats() const;
  const common::Histogram& checkpoint_seconds() const {
    return checkpoint_seconds_;
  }

  // Statistics.
  void RecordPush(int64_t staleness, int64_t samples, int64_t bytes);
  // Examples from `worker_rank` whose update is now in the weights.
  void RecordAppliedSamples(int worker_rank, int64_t samples);
  int64_t AppliedSamples(int worker_rank) const;

  // Where `worker_rank`'s applied data ends (PushHeader.sample_offset).
  int64_t SamplePosition(int worker_rank) const;
  // Whether examples [offset, offset + samples) of the rank are all behind
  // its position: a repeat, counted as a duplicate push.
  bool IsRepeat(int worker_rank, int64_t offset, int64_t samples);
  // Moves the rank's position to offset + samples if that is further.
  void AdvancePosition(int worker_rank, int64_t offset, int64_t samples);
  // IsRepeat, and if not, AdvancePosition, at once: false for a repeat
  // (which the caller acknowledges without applying), true when the caller
  // is to apply the examples.
  bool ClaimSamples(int worker_rank, int64_t offset, int64_t samples);
  // Moves the rank's position past its next `samples` examples without
  // applying them (a sync step closed without the rank), counted as
  // skipped.
  void SkipSamples(int worker_rank, int64_t samples);
  // Moves the rank's position to offset + samples (if that is further)
  // without applying them: a sync step whose update was refused. Counted as
  // skipped.
  void PassOver(int worker_rank, int64_t offset, int64_t samples);
  // An update refused as one that would overflow (StatsResponse).
  void RecordRefusedUpdate();
  // A sync push of `bytes` on the wire dropped because its step closed
  // without it (backup workers): counted, its bytes with the pushed ones.
  void RecordBackupDrop(int64_t bytes);
  // A push refused with `code`; returns the pushes refused so far.
  int64_t RecordRejectedPush(absl::StatusCode code);
  // A sparse table's push of `bytes` serialized bytes (rows, not a push
  // of the dense vector: no push, sample or staleness counted).
  void RecordSparsePushBytes(int64_t bytes);
  void RecordPulledBytes(int64_t bytes);
  // The end of a run. The worker count is set before serving, constant
  // after (without it, no rank counts as the last to finish).
  void SetNumWorkers(int num_workers);
  // Elastic runs (TrainingConfig.elastic), set before serving: the worker
  // count is the most ranks; the workers have finished once one has
  // finished (the data queue is done) and no other is live and
  // unfinished. `queue`: shard 0's data queue, null elsewhere.
  void SetElastic(std::unique_ptr<DataQueue> queue);
  // Shard 0's data queue for `config`, reading this shard's ledger.
  std::unique_ptr<DataQueue> MakeDataQueue(int epochs, int64_t batch_size,
                                           int shard_batches);
  bool elastic() const { return elastic_; }
  DataQueue* data_queue() { return data_queue_.get(); }
  // The rank is gone (left, lease ran out, replaced by another process):
  // its data shards go back to the queue (shard 0). True if any did.
  bool ReleaseData(int rank);
  // Releases the data of the ranks silent for one and a half leases (a
  // worker that died): the ranks released. Half a lease more than the
  // barrier waits: a live sync worker waits at another shard's barrier, and
  // calls nothing here, until a dead worker's lease runs out there. A live
  // worker silent longer (only slow) loses nothing: what it trained of a
  // shard released meanwhile is counted when it says so
  // (server/data_queue.h), and the shard trained twice at worst.
  std::vector<int> ReleaseSilentData(absl::Time now);
  // Restores the data queue from a checkpoint's Stats (shard 0).
  absl::Status RestoreDataQueue(const StatsResponse& stats);
  // Whether every worker has finished (see SetElastic).
  bool WorkersFinished() const;
  // `rank` trained all its examples (RegisterRequest.finished): counted
  // once, kept in Stats() and so in the checkpoint. True when it was the
  // last rank of [0, num_workers) to finish.
  bool FinishRank(int rank);
  // Closes the run (the finisher collected its results): OK once every
  // rank has finished, then run_closed() is notified (idempotent);
  // FAILED_PRECONDITION, saying which ranks have not, before.
  // `closed_by_primary`: a backup copy whose primary closed the run (and
  // checked the ranks there): closed without the check.
  absl::Status CloseRun(bool closed_by_primary = false);
  const absl::Notification& run_closed() const { return run_closed_; }
  StatsResponse Stats() const;
  // Replaces the counters with those of an earlier Stats() (from a
  // checkpoint), so that metrics continue across a restart. Ignores its
  // shard, version and max_concurrent_applies.
  void RestoreStats(const StatsResponse& stats);

 private:
  // Constant after construction.
  const int shard_;
  const int num_shards_;
  const common::ShardRange range_;
  const common::ModelLayout layout_;
  const uint64_t seed_;
  std::vector<float> initial_values_;  // SetInitialValues; empty: the seed's
  FloatBufferPool buffers_;

  mutable absl::Mutex waiters_mu_;
  int64_t version_ ABSL_GUARDED_BY(waiters_mu_) = 0;
  uint64_t next_waiter_id_ ABSL_GUARDED_BY(waiters_mu_) = 1;
  struct Pending {
    int64_t min_version;
    Waiter ready;
    absl::Time deadline;
    Waiter expired;
    int clock_rank;   // -1: no clock condition
    int caller_rank;  // the worker whose call waits; -1: none
  };
  using Clocks = StalenessBound::Clocks;
  // Reads the applied examples and the leases (not under waiters_mu_).
  Clocks ReadClocks(absl::Time now) const;
  // The examples each rank's clock counts: those applied, plus where its
  // clock started (clock_offsets_).
  std::map<int, int64_t> ClockExamples() const;
  // Takes the ready waiters out (under waiters_mu_).
  std::vector<Waiter> TakeReady(const Clocks* clocks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(waiters_mu_);
  // Set before serving (SetStalenessBound), constant after.
  std::optional<StalenessBound> bound_;
  common::Histogram staleness_wait_seconds_;
  std::map<uint64_t, Pending> waiters_ ABSL_GUARDED_BY(waiters_mu_);

  // Helper threads for RunWaiters, started on first use.
  absl::Mutex helpers_mu_;
  std::unique_ptr<TaskThreads> helpers_ ABSL_GUARDED_BY(helpers_mu_);

  std::function<void()> apply_hook_;
  common::Histogram apply_seconds_;
  common::Histogram barrier_wait_seconds_;
  common::Histogram checkpoint_seconds_;
  std::atomic<int> applying_{0};
  std::atomic<int> max_applying_{0};

  Sessions sessions_;
  // Set before serving (SetElastic), constant after.
  bool elastic_ = false;
  std::unique_ptr<DataQueue> data_queue_;

  mutable absl::Mutex stats_mu_;
  int64_t pushes_ ABSL_GUARDED_BY(stats_mu_) = 0;
  int64_t rejected_pushes_ ABSL_GUARDED_BY(stats_mu_) = 0;
  // Keyed by absl::StatusCodeToString's names.
  std::map<std::string, int64_t> rejected_by_code_ ABSL_GUARDED_BY(stats_mu_);
  int64_t samples_ ABSL_GUARDED_BY(stats_mu_) = 0;
  int64_t bytes_pushed_ ABSL_GUARDED_BY(stats_mu_) = 0;
  int64_t bytes_pulled_ ABSL_GUARDED_BY(stats_mu_) = 0;
  int64_t staleness_max_ ABSL_GUARDED_BY(stats_mu_) = 0;
  int64_t staleness_sum_ ABSL_GUARDED_BY(stats_mu_) = 0;
  std::vector<int64_t> staleness_counts_ ABSL_GUARDED_BY(stats_mu_);
  std::map<int, int64_t> applied_samples_ ABSL_GUARDED_BY(stats_mu_);
  std::map<int, int64_t> positions_ ABSL_GUARDED_BY(stats_mu_);
  std::map<int, int64_t> skipped_samples_ ABSL_GUARDED_BY(stats_mu_);
  int64_t duplicate_pushes_ ABSL_GUARDED_BY(stats_mu_) = 0;
  int64_t refused_updates_ ABSL_GUARDED_BY(stats_mu_) = 0;
  int num_workers_ ABSL_GUARDED_BY(stats_mu_) = 0;
  std::set<int> finished_ranks_ ABSL_GUARDED_BY(stats_mu_);
  // Elastic runs under bounded staleness: examples added to a rank's
  // applied ones for its clock, so that a joiner's starts at the slowest
  // live member's (OpenSession).
  std::map<int, int64_t> clock_offsets_ ABSL_GUARDED_BY(stats_mu_);
  // Under stats_mu_: whether the workers have finished.
  bool FinishedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(stats_mu_);
  double first_push_unix_s_ ABSL_GUARDED_BY(stats_mu_) = 0;
  // When the workers were first seen finished (NoteFinishedLocked); 0
  // before. Mutable: Stats() notes it too.
  mutable double workers_finished_unix_s_ ABSL_GUARDED_BY(stats_mu_) = 0;
  // Notes the time if the workers have finished and it is not noted yet;
  // whether it did.
  bool NoteFinishedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(stats_mu_);
  absl::Notification run_closed_;
  int64_t backup_dropped_ ABSL_GUARDED_BY(stats_mu_) = 0;
  CheckpointStats checkpoints_ ABSL_GUARDED_BY(stats_mu_);
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_SHARD_STATE_H_
