// Shard: what one parameter-server shard does, on decoded requests and
// without gRPC: registering a worker rank, its leaving and finishing, the
// run's close, admitting a pull, applying a push (with the session check,
// the lease and the answer to a repeat), the version a push-pull waits for,
// and the shard's statistics. The gRPC service (server/parameter_service)
// only authenticates, decodes and streams; everything a shard decides is
// here, so that the sync barrier, leases, bounded staleness and repeats are
// tested without sockets (tests/shard_test.cc).
//
// The state (ShardState) and the rule (UpdateRule) are not owned. Every
// method is thread-safe: each takes its locks inside ShardState and the
// rule.
#ifndef MONSOON_SERVER_SHARD_H_
#define MONSOON_SERVER_SHARD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/config.pb.h"
#include "proto/service.pb.h"
#include "server/rendezvous.h"
#include "server/replication.h"
#include "server/shard_sparse_tables.h"
#include "server/shard_state.h"
#include "server/task_threads.h"
#include "server/update_rule.h"

namespace monsoon::server {

// A push applied (or answered as a repeat) by Shard::ApplyPush.
struct AppliedPush {
  PushResult result;
  // The push that the pull of a push-pull answers with: the version that
  // includes it (Shard::VersionToAwait).
  int64_t base_version = 0;
  // A sync push that the step in progress already holds (sent again while
  // its step is still collecting).
  bool repeat_in_step = false;
  // Replicated: the push is acknowledged only after Shard::Replicate.
  bool replicate = false;
};

class Shard {
 public:
  // `num_workers`: the run's worker count (every daemon's --num_workers).
  // `max_wait`: how long a pull waits for a version before it is answered
  // DEADLINE_EXCEEDED (see WaitExpired).
  // `sparse`: the shard's sparse tables, not owned (null: the run has
  // none).
  // `replication`: the range's replication (server/replication.h), not
  // owned; null without --replicas.
  Shard(const TrainingConfig& resolved, int num_workers, ShardState* state,
        UpdateRule* rule, absl::Duration max_wait,
        ShardSparseTables* sparse = nullptr,
        Replication* replication = nullptr);

  // Checks that the caller belongs to this run (config fingerprint, shard,
  // worker and shard counts, rank) and opens the rank's session. Refusals:
  // FAILED_PRECONDITION for another run's caller (or a leave from an older
  // build), INVALID_ARGUMENT for a wrong shard or rank, ALREADY_EXISTS or
  // INVALID_ARGUMENT from ShardState::OpenSession.
  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& request);

  // Ends the rank's session (Leave) or ends it and counts the rank as
  // finished (FinishRank). PERMISSION_DENIED unless `request.session` holds
  // the rank (or the shard has not seen the rank register, as after its
  // restart); nothing changes then.
  absl::Status Leave(const LeaveRequest& request);
  absl::Status FinishRank(const LeaveRequest& request);

  // Closes the run (ShardState::CloseRun): FAILED_PRECONDITION until every
  // worker rank has finished. Replicated, only the copy that serves the
  // range takes the finisher's close, and forwards it to the range's backup
  // before answering (Replication::ForwardClose); the backup takes it from
  // its primary (CloseRunRequest.from_primary) without the check.
  absl::Status CloseRun(const CloseRunRequest& request);

  // Checks a pull before it waits: shard, rank (-1: an evaluator, which
  // needs no session), min_version, the rank's session; renews the rank's
  // lease.
  absl::Status AdmitPull(const PullRequest& request);

  // Only the process that holds the rank may push for it: checked as soon
  // as a push's header is in, and again by ApplyPush. A refusal is counted
  // and logged (RejectPush). A push `forwarded` by the range's primary
  // (replication) is checked by its order and epoch instead.
  absl::Status CheckPushSession(int rank, uint64_t session,
                                bool forwarded = false);

