#include "server/replication.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/socket_buffers.h"
#include "common/wire.h"
#include "proto/health.grpc.pb.h"

namespace monsoon::server {
namespace {

// A forward that takes longer is logged (Replication::SendOnCall).
constexpr absl::Duration kSlowForward = absl::Milliseconds(200);

}  // namespace

// ParameterService.Replicate from the primary's side: the updates go one
// after another (each update's chunks together, raw messages that borrow
// the update's values: common/wire.h), one write at a time from a queue;
// each Send waits for its update's ReplicaAck, and each SendThen's
// continuation runs with it, on the thread that read it. Once the call
// ends (the backup gone or stopping, or Cancel), every update waiting on it
// fails with the call's status. Deletes nothing: it lives while the
// Replication or a Send holds it, and until gRPC is done with it.
class Replication::ForwardCall
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  static std::shared_ptr<ForwardCall> Open(grpc::GenericStub* stub,
                                           const ReplicationOptions& options) {
    std::shared_ptr<ForwardCall> call(new ForwardCall());
    call->self_ = call;  // until OnDone
    if (!options.auth_token.empty()) {
      call->context_.AddMetadata(common::kAuthMetadataKey,
                                 common::BearerValue(options.auth_token));
    }
    call->context_.AddMetadata(common::kRangeMetadataKey,
                               absl::StrCat(options.range));
    stub->PrepareBidiStreamingCall(&call->context_, common::kReplicateMethod,
                                   grpc::StubOptions(), call.get());
    // Writes start outside gRPC's reactions (Send): held until the call
    // ends and no write is in flight (Close), so that none starts on a call
    // that is done.
    call->AddHold();
    call->StartRead(&call->in_);
    call->StartCall();
    return call;
  }

  // Whether a new call is needed: this one ended, or is ending.
  bool ended() {
    absl::MutexLock lock(&mu_);
    return done_ || cancelled_ || closing_;
  }

  // Sends `chunks` (update `seq`) and waits for its acknowledgement until
  // `deadline`; at the deadline the call is cancelled. The chunks' slices
  // may outlive the call: the caller waits for gRPC to let go of them.
  grpc::Status Send(std::vector<grpc::ByteBuffer> chunks, int64_t seq,
                    absl::Time deadline) {
    bool write = false;
    {
      absl::MutexLock lock(&mu_);
      if (done_ || cancelled_ || closing_) return Ended();
      waiting_[seq] = std::nullopt;
      for (grpc::ByteBuffer& chunk : chunks) queue_.push_back(std::move(chunk));
      if (!writing_) write = NextLocked();
    }
    if (write) StartWrite(&out_);
    bool cancel = false;
    {
      absl::MutexLock lock(&mu_);
      auto answered = [this, seq]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        auto it = waiting_.find(seq);
        return done_ || (it != waiting_.end() && it->second.has_value());
      };
      while (!answered()) {
        if (cv_.WaitWithDeadline(&mu_, deadline)) break;
      }
      auto it = waiting_.find(seq);
      if (it != waiting_.end() && it->second.has_value()) {
        grpc::Status status = *it->second;
        waiting_.erase(it);
        return status;
      }
      waiting_.erase(seq);
      if (done_) return Ended();
      cancel = !cancelled_;
      cancelled_ = true;
    }
    if (cancel) context_.TryCancel();  // without the lock: it may react here
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        absl::StrCat("the backup did not acknowledge update ",
                                     seq, " in time"));
  }

  using Then = std::function<void(grpc::Status)>;

  // Sends `chunks` (update `seq`) without waiting: `then` runs with the
  // backup's answer, on the thread that reads it, or with the call's end
  // if it ends first (CancelIfOverdue ends it once `deadline` is past).
  // False, and `then` dropped, when the call has ended or is ending.
  bool SendThen(std::vector<grpc::ByteBuffer> chunks, int64_t seq,
                absl::Time deadline, Then then) {
    bool write = false;
    {
      absl::MutexLock lock(&mu_);
      if (done_ || cancelled_ || closing_) return false;
      continued_[seq] = Continued{deadline, std::move(then)};
      for (grpc::ByteBuffer& chunk : chunks) queue_.push_back(std::move(chunk));
      if (!writing_) write = NextLocked();
    }
    if (write) StartWrite(&out_);
    return true;
  }

  // Cancels the call when an update sent by SendThen has waited for its
  // answer past its deadline: every update still on the call then fails
  // (CANCELLED) and is sent again on a new one.
  void CancelIfOverdue(absl::Time now) {
    {
      absl::MutexLock lock(&mu_);
      if (done_ || cancelled_) return;
      bool overdue = false;
      for (const auto& [seq, continued] : continued_) {
        overdue = overdue || continued.deadline < now;
      }
      if (!overdue) return;
      cancelled_ = true;
    }
    common::LogWarning(
        "an update forwarded to the range's backup was not acknowledged in "
        "time: the forwarding call is ended and its updates sent again");
    context_.TryCancel();  // without the lock: it may react here
  }

  // Ends the call and waits (a while) for gRPC to be done with it.
  void Cancel() {
    {
      absl::MutexLock lock(&mu_);
      if (done_) return;
      cancelled_ = true;
    }
    context_.TryCancel();
    absl::MutexLock lock(&mu_);
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (!done_) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) break;
    }
  }

  void OnWriteDone(bool ok) override {
    bool write = false;
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      out_.Clear();              // lets go of the values it borrowed
      if (!ok) closing_ = true;  // the call is broken
      if (closing_) {
        queue_.clear();
        release = !released_;
        released_ = true;
      } else {
        write = NextLocked();
      }
    }
    if (release) RemoveHold();
    if (write) StartWrite(&out_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the call is over: OnDone follows once no write is left
      bool release = false;
      {
        absl::MutexLock lock(&mu_);
        closing_ = true;
        queue_.clear();
        release = !writing_ && !released_;
        if (release) released_ = true;
      }
      if (release) RemoveHold();
      return;
    }
    ReplicaAck ack;
    const bool parsed = common::ParseSmallMessage(in_, &ack).ok();
    in_.Clear();
    Then then;
    grpc::Status answer;
    if (parsed) {
      answer = grpc::Status(static_cast<grpc::StatusCode>(ack.code()),
                            ack.message());
      absl::MutexLock lock(&mu_);
      if (auto c = continued_.find(ack.replica_seq()); c != continued_.end()) {
        then = std::move(c->second.then);
        continued_.erase(c);
      } else if (auto it = waiting_.find(ack.replica_seq());
                 it != waiting_.end()) {
        it->second = answer;
        cv_.SignalAll();
      }
    }
    StartRead(&in_);
    if (then) then(answer);
  }

  void OnDone(const grpc::Status& status) override {
    std::shared_ptr<ForwardCall> self;
    std::vector<Then> thens;
    grpc::Status ended;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      status_ = status.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                           "the backup ended the forwarding "
                                           "call")
                            : status;
      ended = status_;
      for (auto& [seq, continued] : continued_) {
        thens.push_back(std::move(continued.then));
      }
      continued_.clear();
      cv_.SignalAll();
      self = std::move(self_);
    }
    for (Then& then : thens) then(ended);
    // `self` may be the last reference: the call goes with it.
  }

 private:
  ForwardCall() = default;

  grpc::Status Ended() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (done_) return status_;
    if (cancelled_) {
      return grpc::Status(grpc::StatusCode::CANCELLED,
                          "the forwarding call was given up");
    }
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the forwarding call is ending");
  }

  // Takes the next chunk to write, if any; the caller writes it without
  // the lock.
  bool NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (queue_.empty() || closing_) return false;
    out_ = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    return true;
  }

  grpc::ClientContext context_;
  grpc::ByteBuffer in_;
  grpc::ByteBuffer out_;  // the chunk being written (writing_)
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  // The updates sent and not answered yet: their outcome once it came.
  std::map<int64_t, std::optional<grpc::Status>> waiting_ ABSL_GUARDED_BY(mu_);
  // The same for SendThen's: what to run with the answer.
  struct Continued {
    absl::Time deadline;
    Then then;
  };
  std::map<int64_t, Continued> continued_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // The reads ended (the call is over) or a write failed: nothing more is
  // written, and the hold goes (released_) once no write is in flight.
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<ForwardCall> self_ ABSL_GUARDED_BY(mu_);
};

