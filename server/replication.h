// Replication (ps_server --replicas=1): shard s's range has a backup in the
// next shard process (s + 1 mod S), which holds a second core (state and
// rule) for it. One Replication per core says what the process is for the
// range and does the range's part of chain replication:
//
// - As PRIMARY, every update the rule applies is forwarded to the backup
//   (Forward) and acknowledged to the worker only once the backup has
//   applied it: nothing acknowledged is lost with one copy. The forwards
//   go one after another on one call kept open for the run
//   (ParameterService.Replicate), opened again if it ends.
// - As BACKUP, it applies forwarded updates in the primary's order, each
//   once (ApplyInOrder), and serves no worker until a worker that lost the
//   primary asks it to take over (TakeOver), which it does only if the
//   primary does not answer it either. Taking over raises the range's
//   epoch; a forward of an older epoch is refused from then on, which
//   fences the old primary should it come back (a frozen process): it
//   stops serving the range at its next update, before acknowledging it.
// - A primary whose backup is gone (its forward fails and the backup does
//   not answer a health check) serves on DEGRADED, without a copy, and
//   says so loudly.
// - REPAIR: a process restarted after a failure finds its ranges moved on
//   (CheckAtStart) and asks the process that serves each for a copy
//   (ParameterService.Repair): that one starts forwarding to it
//   (AttachBackup), then takes the copy; the asker holds the forwards that
//   come meanwhile (BeginRepair), restores the copy, and applies those
//   after it (Repaired). It is then the range's backup, wherever the
//   primary is: a range taken over is served by the next process, its
//   backup back home.
//
// The updates forwarded are the pushes as the rule applied them (float32,
// decoded), with the version the primary's update made as their sequence
// number: the async rules make one version per applied push, so the
// backup's copy applies the same updates in the same order (hogwild's
// primary races its pushes; its backup applies them one at a time).
//
// Thread-safe.
#ifndef MONSOON_SERVER_REPLICATION_H_
#define MONSOON_SERVER_REPLICATION_H_

#include <grpcpp/channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/histogram.h"
#include "proto/service.grpc.pb.h"
#include "server/task_threads.h"
#include "server/update_rule.h"

namespace monsoon::server {

struct ReplicationOptions {
  int range = 0;       // the shard whose range this core holds
  int num_shards = 1;  // --num_shards
  // The other process of the range: the backup's address for a primary,
  // the primary's for a backup.
  std::string peer_address;
  // How forwarded pushes are chunked (float32 values per chunk; a 1-bit
  // push in as many whole buckets as fit in as many bytes).
  size_t chunk_values = 1 << 16;
  // The config's onebit_bucket_size: a 1-bit push is forwarded as it came.
  int onebit_bucket_size = 0;
  // How long a health check of the peer may take before the peer counts as
  // lost (a take-over, or a primary going on without its backup).
  absl::Duration probe_timeout = absl::Milliseconds(500);
  // How long a forward may take (the backup applies it once the updates
  // before it are in).
  absl::Duration forward_timeout = absl::Seconds(2);
  // A backup sent an update this far ahead of the next one it expects
  // (more than can be in flight) stops following: the copies started apart.
  // Updates waiting for their turn are bounded by it too.
  int64_t max_ahead = 1024;
  // Threads for the forwards that block (ForwardThen: a retry after a
  // failure, or one not sent on the call): enough for every rank's pushes
  // in flight.
  int blocking_threads = 4;
  std::string auth_token;  // the run's token, empty: none
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null: plaintext
};

class Replication {
 public:
  enum class Role { kPrimary, kBackup, kDegraded, kFenced };

  // `applied`: the version the range's core starts at.
  static std::unique_ptr<Replication> Primary(ReplicationOptions options,
                                              int64_t applied);
  static std::unique_ptr<Replication> Backup(ReplicationOptions options,
                                             int64_t applied);
  // Ends the forwarding call, if one is open.
  ~Replication();

  // At start-up, asks the range's other process where the range stands, so
  // that a process restarted after a failure does not serve a range that
  // moved on without it: a primary whose backup took the range over while
  // it was down starts FENCED; a backup whose primary is past the version
  // it starts at (the run went on without it) does not follow, and never
  // takes over (its copy would lose what the primary applied). Either is
  // logged, and the copy is then made again (NeedsRepair; ShardServer
  // copies it through ParameterService.Repair). A peer that does not
  // answer (the run is starting) changes nothing.
  // `row_pushes`: the sparse tables' (ShardSparseTables::row_pushes),
  // compared as the version is.
  void CheckAtStart(int64_t version, int64_t row_pushes = 0);