  // Applies a whole push (its session checked, its rank's lease renewed).
  // With replication, the result has `replicate` set: the push is
  // acknowledged only after Replicate.
  // With `answer_repeats` (a push-pull), a push that the shard holds
  // already (ALREADY_EXISTS: its sync step is still collecting) or that is
  // too stale to apply (ABORTED: its step has closed) is answered rather
  // than refused: as a duplicate, or as stale, so that it still gets
  // weights. Other refusals are counted.
  absl::StatusOr<AppliedPush> ApplyPush(const PushData& push,
                                        bool answer_repeats);
  // Replication's part of a push ApplyPush applied: waits until the
  // range's backup has applied it (Replication::Forward), or, for a
  // repeat, every update up to its version (AwaitForwarded). Blocks: not
  // for gRPC's threads. UNAVAILABLE when the backup took the range over
  // (this process is fenced) and the push is not to be acknowledged.
  absl::Status Replicate(const PushData& push, const AppliedPush& applied);
  // The same without blocking: `done` gets Replicate's outcome, on the
  // thread that reads the backup's answer where it can (a worker's push
  // forwarded on the forwarding call: Replication::ForwardThen), else from
  // one of `tasks`. `owner` keeps the push's values alive while gRPC holds
  // them (null: the caller keeps them until `done`).
  void ReplicateThen(const PushData& push, const AppliedPush& applied,
                     std::shared_ptr<const void> owner, TaskThreads* tasks,
                     std::function<void(absl::Status)> done);
  // Replicated: tells the range's backup that the rank left or finished
  // here (Replication::ForwardSessionEnd); a refusal is logged.
  void TellBackupOfSessionEnd(const LeaveRequest& request, bool finished);
  // After this copy took the range over: a lease from now for each rank
  // the range has applied examples of (see shard.cc).
  void AdoptRanks();
  // OK when `what` (a close, a rank's end), forwarded by the range's
  // primary at `epoch`, is this copy's to take: it is the range's backup
  // at that epoch (Replication::AcceptFromPrimary). FAILED_PRECONDITION
  // otherwise, and where this range is not replicated.
  absl::Status AcceptFromPrimary(int64_t epoch, const std::string& what) const;
  // `status` with this shard named in front of its message (OK as it is).
  absl::Status OfThisShard(const absl::Status& status) const;
  // What the range's backup is sent of `push`: the push itself, or, where
  // the rule applied another gradient (delay compensation:
  // PushResult::applied_gradient), that gradient as float32, valid as long
  // as `applied`'s.
  static PushData ForwardOf(const PushData& push, const AppliedPush& applied);

  // A push forwarded by the range's primary (PushData::replica_seq), applied
  // in the primary's order (Replication::ApplyInOrder); `done` gets the
  // outcome, at once or from the thread that applies the update before it.
  // AbandonForwarded: its call ended while it waited.
  void ApplyForwarded(const PushData& push,
                      std::function<void(absl::StatusOr<AppliedPush>)> done);
  void AbandonForwarded(int64_t seq);

  // Counts a push refused before ApplyPush (a bad stream), and logs why
  // (the first 10, then the 16th, 32nd, 64th...: a client that sends
  // nothing but bad pushes cannot flood the log).
  void RejectPush(const absl::Status& status);

  // The version whose weights answer a push-pull: in sync the step's close
  // (the rule answers with the version still collecting until then), in
  // the other modes the version the push made. A repeat of examples
  // already applied, or a stale push, gets the weights as they are (0); a
  // repeat of a sync push still being collected, the weights once its step
  // closes.
  static int64_t VersionToAwait(const AppliedPush& push);

  // The weights to send `rank` (-1: an evaluator) that holds
  // `have_version`, and notes that it pulled them.
  UpdateRule::PullAnswer Pull(int rank, std::optional<int64_t> have_version);

  // The answer to a call (`what`: "pull", "push-pull") whose wait for
  // `min_version` outlasted max_wait: DEADLINE_EXCEEDED saying what it
  // waited for (the slowest worker, under bounded staleness).
  absl::Status WaitExpired(const char* what, int64_t min_version) const;