Replication::~Replication() {
  stopping_.store(true);
  if (watchdog_.joinable()) {
    stop_watchdog_.Notify();
    watchdog_.join();
  }
  std::shared_ptr<ForwardCall> call;
  {
    absl::MutexLock lock(&call_mu_);
    call = std::move(call_);
  }
  if (call != nullptr) call->Cancel();
  // The forwards that failed with it end here (stopping_), each answered.
  retries_.reset();
}

Replication::Replication(ReplicationOptions options, Role role, int64_t applied)
    : options_(std::move(options)),
      role_(role),
      next_seq_(applied + 1),
      confirmed_through_(applied),
      retries_(std::make_unique<TaskThreads>(
          std::max(1, options_.blocking_threads))) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(common::kMaxMessageBytes);
  args.SetMaxSendMessageSize(common::kMaxMessageBytes);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  common::SetUnixSocketBuffers(&args);
  channel_ = grpc::CreateCustomChannel(
      options_.peer_address,
      options_.credentials != nullptr ? options_.credentials
                                      : grpc::InsecureChannelCredentials(),
      args);
  stub_ = ParameterService::NewStub(channel_);
  generic_stub_ = std::make_unique<grpc::GenericStub>(channel_);
}

std::unique_ptr<Replication> Replication::Primary(ReplicationOptions options,
                                                  int64_t applied) {
  return std::unique_ptr<Replication>(
      new Replication(std::move(options), Role::kPrimary, applied));
}

std::unique_ptr<Replication> Replication::Backup(ReplicationOptions options,
                                                 int64_t applied) {
  return std::unique_ptr<Replication>(
      new Replication(std::move(options), Role::kBackup, applied));
}

void Replication::CheckAtStart(int64_t version, int64_t row_pushes) {
  // On a channel of its own: a peer that is not up yet would leave the
  // forwards' channel backing off its reconnection.
  grpc::ChannelArguments args;
  std::unique_ptr<ParameterService::Stub> stub =
      ParameterService::NewStub(grpc::CreateCustomChannel(
          options_.peer_address,
          options_.credentials != nullptr ? options_.credentials
                                          : grpc::InsecureChannelCredentials(),
          args));
  StatsResponse peer;
  if (!AskPeer(stub.get(), absl::Seconds(1), &peer)) return;
  absl::MutexLock lock(&mu_);
  // Row pushes move no version: the copies' counts of them are compared too.
  const bool peer_ahead =
      peer.version() > version || peer.row_pushes() > row_pushes;
  if (role_ == Role::kPrimary &&
      (peer.replica_role() == StatsResponse::DEGRADED || peer_ahead)) {
    // Taken over, or about to be: the backup holds updates this process
    // lost with its restart.
    role_ = Role::kFenced;
    epoch_ = std::max<int64_t>(1, peer.range_epoch() - 1);
    common::LogWarning(
        "the backup of the %s at %s is at version %d (epoch %d) and this "
        "process restarted at %d: it holds what this one lost, so this "
        "process does not serve the range (its clients move to the backup); "
        "it copies the range back from there and becomes its backup",
        Describe(), options_.peer_address, peer.version(), peer.range_epoch(),
        version);
  } else if (role_ == Role::kBackup && peer_ahead) {
    diverged_ = true;
    common::LogWarning(
        "the primary of the %s at %s is at version %d (%d row pushes) and "
        "this backup starts at %d (%d): the run went on without this "
        "process; it copies the range again before it follows",
        Describe(), options_.peer_address, peer.version(), peer.row_pushes(),
        version, row_pushes);
  }
}

