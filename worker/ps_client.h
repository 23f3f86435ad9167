// PsClient: a worker's (or evaluator's) connection to every shard, and
// nothing but transport: it registers, moves finished payloads to the shards
// and weights back, and never encodes (GradientPusher prepares pushes).
// ps_client.cc holds the pushes and pulls, ps_client_session.cc the
// registration and the run's lifecycle; the calls to one shard are in
// shard_calls.h and shard_streams.h, the pull decoder in pull_decoder.h.
// Requests reach all shards in parallel, one streaming RPC per shard,
// through gRPC's callback API; tensors cross as common/wire.h says, without
// a copy on the way out and with one on the way in.
//
// Thread-safe for calls that do not share output buffers; counters are
// atomic. A PendingCall must be waited on before its buffers go away.
#ifndef MONSOON_WORKER_PS_CLIENT_H_
#define MONSOON_WORKER_PS_CLIENT_H_

#include <grpcpp/channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/model_layout.h"
#include "common/wire.h"
#include "proto/config.pb.h"
#include "proto/service.grpc.pb.h"
#include "worker/parameter_client.h"
#include "worker/ring.h"
#include "worker/shard_calls.h"

namespace monsoon::worker {

struct PsClientOptions {
  // In shard order: host:port, or unix:PATH.
  std::vector<std::string> server_addresses;
  TrainingConfig config;                      // resolved
  int worker_rank = 0;                        // -1 for an evaluator
  // The worker count this client was started with, which every shard checks
  // against its own (0: not checked, an evaluator).
  int num_workers = 0;
  // How long Connect keeps trying to reach a shard that is not up yet.
  absl::Duration connect_timeout = absl::Seconds(60);
  // How often Connect logs which shard it still waits for, and why (zero:
  // never).
  absl::Duration log_every = absl::ZeroDuration();
  // How long a shard may stay silent before its connection counts as lost
  // (a frozen or partitioned host): the channel pings it after half of
  // this without traffic and gives up when the other half passes without an
  // answer; the calls on it then fail with UNAVAILABLE.
  absl::Duration peer_timeout = absl::Seconds(30);
  // If set, notifying it ends every call at once with CANCELLED (a daemon's
  // SIGTERM).
  const absl::Notification* stop = nullptr;
  // The run's secret (common/auth.h), sent with every call; empty: none.
  std::string auth_token;
  // TLS (common/tls.h); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // The session the rank registers with (RegisterRequest.session); 0: one
  // drawn at random at Connect.
  uint64_t session = 0;
  // The session of a process of this rank that died, which this one
  // replaces (RegisterRequest.replaces_session); 0: none.
  uint64_t replaces_session = 0;
};

// What the shards acknowledged to a client and lost of it (its rank's
// pushes), for the count that says whether a failure lost acknowledged
// updates: a push a shard acknowledged as applied whose examples are past
// where the shard (or the backup that took its range over) says the rank's
// data is when the client comes back after losing it (Reconnect) is lost.
struct ReplicaLedger {
  int64_t updates_acknowledged = 0;  // pushes acknowledged as applied
  // Pushes answered as a duplicate: sent again after a failure lost their
  // first answer (or ended the call before it came), and applied once, on
  // the first sending.
  int64_t updates_answered_as_duplicate = 0;
  int64_t updates_lost = 0;
  int64_t examples_lost = 0;
  int64_t take_overs = 0;  // ranges this client saw taken over
};

class PsClient : public ParameterClient, public RingRendezvous {
 public:
  // Registers with every shard, retrying with backoff while they start.
  // UNAVAILABLE names the address that could not be reached in time;
  // FAILED_PRECONDITION carries a shard's config-mismatch message.
  static absl::StatusOr<std::unique_ptr<PsClient>> Connect(
      const PsClientOptions& options);

  // After a call failed because a shard was lost (UNAVAILABLE: it stopped,
  // restarted, or stayed silent past peer_timeout): registers with every
  // shard again, each retried with backoff until `timeout` from now, and
  // logs every `log_every` which shard it waits for and for how long. Then
  // initial_versions() and applied_samples() are the shards' current ones
  // (a shard restarted from a checkpoint may be behind). UNAVAILABLE naming
  // the shard that did not come back in time; CANCELLED on stop; a shard
  // that now refuses the client (another config) gets its error. The next
  // push is marked as the repeat of a step (PushHeader.repeat): a sync shard
  // that has its examples keeps the first push even if its values differ.
  absl::Status Reconnect(absl::Duration timeout,
                         absl::Duration log_every) override;