  // Repair (a process restarted after the run went on without it; see
  // ParameterService.Repair). Whether this copy of the range is to be
  // repaired: a primary fenced at start, or a backup that does not follow.
  bool NeedsRepair() const;
  // Copy side: from now on this is the range's backup, but forwarded
  // updates are held, not applied, until Repaired.
  void BeginRepair();
  // The copy now holds the range at `version` of `epoch`: the updates held
  // since BeginRepair that come after it are applied in order (those up to
  // it are in the copy already).
  void Repaired(int64_t version, int64_t epoch);
  // The copy could not be made: the copy neither follows nor takes over.
  void RepairFailed(const std::string& why);
  // Serving side: the range's backup process asks for a copy. From now on
  // every update is forwarded to it (a primary that went on alone forwards
  // again). Returns the range's epoch; FAILED_PRECONDITION when this
  // process does not serve the range.
  absl::StatusOr<int64_t> AttachBackup();
  // ...and the copy was taken at `version`: every update up to it has
  // reached the backup.
  void CopiedAt(int64_t version);

  Role role() const;
  int64_t epoch() const;
  int64_t replicated_updates() const { return replicated_.load(); }
  int64_t take_overs() const { return take_overs_.load(); }
  // Copies of the range this process made from its peer (Repaired).
  int64_t repairs() const { return repairs_.load(); }
  // Forwarding calls (Replicate) this primary opened: one for a run whose
  // backup stays, one more each time the call to it ended.
  int64_t forward_calls() const { return forward_calls_.load(); }
  // Primary: how long each forward the backup applied took, from its send
  // to the backup's acknowledgement (a worker's push, or in sync the
  // step's weights, waits that long for it).
  common::Histogram::Snapshot forward_seconds() const {
    return forward_seconds_.Read();
  }
  // How far the copies are apart, in updates: as primary, those applied up
  // to `version` that the backup has not confirmed yet; as backup, those
  // held for their turn (or for the copy, while it is made); else 0.
  int64_t Lag(int64_t version) const;
  StatsResponse::ReplicaRole role_for_stats() const;

  // The run's close, replicated as the range's updates are:
  // - Primary: ForwardClose sends the close (`request`, closed here) to the
  //   backup, so that the backup's process ends with the run even when it
  //   is the range's home process and no client calls it (a range taken
  //   over, its process back as the backup). OK once the backup took it,
  //   or when there is none (DEGRADED) or it does not answer (gone);
  //   UNAVAILABLE when it answers but did not take it (the finisher calls
  //   CloseRun again: closing is idempotent).
  // - Backup: AcceptFromPrimary says whether a close (or a rank's end,
  //   below) forwarded at `epoch` comes from the range's primary:
  //   FAILED_PRECONDITION unless this copy is the range's backup at that
  //   epoch.
  absl::Status ForwardClose(const CloseRunRequest& request);
  absl::Status AcceptFromPrimary(int64_t epoch) const;

  // A rank's leave or finish (`request`, done here), the same way: the
  // primary tells the backup (LeaveRequest.from_primary), so that a copy
  // that takes the range over knows the rank is gone or done (a run whose
  // worker finished before its range moved can still be closed there).
  // OK once the backup took it, or when there is none or it does not
  // answer; otherwise the backup's refusal. The backup checks the epoch
  // with AcceptFromPrimary.
  absl::Status ForwardSessionEnd(const LeaveRequest& request, bool finished);

  // Row pushes of sparse tables (ShardSparseTables), replicated as the
  // range's other updates are:
  // - Primary: ForwardRows sends row push `seq` (`request`, applied here
  //   at version `step`) to the backup and waits until it is applied there,
  //   retrying as Forward does, with Forward's outcomes. The primary
  //   forwards them one at a time, in the order it applied them.
  // - Backup: AcceptRowsFromPrimary says whether a row push forwarded at
  //   `epoch` is to be taken (as ApplyInOrder refuses an update: DATA_LOSS
  //   once the copies differ, FAILED_PRECONDITION for another epoch or once
  //   taken over); any epoch while the copy is repaired (the tables hold
  //   it). RowsDiverged: a row push could not be applied here, so the
  //   copies differ: this backup neither follows nor takes over until it
  //   is repaired.
  absl::Status ForwardRows(const SparsePushRequest& request, int64_t seq,
                           int64_t step);
  absl::Status AcceptRowsFromPrimary(int64_t epoch) const;
  void RowsDiverged(const std::string& why);
  // Row pushes this primary forwarded and its backup applied.
  int64_t replicated_row_pushes() const {
    return replicated_row_pushes_.load();
  }

  // OK when a worker's call (other than a take-over registration) may be
  // served: a primary (degraded or not) or a backup that took over. Else
  // UNAVAILABLE saying where the range is.
  absl::Status CheckServing() const;