bool Replication::NeedsRepair() const {
  absl::MutexLock lock(&mu_);
  return role_ == Role::kFenced || (role_ == Role::kBackup && diverged_);
}

void Replication::BeginRepair() {
  std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>>
      report;
  {
    absl::MutexLock lock(&mu_);
    FailWaitingLocked(&report);
    role_ = Role::kBackup;
    diverged_ = false;
    repairing_ = true;
  }
  for (auto& [callback, status] : report) callback(status);
}

void Replication::Repaired(int64_t version, int64_t epoch) {
  std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>>
      report;
  {
    absl::MutexLock lock(&mu_);
    repairing_ = false;
    epoch_ = epoch;
    next_seq_ = version + 1;
    repairs_.fetch_add(1);
    // Held meanwhile: those the copy has already, then those after it.
    while (!waiting_.empty() && waiting_.begin()->first <= version) {
      Waiting held = std::move(waiting_.begin()->second);
      const int64_t seq = waiting_.begin()->first;
      waiting_.erase(waiting_.begin());
      absl::Status status =
          RefuseLocked(absl::StrCat("update ", seq), held.epoch);
      report.emplace_back(std::move(held.done), std::move(status));
    }
    ApplyWaitingLocked(&report);
    common::Log(
        "this process holds the backup of the %s again: copied from %s at "
        "version %d (epoch %d), and follows it from there",
        Describe(), options_.peer_address, version, epoch);
  }
  for (auto& [callback, status] : report) callback(status);
}

void Replication::RepairFailed(const std::string& why) {
  std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>>
      report;
  {
    absl::MutexLock lock(&mu_);
    repairing_ = false;
    diverged_ = true;
    FailWaitingLocked(&report);
    common::LogWarning(
        "the %s could not be copied from %s (%s): this process holds no "
        "backup of it, and the range runs without one",
        Describe(), options_.peer_address, why);
  }
  for (auto& [callback, status] : report) callback(status);
}

absl::StatusOr<int64_t> Replication::AttachBackup() {
  // The channel to the peer may be waiting out a reconnection backoff from
  // while the process was down: a forward now would fail at once, and the
  // backup be given up again. It connects first (the asker is up).
  grpc::experimental::ChannelResetConnectionBackoff(channel_.get());
  if (!channel_->WaitForConnected(
          absl::ToChronoTime(absl::Now() + options_.forward_timeout))) {
    return absl::UnavailableError(absl::StrCat(
        "the ", Describe(), " cannot reach its backup's process at ",
        options_.peer_address, " that asked for a copy"));
  }
  absl::MutexLock lock(&mu_);
  if (role_ != Role::kPrimary && role_ != Role::kDegraded) {
    return absl::FailedPreconditionError(ServingLocked().message());
  }
  if (role_ == Role::kDegraded) {
    common::Log(
        "the %s has a backup again: %s copies it, and every update is "
        "forwarded to it from now on",
        Describe(), options_.peer_address);
  }
  role_ = Role::kPrimary;
  detach_pending_ = false;
  return epoch_;
}

void Replication::CopiedAt(int64_t version) {
  absl::MutexLock lock(&mu_);
  confirmed_through_ = std::max(confirmed_through_, version);
  while (!confirmed_.empty() && *confirmed_.begin() <= confirmed_through_ + 1) {
    confirmed_through_ = std::max(confirmed_through_, *confirmed_.begin());
    confirmed_.erase(confirmed_.begin());
  }
  confirmed_cv_.SignalAll();
}

int64_t Replication::Lag(int64_t version) const {
  absl::MutexLock lock(&mu_);
  switch (role_) {
    case Role::kPrimary:
      return std::max<int64_t>(0, version - confirmed_through_);
    case Role::kBackup:
      return static_cast<int64_t>(waiting_.size());
    default:
      return 0;
  }
}

Replication::Role Replication::role() const {
  absl::MutexLock lock(&mu_);
  return role_;
}

int64_t Replication::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

StatsResponse::ReplicaRole Replication::role_for_stats() const {
  switch (role()) {
    case Role::kPrimary:
      return StatsResponse::PRIMARY;
    case Role::kBackup:
      return StatsResponse::BACKUP;
    case Role::kDegraded:
      return StatsResponse::DEGRADED;
    case Role::kFenced:
      return StatsResponse::FENCED;
  }
  return StatsResponse::UNREPLICATED;
}

std::string Replication::Describe() const {
  return absl::StrCat("range of shard ", options_.range);
}

absl::Status Replication::CheckServing() const {
  absl::MutexLock lock(&mu_);
  return ServingLocked();
}

absl::Status Replication::ServingLocked() const {
  const int next = (options_.range + 1) % options_.num_shards;
  switch (role_) {
    case Role::kPrimary:
    case Role::kDegraded:
      return absl::OkStatus();
    case Role::kBackup:
      return absl::UnavailableError(absl::StrCat(
          "this process holds the backup of the ", Describe(),
          ", whose primary at ", options_.peer_address,
          " serves it; a client that cannot reach the primary asks for a "
          "take-over"));
    case Role::kFenced:
      return absl::UnavailableError(absl::StrCat(
          "this process no longer serves the ", Describe(),
          ": its backup (shard ", next, "'s process, ", options_.peer_address,
          ") took it over at epoch ", epoch_ + 1,
          " while this one did not answer; ask that one"));
  }
  return absl::OkStatus();
}