  // Tells every shard this worker is done (or stopping): its lease ends now,
  // so that no sync step waits for it and its rank is free at once. One
  // attempt per shard within `timeout`; the first error is returned (a
  // shard that does not hear it lets the lease run out instead). With
  // `finished`, the worker trained all its examples: the shards count its
  // rank as finished (StatsResponse.finished_ranks).
  absl::Status Leave(absl::Duration timeout, bool finished = false) override;

  // For a launcher's client (rank -1) that saw the process of worker `rank`
  // registered as `session` exit, and starts none in its place: ends that
  // session on every shard as the process's own Leave would have, so that
  // its data shards (elastic runs) go back to the queue and no sync step
  // waits for it, at once rather than once its lease runs out. A shard
  // where another process holds the rank by now refuses it
  // (PERMISSION_DENIED). One attempt per shard within `timeout`; the first
  // error is returned.
  absl::Status EndSessionOf(int rank, uint64_t session, absl::Duration timeout);

  // Whether every shard counts this client's rank as finished
  // (StatsResponse.finished_ranks): a worker that trained all its examples
  // and told them so. An error when a shard cannot be asked.
  absl::StatusOr<bool> RankFinished(absl::Duration timeout);

  // For the run's finisher (a client of rank -1): tells every shard that
  // the run's results are collected, so that each saves its final
  // checkpoint and stops (RegisterRequest.finished). FAILED_PRECONDITION
  // from a shard whose workers have not all finished; the first error is
  // returned, after every shard was asked.
  absl::Status CloseRun(absl::Duration timeout);

  int num_shards() const override { return static_cast<int>(shards_.size()); }
  const std::vector<common::ShardRange>& ranges() const override {
    return ranges_;
  }
  // Versions the shards reported at registration.
  const std::vector<int64_t>& initial_versions() const {
    return initial_versions_;
  }
  std::vector<int64_t> versions_at_reconnect() const override {
    return initial_versions_;
  }
  // Where a restarted worker of this client's rank resumes its data: the
  // examples the shards had passed at registration (applied, or skipped by
  // sync steps that closed without the rank). The least over the shards,
  // except in sync mode, where it is the most: the step the barrier is at.
  int64_t applied_samples() const override { return applied_samples_; }
  // Replaces PsClientOptions.stop for the calls started from now on (null:
  // none is cancelled; each still has its deadline).
  void set_stop(const absl::Notification* stop) { stop_ = stop; }
  const TrainingConfig& config() const override { return config_; }

  using ParameterClient::Pull;
  using ParameterClient::PullAsync;
  // See ParameterClient; under pull_compression, a shard sends the 1-bit
  // difference from the weights `params` hold, added in place.
  std::unique_ptr<PendingCall> PullAsync(
      const std::vector<int64_t>& min_versions, absl::Duration timeout,
      absl::Span<float> params, std::vector<int64_t>* versions,
      bool params_hold_versions = false) override;

  // A push computed from base_versions[s] on shard s, summarizing `samples`
  // examples, handed over shard by shard (see ShardedPush). Payload bytes
  // are borrowed through `lease` (not owned), whose owner waits for it
  // before reusing them. results (if not null) gets each shard's answer.
  // With `pull`, each shard then sends the weights of the version that
  // includes the push into pull->params, in the same call. Every push has
  // a deadline: pull->timeout with a pull, else the config's
  // call_timeout_s.
  // `sample_offset` is where the push's examples begin in this rank's data
  // (PushHeader.sample_offset): a shard that has applied them answers with
  // duplicate set and applies nothing.
  std::unique_ptr<ShardedPush> StartPush(
      const std::vector<int64_t>& base_versions, int64_t samples,
      int64_t sample_offset, common::BufferLease* lease,
      std::vector<PushResponse>* results,
      const PullTarget* pull = nullptr) override;

  // Pushes float32 `grads` (all parameters) and waits: a convenience for
  // tools and tests over StartPush, whose sample offsets follow on from
  // this client's last (from applied_samples() at Connect and Reconnect).
  // INVALID_ARGUMENT
  // for a config that pushes another encoding.
  absl::Status Push(absl::Span<const float> grads,
                    const std::vector<int64_t>& base_versions, int64_t samples,
                    std::vector<PushResponse>* results = nullptr);

  // Every range's counters, from the process that serves it: where the
  // process this client calls for a range answers that it only holds its
  // backup (or was fenced), the range's other process is asked.
  absl::StatusOr<std::vector<StatsResponse>> Stats(absl::Duration timeout);

  // What a sparse call does when a shard's part of it failed: called with
  // that shard's error (named), it waits for the shard to come back
  // (ScriptWorker::RideOut: a reconnection, a take-over with replicas) and
  // returns OK, and the shards that failed are asked again; or it returns
  // the error that ends the call. Null: the call ends with the first error.
  using RideOut = std::function<absl::Status(const absl::Status& lost)>;
  // The most times one sparse call rides out a lost shard.
  static constexpr int kMaxRideOutsPerCall = 8;