  // Rows of a sparse table by id (ShardSparseTables): the caller's run and
  // shard checked as for Leave, and a worker rank's session (a push also
  // renews its lease; pulls of rank -1, an evaluator, need none). A push
  // applies at the run's learning rate, marking its rows with the shard's
  // version, once (a numbered push sent again is answered as a repeat).
  // Replicated, it is answered only once the range's backup has applied it
  // too (Replication::ForwardRows). FAILED_PRECONDITION when the run has
  // no sparse tables.
  absl::StatusOr<SparsePullResponse> SparsePull(
      const SparsePullRequest& request);
  absl::StatusOr<SparsePushResponse> SparsePush(
      const SparsePushRequest& request);
  // A row push the range's primary forwarded (from_primary): applied in
  // the primary's order (ShardSparseTables::ApplyForwarded), refused as
  // Replication::AcceptRowsFromPrimary says.
  absl::StatusOr<SparsePushResponse> SparsePushFromPrimary(
      const SparsePushRequest& request);

  // All-reduce's rendezvous (Rendezvous): the caller checked as for a
  // sparse push (a worker rank holding its session; its lease renewed).
  // FAILED_PRECONDITION unless the run's mode is ALLREDUCE and this is
  // shard 0.
  absl::Status RendezvousSet(const RendezvousSetRequest& request);
  absl::StatusOr<RendezvousGetResponse> RendezvousGet(
      const RendezvousGetRequest& request);

  // The shard's counters (ShardState::Stats) and its sparse tables' rows.
  StatsResponse Stats() const;
  // The resolved config the shard runs (StatsRequest.with_config).
  const TrainingConfig& config() const { return config_; }

  // Replication: the range's backup process asks for a copy
  // (ParameterService.Repair): updates are forwarded to it from now on,
  // and the answer holds the range as it is. FAILED_PRECONDITION for
  // another run's caller or when this process does not serve the range.
  absl::StatusOr<RepairResponse> Repair(const RepairRequest& request);

  // Elastic runs (TrainingConfig.elastic), shard 0: the rank's next data
  // shard from the queue (server/data_queue.h), `request.done` its last.
  // FAILED_PRECONDITION on another shard or in a run that is not elastic,
  // or for a training set of another size than the run's; PERMISSION_DENIED
  // for a rank another session holds.
  absl::StatusOr<TakeDataResponse> TakeData(const TakeDataRequest& request);

  int num_workers() const { return num_workers_; }
  absl::Duration max_wait() const { return max_wait_; }
  ShardState* state() const { return state_; }
  UpdateRule* rule() const { return rule_; }

 private:
  // OK when a call from `fingerprint` for `shard` belongs to this shard.
  absl::Status CheckCaller(uint64_t fingerprint, int shard) const;
  // The checks of a sparse call's caller; `push`: a rank of -1 may not.
  absl::Status CheckSparseCaller(const SparseCaller& caller, bool push);
  // The checks of a rendezvous call's caller.
  absl::Status CheckRendezvousCaller(const SparseCaller& caller);
  // OK unless replication says this process does not serve the range now
  // (a backup that has not taken over, a fenced primary): UNAVAILABLE.
  absl::Status CheckServing() const;
  // The checks of Leave and FinishRank; then ends the session.
  absl::Status EndSession(const LeaveRequest& request, const char* what);
  // Replicated sync (on publisher_'s thread, in the order the steps
  // closed): forwards `step` to the range's backup, then publishes its
  // version (the waits for it end: the step is acknowledged). A primary
  // fenced meanwhile publishes nothing; the waits end UNAVAILABLE and their
  // workers follow the range to its backup.
  void PublishStep(const std::shared_ptr<const SyncStep>& step);

  // Constant after construction.
  const TrainingConfig config_;
  const uint64_t fingerprint_;
  const int num_workers_;
  ShardState* const state_;
  UpdateRule* const rule_;
  const absl::Duration max_wait_;
  const Mode mode_;
  ShardSparseTables* const sparse_;
  Replication* const replication_;  // null: not replicated

  Rendezvous rendezvous_;
  // Replicated sync: the thread that forwards closed steps (PublishStep).
  // Last: it stops, with every step handed to it forwarded, first.
  std::unique_ptr<TaskThreads> publisher_;
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_SHARD_H_