void Replication::PrepareCall(grpc::ClientContext* context,
                              absl::Duration timeout) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!options_.auth_token.empty()) {
    context->AddMetadata(common::kAuthMetadataKey,
                         common::BearerValue(options_.auth_token));
  }
}

bool Replication::PeerAnswers() {
  std::unique_ptr<grpc::health::v1::Health::Stub> health =
      grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext context;
  PrepareCall(&context, options_.probe_timeout);
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = health->Check(&context, request, &response);
  return status.ok() &&
         response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

bool Replication::AskPeer(ParameterService::Stub* stub, absl::Duration timeout,
                          StatsResponse* peer) const {
  grpc::ClientContext context;
  PrepareCall(&context, timeout);
  StatsRequest request;
  request.set_shard(options_.range);
  return stub->Stats(&context, request, peer).ok() &&
         peer->shard() == options_.range;
}

std::optional<int64_t> Replication::EpochIfPrimary() const {
  absl::MutexLock lock(&mu_);
  if (role_ != Role::kPrimary) return std::nullopt;
  return epoch_;
}

absl::Status Replication::ForwardClose(const CloseRunRequest& request) {
  const std::optional<int64_t> epoch = EpochIfPrimary();
  if (!epoch.has_value()) return absl::OkStatus();  // no backup that follows
  CloseRunRequest forwarded = request;
  forwarded.set_shard(options_.range);
  forwarded.set_from_primary(true);
  forwarded.set_replica_epoch(*epoch);
  grpc::Status status;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    grpc::ClientContext context;
    PrepareCall(&context, options_.forward_timeout);
    CloseRunResponse response;
    status = stub_->CloseRun(&context, forwarded, &response);
    if (status.ok()) return absl::OkStatus();
    if (!PeerAnswers()) {
      common::Log(
          "the %s is closed; its backup at %s does not answer (it has "
          "stopped), so the close was not forwarded to it",
          Describe(), options_.peer_address);
      return absl::OkStatus();
    }
  }
  return absl::UnavailableError(absl::StrCat(
      "the run is closed for the ", Describe(), ", but its backup at ",
      options_.peer_address, " answers and did not take the close (",
      status.error_message(), "); close the run again"));
}

absl::Status Replication::ForwardSessionEnd(const LeaveRequest& request,
                                            bool finished) {
  const std::optional<int64_t> epoch = EpochIfPrimary();
  if (!epoch.has_value()) return absl::OkStatus();  // no backup that follows
  LeaveRequest forwarded = request;
  forwarded.set_shard(options_.range);
  forwarded.set_from_primary(true);
  forwarded.set_replica_epoch(*epoch);
  grpc::ClientContext context;
  PrepareCall(&context, options_.forward_timeout);
  LeaveResponse response;
  const grpc::Status status =
      finished ? stub_->FinishRank(&context, forwarded, &response)
               : stub_->Leave(&context, forwarded, &response);
  if (status.ok() || !PeerAnswers()) return absl::OkStatus();
  return absl::Status(
      static_cast<absl::StatusCode>(status.error_code()),
      absl::StrCat("the backup of the ", Describe(), " at ",
                   options_.peer_address, " did not take rank ",
                   request.worker_rank(), finished ? "'s finish" : "'s leave",
                   ": ", status.error_message()));
}

absl::Status Replication::AcceptFromPrimary(int64_t epoch) const {
  absl::MutexLock lock(&mu_);
  if (role_ != Role::kBackup || epoch != epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a close of the run (or a rank's end) forwarded at "
        "epoch ",
        epoch, " is refused: this process is not the backup of the ",
        Describe(), " at that epoch (its epoch is ", epoch_, ")"));
  }
  return absl::OkStatus();
}

bool Replication::PeerServes() {
  StatsResponse peer;
  return AskPeer(stub_.get(), options_.probe_timeout, &peer) &&
         peer.replica_role() != StatsResponse::FENCED &&
         peer.replica_role() != StatsResponse::BACKUP;
}

absl::Status Replication::TakeOver(bool* now) {
  if (now != nullptr) *now = false;
  {
    absl::MutexLock lock(&mu_);
    if (role_ != Role::kBackup) return ServingLocked();
    if (diverged_) {
      return absl::UnavailableError(absl::StrCat(
          "the backup of the ", Describe(),
          " cannot take it over: its copy differs from the primary's (an "
          "update failed here); retry the primary at ",
          options_.peer_address));
    }
  }
  // Asked outside the lock: forwards go on meanwhile (the primary may still
  // be alive, and the worker only cut off from it).
  if (PeerServes()) {
    return absl::UnavailableError(absl::StrCat(
        "the primary of the ", Describe(), " at ", options_.peer_address,
        " still answers its backup: retry it (a take-over happens only when "
        "neither the client nor the backup can reach it)"));
  }
  std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>>
      report;
  {
    absl::MutexLock lock(&mu_);
    if (role_ != Role::kBackup) return ServingLocked();
    role_ = Role::kDegraded;
    ++epoch_;
    take_overs_.fetch_add(1);
    // Updates that waited for one that never came: the primary acknowledged
    // none of them, and the fenced process is told so.
    FailWaitingLocked(&report);
    common::LogWarning(
        "took over the %s at epoch %d after its primary at %s stopped "
        "answering: it had forwarded %d updates, all applied here; the range "
        "now has no backup (a failure of this process loses its updates "
        "since its last checkpoint)",
        Describe(), epoch_, options_.peer_address, next_seq_ - 1);
  }
  for (auto& [callback, status] : report) callback(status);
  if (now != nullptr) *now = true;
  return absl::OkStatus();
}