  // Sparse tables (TrainingConfig.sparse_tables): the rows of `ids` of
  // table `table` into `out` (dim values per id, in order; repeats are
  // asked once), each id asked of the shard that owns its bucket, the
  // shards at once. NOT_FOUND for a table the run does not have;
  // INVALID_ARGUMENT when `out` has another size; a shard's error, naming
  // it.
  absl::Status SparsePull(const std::string& table,
                          absl::Span<const uint64_t> ids, absl::Span<float> out,
                          absl::Duration timeout,
                          const RideOut& ride_out = nullptr);
  // Row gradients `grads` (dim values per id) of `ids`, repeats summed,
  // each to the shard of its bucket, the shards at once; each shard's
  // answer summed into *result (if not null). The push is numbered
  // (SparsePushRequest.seq; `seq` 0: NextRowPushSeq()): asked again after a
  // lost shard, or sent again with the same `seq`, a shard that had
  // applied it answers it as a repeat and applies nothing. The errors of
  // SparsePull.
  absl::Status SparsePush(const std::string& table,
                          absl::Span<const uint64_t> ids,
                          absl::Span<const float> grads, absl::Duration timeout,
                          SparsePushResponse* result = nullptr,
                          const RideOut& ride_out = nullptr, uint64_t seq = 0);
  // A number for the next row push of this client's session.
  uint64_t NextRowPushSeq() { return row_push_seq_.fetch_add(1) + 1; }

  // The all-reduce ring's rendezvous (RingRendezvous, mode ALLREDUCE): keys
  // on shard 0, each call within 10 s; a shard's refusal names the shard.
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::optional<std::string>> Get(
      const std::string& key) override;

  ReplicaLedger ledger() const;

  // Elastic runs: the next data shard from shard 0's queue, one attempt
  // within `timeout`; an error names shard 0.
  absl::StatusOr<TakeDataResponse> TakeData(
      int64_t examples_per_epoch, const std::optional<DataShardRef>& done,
      int64_t next_offset, absl::Duration timeout) override;

  // Serialized bytes this client has sent in pushes and received in pulls.
  int64_t bytes_pushed() const override { return bytes_pushed_.load(); }
  int64_t bytes_pulled() const override { return bytes_pulled_.load(); }

  using Shard = ShardConnection;

 private:
  // Leave (or, `finished`, FinishRank) for `rank` registered as `session`,
  // on every shard: Leave's and EndSessionOf's call.
  absl::Status EndSession(int rank, uint64_t session, absl::Duration timeout,
                          bool finished);
  friend class ShardedPushImpl;

  // Of two shards' positions for this rank, the one to resume from
  // (applied_samples()).
  int64_t ResumePoint(int64_t a, int64_t b) const;
  // Makes `call` (a unary call to shard s on its stub, in the context
  // given) to every shard, one attempt each within `timeout`; the first
  // error.
  absl::Status CallEverywhere(
      absl::Duration timeout,
      const std::function<grpc::Status(int s, grpc::ClientContext* context)>&
          call);
  PsClient() = default;
  // One rendezvous call to shard 0 (`method` of its stub), the request's
  // caller filled in (this run, rank and session), within 10 s; an error
  // names shard 0 and `what` was asked.
  template <typename Request, typename Response, typename Method>
  absl::Status CallRendezvous(Method method, Request* request,
                              Response* response, const std::string& what);
  // Sends requests[s] (those with ids) to the shards through `start`, all
  // at once, within `timeout` each time; a shard whose part failed is
  // asked again after `ride_out` (see RideOut). On return every shard that
  // answered has its response in (*responses)[s]; the first error that
  // ended the call, naming its shard.
  template <typename Request, typename Response, typename Start>
  absl::Status CallShardsRidingOut(std::vector<Request> requests,
                                   std::vector<Response>* responses,
                                   absl::Duration timeout,
                                   const RideOut& ride_out, const Start& start);
  // The dim of `table`: NOT_FOUND when the run has no such table.
  absl::StatusOr<int> SparseDim(const std::string& table) const;
  // One request per shard for `table` (the caller's run, shard, rank and
  // session filled in), each distinct id in its shard's, with
  // add_row(shard, index in ids, request) called after each id is added.
  template <typename Request, typename AddRow>
  std::vector<Request> SparseRequests(const std::string& table,
                                      const std::vector<uint64_t>& ids,
                                      const AddRow& add_row) const;
  // Registers with shard s, retrying with backoff while it is unreachable,
  // until `deadline`; logs the wait every `log_every` (zero: never). `why`
  // ends the message of the UNAVAILABLE it returns at the deadline.
  // Time this process did not run (a stopped process, a paused machine)
  // does not count: an attempt that ended over a second past its own
  // deadline, or a backoff that did, is logged, and moves `deadline` by
  // that time (NoteStall).
  absl::StatusOr<RegisterResponse> RegisterWith(int s, absl::Time deadline,
                                                absl::Duration log_every,
                                                const std::string& why);
  void NoteStall(int s, absl::Duration stall, absl::Time* deadline);
  // How long TakeOver waits for the backup's answer at most.
  static constexpr absl::Duration kTakeOverWait = absl::Seconds(2);
  // With replicas: asks the backup of shard s's range (the next shard's
  // process) to take the range over, within `deadline`; on success the
  // calls for shard s go there from now on (logged with `why`, what shard
  // s's own process answered). UNAVAILABLE while the backup still hears
  // from the primary.
  absl::StatusOr<RegisterResponse> TakeOver(int s,
                                            const RegisterRequest& request,
                                            absl::Time deadline,
                                            const std::string& why);
  // Whether the next shard's process holds a copy of shard s's range (asked
  // when shard s has not answered yet, so replicas_ is not known).
  bool NextHoldsBackup(int s);
  // After shard s refused this client's registration FAILED_PRECONDITION:
  // where its config differs from this client's, `refused` with the
  // fields that differ added (asked of the shard: StatsRequest.with_config);
  // else `refused` as it is.
  absl::Status WithConfigDifferences(int s, absl::Status refused);
  // A connection to the process of range s's other copy: the next shard's
  // process, or s's own after a take-over.
  Shard OtherProcessOf(int s) const;
  // Whether a process's Stats of a range say it does not serve it (it
  // holds the range's backup, or was fenced): its other copy does.
  static bool OnlyBacksUp(const StatsResponse& stats);
  // A connection to `address` with this client's channel settings.
  Shard Connection(const std::string& address) const;