  // A worker lost the primary and asks this backup to take the range over:
  // OK if it has (now or before; *now, if given, says which), UNAVAILABLE
  // while the primary still answers its health check (the worker should
  // retry the primary).
  absl::Status TakeOver(bool* now = nullptr);

  // Backup: applies the forwarded update `seq` of `epoch` by calling
  // `apply` once every update before it has been applied, and each seq
  // once (a seq already applied is answered OK and not applied again),
  // then calls `done` with the outcome: at once, or later from the thread
  // that applies the update before it (nothing blocks). FAILED_PRECONDITION
  // when this backup has taken over (the sender is fenced) or for another
  // epoch; DATA_LOSS once the copies differ.
  void ApplyInOrder(int64_t seq, int64_t epoch,
                    std::function<absl::Status()> apply,
                    std::function<void(absl::Status)> done);
  // The call that forwarded `seq` ended (cancelled) while the update waited
  // for its turn: it is dropped, its `done` called with CANCELLED.
  void Abandon(int64_t seq);

  // Primary: sends the update `push`, applied as version `seq`, to the
  // backup and waits for it to be applied there. OK also when the backup is
  // gone for good (the primary is DEGRADED from then on). UNAVAILABLE when
  // this primary has been fenced (its backup took over: it is not to
  // acknowledge the push) or the backup answers but did not take the
  // update (the worker retries).
  absl::Status Forward(const PushData& push, int64_t seq);
  // The same without blocking the caller: `done` runs with what Forward
  // would return, on the thread that reads the backup's answer when the
  // update goes on the forwarding call and the backup applies it (no thread
  // between the two), else on one of this primary's blocking threads (a
  // retry, a copy that is not primary). `owner` keeps the push's values
  // (and a 1-bit push's bits and scales) alive as long as gRPC holds them;
  // null: the caller keeps them until `done` (the forward then blocks).
  void ForwardThen(const PushData& push, int64_t seq,
                   std::shared_ptr<const void> owner,
                   std::function<void(absl::Status)> done);

  // Primary: waits until every update up to `version` has reached the
  // backup (or the backup is gone). A push that the primary answers as a
  // repeat was applied at some version up to its current one, and its
  // first acknowledgement may have been lost with its forward: the repeat
  // is acknowledged only once that forward is in. UNAVAILABLE when fenced,
  // or when the forwards do not end in time.
  absl::Status AwaitForwarded(int64_t version);