void Replication::ApplyInOrder(int64_t seq, int64_t epoch,
                               std::function<absl::Status()> apply,
                               std::function<void(absl::Status)> done) {
  // The outcomes to report once the lock is let go, in order.
  std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>>
      report;
  {
    absl::MutexLock lock(&mu_);
    // Being repaired, every forward is held until the copy is in
    // (Repaired), whatever its seq.
    const bool hold = repairing_ && role_ == Role::kBackup;
    if (!hold && role_ == Role::kBackup && !diverged_ &&
        seq >= next_seq_ + options_.max_ahead) {
      diverged_ = true;
      common::LogWarning(
          "the backup of the %s is at update %d and was sent update %d, far "
          "beyond its next: its primary went on without it (or the copies "
          "started apart); this backup stops following until it has copied "
          "the range again",
          Describe(), next_seq_ - 1, seq);
      FailWaitingLocked(&report);
    }
    absl::Status refused;
    if (!hold) refused = RefuseLocked(absl::StrCat("update ", seq), epoch);
    if (!refused.ok()) {
      report.emplace_back(std::move(done), std::move(refused));
    } else if (!hold && seq < next_seq_) {
      report.emplace_back(std::move(done), absl::OkStatus());  // sent again
    } else if (hold || seq > next_seq_) {
      // Not its turn yet: kept until the updates before it are in.
      if (waiting_.count(seq) > 0) {
        report.emplace_back(
            std::move(done),
            absl::AlreadyExistsError(absl::StrCat(
                "update ", seq, " was forwarded twice at once")));
      } else {
        waiting_.emplace(seq,
                         Waiting{epoch, std::move(apply), std::move(done)});
      }
    } else {
      report.emplace_back(std::move(done), ApplyLocked(seq, apply));
      ApplyWaitingLocked(&report);  // then those that waited for it
    }
  }
  for (auto& [callback, status] : report) callback(status);
}

absl::Status Replication::RefuseLocked(const std::string& what,
                                       int64_t epoch) const {
  if (diverged_) {
    return absl::DataLossError(absl::StrCat(
        "the backup of the ", Describe(),
        " no longer follows its primary: an earlier update failed here"));
  }
  if (role_ != Role::kBackup || epoch != epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " of epoch ", epoch, " refused: this process took the ",
        Describe(), " over at epoch ", epoch_,
        "; the process that forwarded it is fenced and must not acknowledge "
        "it"));
  }
  return absl::OkStatus();
}

absl::Status Replication::ApplyLocked(
    int64_t seq, const std::function<absl::Status()>& apply) {
  if (absl::Status applied = apply(); !applied.ok()) {
    diverged_ = true;
    return absl::DataLossError(absl::StrCat(
        "the backup of the ", Describe(), " could not apply update ", seq,
        " that its primary applied (", applied.ToString(),
        "): the copies differ; the range goes on without a backup"));
  }
  ++next_seq_;
  replicated_.fetch_add(1);
  return absl::OkStatus();
}

void Replication::ApplyWaitingLocked(
    std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>>*
        report) {
  while (!waiting_.empty() && waiting_.begin()->first == next_seq_) {
    Waiting next = std::move(waiting_.begin()->second);
    const int64_t seq = waiting_.begin()->first;
    waiting_.erase(waiting_.begin());
    absl::Status status =
        RefuseLocked(absl::StrCat("update ", seq), next.epoch);
    if (status.ok()) status = ApplyLocked(seq, next.apply);
    report->emplace_back(std::move(next.done), std::move(status));
  }
  if (diverged_) FailWaitingLocked(report);
}

void Replication::FailWaitingLocked(
    std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>>*
        report) {
  for (auto& [seq, waiting] : waiting_) {
    report->emplace_back(
        std::move(waiting.done),
        RefuseLocked(absl::StrCat("update ", seq), waiting.epoch));
  }
  waiting_.clear();
}

void Replication::Abandon(int64_t seq) {
  std::function<void(absl::Status)> done;
  {
    absl::MutexLock lock(&mu_);
    auto it = waiting_.find(seq);
    if (it == waiting_.end()) return;
    done = std::move(it->second.done);
    waiting_.erase(it);
  }
  done(absl::CancelledError(
      absl::StrCat("forwarded update ", seq, " was cancelled")));
}

PushHeader Replication::HeaderOf(const PushData& push, int64_t seq,
                                 int64_t epoch) const {
  PushHeader h;
  h.set_worker_rank(push.worker_rank);
  h.set_shard(options_.range);
  h.set_base_version(push.base_version);
  h.set_length(push.values.size());
  h.set_samples(push.samples);
  h.set_encoding(ENCODING_FLOAT32);
  h.set_sample_offset(push.sample_offset);
  h.set_session(push.session);
  h.set_repeat(push.repeat);
  h.set_resume_point(push.resume_point);
  h.set_replica_seq(seq);
  h.set_replica_epoch(epoch);
  if (push.step != nullptr) {
    h.set_sync_step(true);
    h.set_step_without_update(push.step->without_update);
    h.set_step_max_abs(push.step->max_abs);
    for (const SyncStep::Examples& e : push.step->examples) {
      StepExamples* out = h.add_step_examples();
      out->set_rank(e.rank);
      out->set_offset(e.offset);
      out->set_samples(e.samples);
      out->set_kind(e.kind);
    }
  }
  return h;
}

grpc::Status Replication::SendOnce(const PushData& push, int64_t seq,
                                   int64_t epoch, absl::Duration timeout) {
  grpc::ClientContext context;
  PrepareCall(&context, timeout);
  context.AddMetadata(common::kRangeMetadataKey, absl::StrCat(options_.range));
  PushResponse response;
  std::unique_ptr<grpc::ClientWriter<PushChunk>> writer =
      stub_->Push(&context, &response);
  const uint64_t n = push.values.size();
  const size_t per_chunk = std::max<size_t>(1, options_.chunk_values);
  uint64_t offset = 0;
  do {
    PushChunk chunk;
    if (offset == 0) *chunk.mutable_header() = HeaderOf(push, seq, epoch);
    const uint64_t count = std::min<uint64_t>(per_chunk, n - offset);
    chunk.set_offset(offset);
    chunk.set_data(reinterpret_cast<const char*>(push.values.data() + offset),
                   count * sizeof(float));
    offset += count;
    if (!writer->Write(chunk)) break;
  } while (offset < n);
  writer->WritesDone();
  return writer->Finish();
}