  // Constant after Connect.
  TrainingConfig config_;
  uint64_t fingerprint_ = 0;  // ConfigFingerprint(config_)
  int worker_rank_ = 0;
  int num_workers_ = 0;
  uint64_t session_ = 0;      // drawn at Connect (RegisterRequest.session)
  uint64_t replaces_session_ = 0;  // PsClientOptions.replaces_session
  absl::Duration log_every_;  // PsClientOptions.log_every
  const absl::Notification* stop_ = nullptr;
  std::vector<Shard> shards_;
  // Every shard's address as given (server_addresses), and how each range
  // is replicated (RegisterResponse.replicas: 0, or 1 backup in the next
  // shard's process); whether shard s's range is served by the next
  // shard's process now (taken over; a take-over back, once shard s's
  // process has been repaired, clears it).
  std::vector<std::string> addresses_;
  int replicas_ = 0;
  std::vector<bool> taken_over_;
  absl::Duration peer_timeout_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  std::string authorization_;
  std::vector<common::ShardRange> ranges_;
  std::vector<int64_t> initial_versions_;
  int64_t applied_samples_ = 0;

  int64_t next_sample_offset_ = 0;  // Push's
  // Set by Reconnect, taken by the next push: it repeats a step
  // (PushHeader.repeat).
  std::atomic<bool> repeat_next_push_{false};
  // The ledger: per shard, the end of the furthest examples it acknowledged
  // to this rank (applied, or held already), and the ends of the last
  // pushes it acknowledged as applied (at most kLedgerPushes).
  static constexpr size_t kLedgerPushes = 4096;
  // Notes shard s's answer to a push of examples [offset, end).
  void NoteAcknowledged(int s, int64_t end, bool duplicate);
  // Counts what shard s lost of the rank's acknowledged pushes, now that
  // it says the rank's data is at `position`.
  void NoteResumed(int s, int64_t position);
  mutable absl::Mutex ledger_mu_;
  std::vector<int64_t> acknowledged_end_ ABSL_GUARDED_BY(ledger_mu_);
  std::vector<std::deque<int64_t>> acknowledged_pushes_
      ABSL_GUARDED_BY(ledger_mu_);
  ReplicaLedger ledger_ ABSL_GUARDED_BY(ledger_mu_);
  std::atomic<int64_t> bytes_pushed_{0};
  std::atomic<uint64_t> row_push_seq_{0};  // the last NextRowPushSeq
  std::atomic<int64_t> bytes_pulled_{0};
};

// A worker process's session (RegisterRequest.session): random, never 0.
uint64_t DrawSession();

// A channel with Monsoon's message-size limits and keepalive pings (see
// PsClientOptions::peer_timeout), with `credentials` (null: plaintext).
std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& address, absl::Duration peer_timeout = absl::Seconds(30),
    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_PS_CLIENT_H_