 private:
  class ForwardCall;  // the forwarding call, from the primary's side
  Replication(ReplicationOptions options, Role role, int64_t applied);
  // A call to the peer: its deadline `timeout` from now, and the run's
  // token.
  void PrepareCall(grpc::ClientContext* context, absl::Duration timeout) const;
  // Whether the peer answers a health check within the probe timeout.
  bool PeerAnswers();
  // Backup: whether the primary answers and serves the range (not fenced).
  bool PeerServes();
  // The range's epoch while this copy is its primary with a backup that
  // follows; nullopt otherwise (nothing to forward to).
  std::optional<int64_t> EpochIfPrimary() const;
  // The peer's counters of this range (Stats) through `stub`, within
  // `timeout`; false when it does not answer or holds no copy of the range.
  bool AskPeer(ParameterService::Stub* stub, absl::Duration timeout,
               StatsResponse* peer) const;
  // The header of update `seq` of `epoch` as a forwarded push.
  PushHeader HeaderOf(const PushData& push, int64_t seq, int64_t epoch) const;
  // The forwarding call, opened if none is open (and with it the watchdog
  // that ends a call whose ForwardThen update is overdue).
  std::shared_ptr<ForwardCall> OpenCall();
  // Whether `push` goes to the backup as its bits and scales.
  bool ForwardsOneBit(const PushData& push) const;
  // Update `seq` of `epoch` as the chunks of a forwarded push, their
  // payload made by `slice` (a borrow, or a share of the values' owner).
  std::vector<grpc::ByteBuffer> ChunksOf(
      const PushData& push, int64_t seq, int64_t epoch,
      const std::function<grpc::Slice(const char*, size_t)>& slice) const;
  // A forward's time (forward_seconds) and, when slow, a log line.
  void NoteForward(int64_t seq, absl::Duration took,
                   const grpc::Status& status);
  // The backup has applied update `seq`: counted and confirmed. OK.
  absl::Status Confirm(int64_t seq);
  // Forward's outcome, from the first attempt's `status` on: retries (3 in
  // all) while the backup answers its health check, and what a failure
  // means (fenced; degraded).
  absl::Status SendUntilDone(const PushData& push, int64_t seq, int64_t epoch,
                             grpc::Status status);
  // What a failed attempt (`attempt` of them so far) to forward `what`
  // ("update 7") means: nullopt to send it again (the backup answers its
  // health check, fewer than 3 attempts); OK when the primary goes on
  // without its backup (it is gone, or refused the update: DEGRADED);
  // UNAVAILABLE when this primary was fenced or is stopping.
  std::optional<absl::Status> AfterFailedAttempt(const grpc::Status& status,
                                                 int attempt,
                                                 const std::string& what);
  // One attempt to forward update `seq` of `epoch`, within `timeout`, on a
  // call of its own (Push).
  grpc::Status SendOnce(const PushData& push, int64_t seq, int64_t epoch,
                        absl::Duration timeout);
  // The same on the forwarding call (Replicate), opened if none is open.
  // A forward that times out ends the call: the forwards still on it fail
  // (CANCELLED) and are sent again on a new one, so that none reaches the
  // backup twice at once.
  grpc::Status SendOnCall(const PushData& push, int64_t seq, int64_t epoch,
                          absl::Duration timeout);
  // The primary goes on without its backup, saying `why`; with
  // `tell_backup`, it tells the backup so once it can be reached
  // (TellBackupItIsDetached).
  void DegradeLocked(const std::string& why, bool tell_backup)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Degraded, with the backup not told yet: at most every 200 ms, and one
  // at a time, runs `send`, which sends the backup an update far beyond its
  // next one (seq + 2 max_ahead: an update's copy, TellBackupLaterLocked,
  // or a row push's, TellBackupRowsLaterLocked) and makes it stop
  // following; on one of retries_, so that no push waits for it (a backup
  // that comes back may take up to the probe timeout to answer).
  void TellBackupLaterLocked(std::function<grpc::Status()> send)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TellBackupLaterLocked(const PushData& push, int64_t seq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TellBackupRowsLaterLocked(const SparsePushRequest& request, int64_t seq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a notice is to be sent now.
  bool DetachDueLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the backup answered the notice `send` sent.
  void TellBackupItIsDetached(const grpc::Status& status);
  std::string Describe() const;
  absl::Status ServingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Backup: why forwarded `what` ("update 7") of `epoch` is refused (OK: it
  // is not); applying it; failing every update that waits for its turn.
  absl::Status RefuseLocked(const std::string& what, int64_t epoch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ApplyLocked(int64_t seq,
                           const std::function<absl::Status()>& apply)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies the updates waiting whose turn has come, in order (failing the
  // rest if that makes the copies differ).
  void ApplyWaitingLocked(
      std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>>*
          report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailWaitingLocked(
      std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>>*
          report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ReplicationOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ParameterService::Stub> stub_;
  std::unique_ptr<grpc::GenericStub> generic_stub_;  // Replicate's, raw

  // Primary: the call its forwards go on (one for the run while it works).
  absl::Mutex call_mu_;
  std::shared_ptr<ForwardCall> call_ ABSL_GUARDED_BY(call_mu_);

  mutable absl::Mutex mu_;
  Role role_ ABSL_GUARDED_BY(mu_);
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 1;
  // Backup: the next seq to apply, and the updates that came before their
  // turn.
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  struct Waiting {
    int64_t epoch;
    std::function<absl::Status()> apply;
    std::function<void(absl::Status)> done;
  };
  std::map<int64_t, Waiting> waiting_ ABSL_GUARDED_BY(mu_);
  // Backup: an update failed here, so the copies differ; it neither applies
  // forwards nor takes over from then on.
  bool diverged_ ABSL_GUARDED_BY(mu_) = false;
  // Backup: between BeginRepair and Repaired, forwards are held in waiting_
  // whatever their seq.
  bool repairing_ ABSL_GUARDED_BY(mu_) = false;
  // Primary: every update up to confirmed_through_ is on the backup, and
  // those in confirmed_ (the ones beyond it whose forwards ended first).
  int64_t confirmed_through_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<int64_t> confirmed_ ABSL_GUARDED_BY(mu_);
  // Degraded: whether the backup still has to hear it no longer follows,
  // and when to try next.
  bool detach_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool detach_sending_ ABSL_GUARDED_BY(mu_) = false;  // one in flight
  absl::Time next_detach_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::CondVar confirmed_cv_;
  std::atomic<int64_t> replicated_{0};
  std::atomic<int64_t> replicated_row_pushes_{0};
  std::atomic<int64_t> take_overs_{0};
  std::atomic<int64_t> repairs_{0};
  std::atomic<int64_t> forward_calls_{0};
  common::Histogram forward_seconds_;
  // Set by the destructor: a forward that fails from then on is not tried
  // again.
  std::atomic<bool> stopping_{false};
  // Ends a call whose ForwardThen update is overdue (started by OpenCall).
  absl::Notification stop_watchdog_;
  std::thread watchdog_;
  std::unique_ptr<TaskThreads> retries_;  // options_.blocking_threads
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_REPLICATION_H_