std::shared_ptr<Replication::ForwardCall> Replication::OpenCall() {
  absl::MutexLock lock(&call_mu_);
  if (call_ == nullptr || call_->ended()) {
    call_ = ForwardCall::Open(generic_stub_.get(), options_);
    forward_calls_.fetch_add(1);
  }
  if (!watchdog_.joinable() && !stopping_.load()) {
    // Ends a call whose continued forward (SendThen) is overdue (not
    // started again once the destructor has joined it).
    watchdog_ = std::thread([this] {
      while (!stop_watchdog_.WaitForNotificationWithTimeout(
          absl::Milliseconds(100))) {
        std::shared_ptr<ForwardCall> current;
        {
          absl::MutexLock lock(&call_mu_);
          current = call_;
        }
        if (current != nullptr) current->CancelIfOverdue(absl::Now());
      }
    });
  }
  return call_;
}

bool Replication::ForwardsOneBit(const PushData& push) const {
  return push.encoding == ENCODING_ONEBIT && options_.onebit_bucket_size > 0 &&
         !push.onebit_bits.empty();
}

void Replication::NoteForward(int64_t seq, absl::Duration took,
                              const grpc::Status& status) {
  if (status.ok()) forward_seconds_.Observe(absl::ToDoubleSeconds(took));
  // A forward holds its push's acknowledgement (in sync, the step's
  // weights): one that takes long is said, with how it ended.
  if (took > kSlowForward) {
    common::LogWarning(
        "the forward of update %d of the %s to its backup at %s took %.3f s "
        "(%s)",
        seq, Describe(), options_.peer_address, absl::ToDoubleSeconds(took),
        status.ok() ? std::string("applied there")
                    : common::ToAbslStatus(status).ToString());
  }
}

std::vector<grpc::ByteBuffer> Replication::ChunksOf(
    const PushData& push, int64_t seq, int64_t epoch,
    const std::function<grpc::Slice(const char*, size_t)>& slice) const {
  std::vector<grpc::ByteBuffer> chunks;
  PushHeader header = HeaderOf(push, seq, epoch);
  // A 1-bit push goes as it came (it decodes to the same values there),
  // anything else as the float32 values the rule applied.
  const bool onebit = ForwardsOneBit(push);
  if (onebit) {
    header.set_encoding(ENCODING_ONEBIT);
    header.set_bucket_size(options_.onebit_bucket_size);
  }
  const common::ChunkPlan plan(
      onebit ? ENCODING_ONEBIT : ENCODING_FLOAT32, push.values.size(),
      options_.onebit_bucket_size,
      std::max<size_t>(1, options_.chunk_values) * sizeof(float));
  const char* data = onebit ? push.onebit_bits.data()
                            : reinterpret_cast<const char*>(push.values.data());
  for (size_t i = 0; i < plan.size(); ++i) {
    const common::ChunkRange chunk = plan[i];
    chunks.push_back(common::PushChunkMessage(
        i == 0 ? &header : nullptr, chunk.first_value,
        slice(data + chunk.data_offset, chunk.data_bytes),
        onebit ? slice(push.onebit_scales.data() + chunk.scales_offset,
                       chunk.scales_bytes)
               : grpc::Slice()));
  }
  return chunks;
}

grpc::Status Replication::SendOnCall(const PushData& push, int64_t seq,
                                     int64_t epoch, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::shared_ptr<ForwardCall> call = OpenCall();
  // The chunks borrow the values (no copy): gRPC must have let go of them
  // before this returns, and the caller's push with them.
  common::BufferLease lease;
  std::vector<grpc::ByteBuffer> chunks = ChunksOf(
      push, seq, epoch,
      [&lease](const char* data, size_t n) { return lease.Borrow(data, n); });
  const absl::Time sent = absl::Now();
  const grpc::Status status = call->Send(std::move(chunks), seq, deadline);
  NoteForward(seq, absl::Now() - sent, status);
  // Not expected to wait (the call lets go of a chunk once written or
  // dropped); returning sooner would free values that gRPC still reads.
  for (int minutes = 1; !lease.AwaitReleased(absl::Minutes(1)); ++minutes) {
    common::LogWarning(
        "the forward of update %d of the %s ended %d min ago and gRPC still "
        "holds its values; waiting for it to let go",
        seq, Describe(), minutes);
  }
  return status;
}

void Replication::DegradeLocked(const std::string& why, bool tell_backup) {
  role_ = Role::kDegraded;
  // A backup given up for dead may only have been out of reach: until it
  // hears that this primary went on without it, it would take the range
  // over with an old copy if this process died.
  detach_pending_ = tell_backup;
  confirmed_.clear();
  confirmed_cv_.SignalAll();
  common::LogWarning(
      "the %s goes on without a backup: %s; a failure of this process now "
      "loses its updates since its last checkpoint",
      Describe(), why);
}

bool Replication::DetachDueLocked() const {
  return detach_pending_ && !detach_sending_ && absl::Now() >= next_detach_;
}

void Replication::TellBackupLaterLocked(std::function<grpc::Status()> send) {
  if (!DetachDueLocked()) return;
  next_detach_ = absl::Now() + absl::Milliseconds(200);
  detach_sending_ = true;
  retries_->Run(
      [this, send = std::move(send)] { TellBackupItIsDetached(send()); });
}

void Replication::TellBackupLaterLocked(const PushData& push, int64_t seq) {
  if (!DetachDueLocked()) return;  // before the values' copy
  // Sent with values of its own: the push is acknowledged meanwhile, and
  // its values go with it.
  auto values = std::make_shared<std::vector<float>>(push.values.begin(),
                                                     push.values.end());
  PushData detach = push;
  detach.values = *values;
  detach.encoding = ENCODING_FLOAT32;
  detach.onebit_bits = {};
  detach.onebit_scales = {};
  detach.buffer = nullptr;
  const int64_t epoch = epoch_;
  // An update far ahead of any the backup expects: it stops following
  // (ApplyInOrder's max_ahead) and will not take the range over.
  TellBackupLaterLocked([this, detach, values, seq, epoch] {
    return SendOnce(detach, seq + 2 * options_.max_ahead, epoch,
                    options_.probe_timeout);
  });
}

void Replication::TellBackupRowsLaterLocked(const SparsePushRequest& request,
                                            int64_t seq) {
  if (!DetachDueLocked()) return;
  // A row push far ahead of the backup's count: it cannot apply it, stops
  // following (RowsDiverged) and will not take the range over. A range
  // whose workers push only rows would otherwise never tell it.
  // Never applied, so it carries no rows.
  auto notice = std::make_shared<SparsePushRequest>();
  *notice->mutable_caller() = request.caller();
  notice->set_table(request.table());
  notice->mutable_caller()->set_shard(options_.range);
  notice->set_from_primary(true);
  notice->set_replica_epoch(epoch_);
  notice->set_replica_seq(seq + 2 * options_.max_ahead);
  TellBackupLaterLocked([this, notice] {
    grpc::ClientContext context;
    PrepareCall(&context, options_.probe_timeout);
    SparsePushResponse response;
    return stub_->SparsePush(&context, *notice, &response);
  });
}

void Replication::TellBackupItIsDetached(const grpc::Status& status) {
  const grpc::StatusCode code = status.error_code();
  absl::MutexLock lock(&mu_);
  detach_sending_ = false;
  if (code == grpc::StatusCode::UNAVAILABLE ||
      code == grpc::StatusCode::DEADLINE_EXCEEDED ||
      code == grpc::StatusCode::CANCELLED) {
    return;  // still out of reach: tried again later
  }
  if (!detach_pending_) return;
  detach_pending_ = false;
  if (code == grpc::StatusCode::FAILED_PRECONDITION && role_ == Role::kDegraded) {
    // It took the range over meanwhile: this copy is not the range's.
    role_ = Role::kFenced;
    common::LogWarning(
        "the backup of the %s at %s took the range over while out of this "
        "process's reach (%s): this process stops serving it",
        Describe(), options_.peer_address, status.error_message());
    return;
  }
  common::LogWarning(
      "the backup of the %s at %s answers again (%s): told it that it no "
      "longer follows, so it will not take the range over with an old copy",
      Describe(), options_.peer_address,
      status.ok() ? std::string("OK") : status.error_message());
}

absl::Status Replication::Forward(const PushData& push, int64_t seq) {
  if (stopping_.load()) {
    return absl::UnavailableError(
        "this process is stopping: the update was not forwarded to the "
        "range's backup");
  }
  int64_t epoch;
  {
    absl::MutexLock lock(&mu_);
    if (role_ == Role::kDegraded) {
      TellBackupLaterLocked(push, seq);
      return absl::OkStatus();
    }
    if (role_ != Role::kPrimary) return ServingLocked();
    epoch = epoch_;
  }
  return SendUntilDone(push, seq, epoch,
                       SendOnCall(push, seq, epoch, options_.forward_timeout));
}

void Replication::ForwardThen(const PushData& push, int64_t seq,
                              std::shared_ptr<const void> owner,
                              std::function<void(absl::Status)> done) {
  int64_t epoch = 0;
  bool on_call = owner != nullptr;
  bool degraded = false;
  {
    absl::MutexLock lock(&mu_);
    if (role_ == Role::kDegraded) {
      TellBackupLaterLocked(push, seq);
      degraded = true;
    } else if (role_ != Role::kPrimary) {
      on_call = false;
    } else {
      epoch = epoch_;
    }
  }
  // Acknowledged without a copy (see Forward).
  if (degraded) return done(absl::OkStatus());
  std::shared_ptr<ForwardCall> call;
  std::vector<grpc::ByteBuffer> chunks;
  if (on_call) {
    call = OpenCall();
    // The chunks share the values' owner: gRPC may hold them a little
    // after the backup answered, when the push is gone.
    chunks = ChunksOf(push, seq, epoch, [&owner](const char* data, size_t n) {
      return common::SharedSlice(data, n, owner);
    });
  }
  const absl::Time sent = absl::Now();
  auto answered = [this, push, seq, epoch, owner, done,
                   sent](grpc::Status status) {
    NoteForward(seq, absl::Now() - sent, status);
    if (status.ok()) return done(Confirm(seq));
    // What a failure means (a fenced primary, a backup gone) takes a health
    // check, and blocks: not on gRPC's thread.
    retries_->Run([this, push, seq, epoch, owner, done, status] {
      done(SendUntilDone(push, seq, epoch, status));
    });
  };
  if (on_call && call->SendThen(std::move(chunks), seq,
                                sent + options_.forward_timeout, answered)) {
    return;
  }
  // Not on the call: a push without an owner, a copy that is not the
  // range's primary, or a call that just ended.
  retries_->Run([this, push, seq, owner, done] { done(Forward(push, seq)); });
}

absl::Status Replication::Confirm(int64_t seq) {
  absl::MutexLock lock(&mu_);
  replicated_.fetch_add(1);
  if (role_ == Role::kPrimary) {
    confirmed_.insert(seq);
    while (!confirmed_.empty() &&
           *confirmed_.begin() == confirmed_through_ + 1) {
      confirmed_.erase(confirmed_.begin());
      ++confirmed_through_;
    }
    confirmed_cv_.SignalAll();
  }
  return absl::OkStatus();
}

absl::Status Replication::SendUntilDone(const PushData& push, int64_t seq,
                                        int64_t epoch, grpc::Status status) {
  for (int attempt = 1;; ++attempt) {
    if (attempt > 1) {
      status = SendOnCall(push, seq, epoch, options_.forward_timeout);
    }
    if (status.ok()) return Confirm(seq);
    if (std::optional<absl::Status> outcome =
            AfterFailedAttempt(status, attempt, absl::StrCat("update ", seq));
        outcome.has_value()) {
      return *outcome;
    }
  }
}

std::optional<absl::Status> Replication::AfterFailedAttempt(
    const grpc::Status& status, int attempt, const std::string& what) {
  if (stopping_.load()) {
    return absl::UnavailableError(
        absl::StrCat("this process is stopping: ", what,
                     " was not acknowledged by the range's backup"));
  }
  absl::MutexLock lock(&mu_);
  if (role_ == Role::kDegraded) return absl::OkStatus();
  if (role_ != Role::kPrimary) return ServingLocked();
  const grpc::StatusCode code = status.error_code();
  if (code == grpc::StatusCode::FAILED_PRECONDITION) {
    role_ = Role::kFenced;
    confirmed_cv_.SignalAll();
    common::LogWarning(
        "the %s was taken over by its backup at %s (%s): this process "
        "stops serving it",
        Describe(), options_.peer_address, status.error_message());
    return ServingLocked();
  }
  const bool transient = code == grpc::StatusCode::UNAVAILABLE ||
                         code == grpc::StatusCode::DEADLINE_EXCEEDED ||
                         code == grpc::StatusCode::CANCELLED ||
                         code == grpc::StatusCode::RESOURCE_EXHAUSTED;
  if (!transient) {
    DegradeLocked(
        absl::StrCat("its backup at ", options_.peer_address, " refused ", what,
                     " (", status.error_message(), ")"),
        /*tell_backup=*/code != grpc::StatusCode::DATA_LOSS);
    return absl::OkStatus();
  }
  // Is the backup gone, or only this update late? Asked without the lock.
  mu_.Unlock();
  const bool answers = PeerAnswers();
  mu_.Lock();
  if (role_ == Role::kDegraded) return absl::OkStatus();
  if (role_ != Role::kPrimary) return ServingLocked();
  if (!answers || attempt >= 3) {
    DegradeLocked(absl::StrCat("its backup at ", options_.peer_address,
                               answers ? " answers but did not take "
                                       : " does not answer after ",
                               what, " (", status.error_message(), ")"),
                  /*tell_backup=*/true);
    return absl::OkStatus();
  }
  return std::nullopt;
}

absl::Status Replication::ForwardRows(const SparsePushRequest& request,
                                      int64_t seq, int64_t step) {
  const std::optional<int64_t> epoch = EpochIfPrimary();
  if (!epoch.has_value()) {
    // Degraded: no backup that follows (told so, if it was not). Fenced
    // since the push's checks: it is not to be acknowledged.
    absl::MutexLock lock(&mu_);
    if (role_ == Role::kDegraded) TellBackupRowsLaterLocked(request, seq);
    return ServingLocked();
  }
  SparsePushRequest forwarded = request;
  forwarded.mutable_caller()->set_shard(options_.range);
  forwarded.set_from_primary(true);
  forwarded.set_replica_epoch(*epoch);
  forwarded.set_replica_seq(seq);
  forwarded.set_step(step);
  const std::string what = absl::StrCat("row push ", seq);
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext context;
    PrepareCall(&context, options_.forward_timeout);
    SparsePushResponse response;
    const absl::Time began = absl::Now();
    const grpc::Status status =
        stub_->SparsePush(&context, forwarded, &response);
    if (status.ok()) {
      forward_seconds_.Observe(absl::ToDoubleSeconds(absl::Now() - began));
      replicated_row_pushes_.fetch_add(1);
      return absl::OkStatus();
    }
    if (std::optional<absl::Status> outcome =
            AfterFailedAttempt(status, attempt, what);
        outcome.has_value()) {
      return *outcome;
    }
  }
}

absl::Status Replication::AcceptRowsFromPrimary(int64_t epoch) const {
  absl::MutexLock lock(&mu_);
  // Being repaired, the range's tables hold every forward until the copy
  // is in (ShardSparseTables::BeginRepair).
  if (repairing_ && role_ == Role::kBackup) return absl::OkStatus();
  return RefuseLocked("a row push", epoch);
}

void Replication::RowsDiverged(const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (role_ != Role::kBackup || diverged_) return;
  diverged_ = true;
  common::LogWarning(
      "the backup of the %s stops following its primary: %s; it copies the "
      "range again once it can",
      Describe(), why);
}

absl::Status Replication::AwaitForwarded(int64_t version) {
  absl::MutexLock lock(&mu_);
  auto done = [this, version]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return role_ != Role::kPrimary || confirmed_through_ >= version;
  };
  const absl::Time deadline =
      absl::Now() + options_.forward_timeout * 3 + options_.probe_timeout * 3;
  while (!done()) {
    if (confirmed_cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (role_ == Role::kPrimary && confirmed_through_ < version) {
    return absl::UnavailableError(absl::StrCat(
        "the updates of the ", Describe(), " up to version ", version,
        " have not all reached its backup yet; send the push again"));
  }
  if (role_ == Role::kPrimary || role_ == Role::kDegraded) {
    return absl::OkStatus();
  }
  return ServingLocked();
}

}  // namespace monsoon::server
