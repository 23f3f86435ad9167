#include "server/stream_reactors.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/wire.h"

namespace monsoon::server {
namespace {

using common::ToGrpcStatus;

grpc::Status Cancelled(const char* what) {
  return grpc::Status(grpc::StatusCode::CANCELLED, what);
}

// The messages of one pull: a snapshot's values in chunks, each a slice of
// the shared Weights (no copy), which the slices keep alive; or, for a
// worker that holds the previous version under pull_compression, the
// encoded difference (EncodedDelta) in chunks of whole buckets, slices of
// it kept alive the same way.
class SnapshotChunks {
 public:
  SnapshotChunks() = default;
  SnapshotChunks(const UpdateRule::PullAnswer& answer, size_t chunk_values,
                 int bucket_size)
      : version_(answer.weights->version()),
        size_(answer.weights->values().size()),
        plan_(answer.delta != nullptr ? ENCODING_ONEBIT : ENCODING_FLOAT32,
              size_, bucket_size, chunk_values * sizeof(float)) {
    if (answer.delta == nullptr) {
      data_ = common::SharedSlice(answer.weights->values().data(),
                                  size_ * sizeof(float), answer.weights);
      return;
    }
    const std::shared_ptr<const EncodedDelta>& delta = answer.delta;
    data_ = common::SharedSlice(delta->bits.data(), delta->bits.size(), delta);
    scales_ =
        common::SharedSlice(delta->scales.data(), delta->scales.size(), delta);
    base_version_ = delta->base_version;
    onebit_ = true;
  }

  // Shards are never empty (the server refuses more shards than
  // parameters), so every snapshot has a first chunk.
  bool done() const { return next_ == plan_.size(); }

  // The next chunk's message; `push` (the PushPull answer) goes into the
  // first.
  grpc::ByteBuffer Next(const PushResponse* push) {
    const common::ChunkRange chunk = plan_[next_];
    const PushResponse* answer = next_ == 0 ? push : nullptr;
    ++next_;
    const grpc::Slice data =
        data_.sub(chunk.data_offset, chunk.data_offset + chunk.data_bytes);
    if (!onebit_) {
      return common::PullChunkMessage(version_, chunk.first_value, data,
                                      answer);
    }
    const common::PullDelta delta{
        scales_.sub(chunk.scales_offset,
                    chunk.scales_offset + chunk.scales_bytes),
        base_version_};
    return common::PullChunkMessage(version_, chunk.first_value, data, answer,
                                    &delta);
  }

 private:
  int64_t version_ = 0;
  size_t size_ = 0;
  common::ChunkPlan plan_{ENCODING_FLOAT32, 0, 1, 4};
  size_t next_ = 0;
  grpc::Slice data_;
  grpc::Slice scales_;
  int64_t base_version_ = 0;
  bool onebit_ = false;
};

// Waits for a version without a thread, and lets a cancellation end the
// wait: the waiter runs once (maybe at once, on the thread that starts the
// wait, or later on the thread that advances the version) unless a
// cancellation removes it first. Exactly one of Start and Cancel reports a
// removed waiter, and its caller then finishes the call. Never runs the
// waiter with a lock held. Thread-safe.
class VersionWait {
 public:
  explicit VersionWait(ShardState* state) : state_(state) {}

  // Begins the wait. False when the call was cancelled before the waiter
  // could run: it never will, and the caller finishes the call. If the
  // version has not come after `max_wait`, `expired` runs instead of
  // `ready` (ShardState::ExpireWaiters).
  // With `timed`, the time from here to `ready` goes into it. With a
  // `clock_rank` (a worker's), it also waits for the staleness bound
  // (ShardState::SetStalenessBound), timed into the shard's
  // staleness_wait_seconds when the bound is on.
  bool Start(int64_t min_version, ShardState::Waiter ready,
             absl::Duration max_wait, ShardState::Waiter expired,
             common::Histogram* timed = nullptr, int clock_rank = -1) {
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return false;
    }
    if (timed == nullptr && clock_rank >= 0 && state_->has_staleness_bound()) {
      timed = &state_->staleness_wait_seconds();
    }
    if (timed != nullptr) {
      ready = [timed, began = absl::Now(), ready = std::move(ready)] {
        timed->Observe(absl::ToDoubleSeconds(absl::Now() - began));
        ready();
      };
    }
    const uint64_t id = state_->WhenVersionAtLeast(
        min_version, std::move(ready), absl::Now() + max_wait,
        std::move(expired), clock_rank);
    absl::MutexLock lock(&mu_);
    id_ = id;
    // A cancellation meanwhile found no waiter to remove: remove it here.
    return !(cancelled_ && id != 0 && state_->CancelWaiter(id));
  }

  // True when this removed the waiter, which then never runs.
  bool Cancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    return id_ != 0 && state_->CancelWaiter(id_);
  }

 private:
  ShardState* const state_;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t id_ ABSL_GUARDED_BY(mu_) = 0;
};

// Reads a push stream chunk by chunk into a PushDecoder, then hands the
// whole push to the Shard. Shared by Push and PushPull.
class PushReader {
 public:
  // `forwarded_only`: the stream carries a range's forwarded updates only
  // (Replicate), and any other push is refused.
  explicit PushReader(const StreamContext& streams, bool forwarded_only = false)
      : streams_(streams),
        forwarded_only_(forwarded_only),
        decoder_(streams.shard->state()->shard(),
                 streams.shard->state()->size(), streams.shard->num_workers(),
                 streams.encoding, streams.bucket_size,
                 &streams.shard->state()->buffers(), streams.limits) {}

  // Takes the message just read.
  absl::Status Add(grpc::ByteBuffer* message) {
    absl::Status status = decoder_.Add(*message);
    message->Clear();
    if (!status.ok()) {
      streams_.shard->RejectPush(status);
      return status;
    }
    if (!session_checked_ && decoder_.has_header()) {
      // Checked as soon as the header is in, so that no one else holds the
      // rank's push slots or buffers while the rest streams in (and again
      // at the end, in case another process took the rank meanwhile).
      session_checked_ = true;
      if (forwarded_only_ && !decoder_.forwarded()) {
        status = absl::InvalidArgumentError(
            "Replicate carries a range's forwarded updates only (replica_seq "
            "above 0); a worker's push goes to Push or PushPull");
        streams_.shard->RejectPush(status);
        return status;
      }
      return streams_.shard->CheckPushSession(
          decoder_.worker_rank(), decoder_.session(), decoder_.forwarded());
    }
    return status;
  }

  using Then = std::function<void(absl::StatusOr<AppliedPush>)>;

  // Applies the whole push, once the stream has ended (see
  // Shard::ApplyPush for `answer_repeats`), and calls `then` with the
  // outcome: at once, or, with replication, from another thread once the
  // range's backup has it (the reactor may be gone when `then` returns).
  void ApplyThen(bool answer_repeats, Then then) {
    absl::StatusOr<PushData> push = decoder_.Finish();
    if (!push.ok()) {
      // An empty or incomplete stream: a client that ended it short, or one
      // that cancelled the call (gRPC may end the reads before the
      // cancellation is known: a worker that gives up on a step's calls
      // when another shard is lost). Counted when the call is done and it
      // is known which (Done).
      ended_short_ = push.status();
      return then(push.status());
    }
    push_ = *std::move(push);
    have_version_ = push_.have_version;
    worker_rank_ = push_.worker_rank;
    if (push_.replica_seq > 0) {
      // From the range's primary: applied in its order, maybe later.
      forwarded_seq_.store(push_.replica_seq);
      Shard* shard = streams_.shard;
      const int64_t seq = push_.replica_seq;
      const bool cancelled = cancelled_.load();
      shard->ApplyForwarded(push_, std::move(then));
      // A cancellation that came before the update was set waiting.
      if (cancelled) shard->AbandonForwarded(seq);
      return;
    }
    absl::StatusOr<AppliedPush> applied =
        streams_.shard->ApplyPush(push_, answer_repeats);
    if (!applied.ok() || !applied->replicate || streams_.tasks == nullptr) {
      return then(std::move(applied));
    }
    // From here on the values belong to the forward, which may outlive
    // this push in gRPC's hands.
    std::shared_ptr<const void> owner = decoder_.ReleaseStorage(&push_);
    streams_.shard->ReplicateThen(
        push_, *applied, std::move(owner), streams_.tasks,
        [applied = *applied, then = std::move(then)](absl::Status replicated) {
          if (replicated.ok()) {
            then(applied);
          } else {
            then(replicated);
          }
        });
  }

  // The call was cancelled: a forwarded update that waits for its turn is
  // dropped (its `then` runs with CANCELLED).
  void Cancel() {
    cancelled_.store(true);
    const int64_t seq = forwarded_seq_.load();
    if (seq > 0) streams_.shard->AbandonForwarded(seq);
  }

  std::optional<int64_t> have_version() const { return have_version_; }
  int worker_rank() const { return worker_rank_; }
  // Whether every value of the push is in (Replicate: one forwarded update
  // follows another on a call).
  bool whole() const { return decoder_.whole(); }
  // The forwarded update's seq, once ApplyThen has it.
  int64_t forwarded_seq() const { return forwarded_seq_.load(); }

  // At the call's end (OnDone): a push whose stream ended short is counted
  // as refused, unless the client cancelled the call.
  void Done(bool cancelled) {
    if (!ended_short_.ok() && !cancelled) {
      streams_.shard->RejectPush(ended_short_);
    }
  }

 private:
  const StreamContext& streams_;
  const bool forwarded_only_;
  PushDecoder decoder_;
  PushData push_;  // once whole (ApplyThen)
  std::atomic<int64_t> forwarded_seq_{0};
  std::atomic<bool> cancelled_{false};
  std::optional<int64_t> have_version_;
  int worker_rank_ = 0;
  bool session_checked_ = false;
  absl::Status ended_short_;  // see Apply
};

PushResponse ResponseFor(const PushResult& result) {
  PushResponse response;
  response.set_version(result.version);
  response.set_staleness(result.staleness);
  response.set_duplicate(result.duplicate);
  response.set_stale(result.stale);
  return response;
}

// Push: reads the stream, then applies it. Deletes itself.
class PushReactor : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  PushReactor(grpc::CallbackServerContext* context, const StreamContext& shared,
              grpc::ByteBuffer* response)
      : context_(context), reader_(shared), response_(response) {
    StartRead(&message_);
  }

  void OnReadDone(bool ok) override {
    if (ok) {
      absl::Status status = reader_.Add(&message_);
      if (!status.ok()) return Finish(ToGrpcStatus(status));
      StartRead(&message_);
      return;
    }
    // The stream ended, or the call was cancelled: apply only a whole push.
    if (context_->IsCancelled()) return Finish(Cancelled("push cancelled"));
    // The outcome may come from another thread (replication), after which
    // the reactor must outlive the continuation: it holds a reference.
    refs_.fetch_add(1);
    reader_.ApplyThen(false, [this](absl::StatusOr<AppliedPush> applied) {
      if (!applied.ok()) {
        Finish(ToGrpcStatus(applied.status()));
      } else {
        *response_ = common::SmallMessage(ResponseFor(applied->result));
        Finish(grpc::Status::OK);
      }
      Unref();
    });
  }

  void OnCancel() override {
    cancelled_ = true;
    reader_.Cancel();
  }

  void OnDone() override {
    reader_.Done(cancelled_ || context_->IsCancelled());
    Unref();
  }

 private:
  // Deletes the reactor once gRPC is done with it (OnDone) and no
  // continuation of its push runs.
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  grpc::CallbackServerContext* const context_;
  std::atomic<bool> cancelled_ = false;  // OnCancel ran
  std::atomic<int> refs_{1};             // OnDone's, and a continuation's
  PushReader reader_;
  grpc::ByteBuffer* const response_;
  grpc::ByteBuffer message_;
};

// Pull: waits (without a thread) for the wanted version, then streams the
// rule's snapshot. Holds one of its rank's pull slots, taken by the caller,
// until it ends. Deletes itself.
class PullReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  PullReactor(const StreamContext& shared, int rank, int64_t min_version,
              std::optional<int64_t> have_version)
      : shared_(shared),
        rank_(rank),
        have_version_(have_version),
        count_bytes_(rank >= 0),
        wait_(shared.shard->state()) {
    // May call Ready() at once, on this thread.
    wait_.Start(
        min_version, [this] { Ready(); }, shared.shard->max_wait(),
        [this, min_version] {
          End(ToGrpcStatus(shared_.shard->WaitExpired("pull", min_version)));
        },
        nullptr, rank);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return End(Cancelled("pull cancelled"));
    WriteNext();
  }

  void OnCancel() override {
    // If the waiter had already run, the write path finishes the call.
    if (wait_.Cancel()) {
      End(Cancelled("pull cancelled while waiting for its version"));
    }
  }

  void OnDone() override { delete this; }

 private:
  // Every path ends here, once: the slot is given back as the call ends,
  // before its client can see the answer and start its next pull (OnDone
  // would come later, and a quick client would find its slots still taken).
  void End(const grpc::Status& status) {
    shared_.pull_slots->Release(rank_);
    Finish(status);
  }

  void Ready() {
    const UpdateRule::PullAnswer answer =
        shared_.shard->Pull(rank_, have_version_);
    chunks_ = SnapshotChunks(answer, shared_.chunk_values, shared_.bucket_size);
    WriteNext();
  }

  void WriteNext() {
    if (chunks_.done()) return End(grpc::Status::OK);
    message_ = chunks_.Next(nullptr);
    if (count_bytes_) {
      shared_.shard->state()->RecordPulledBytes(
          static_cast<int64_t>(message_.Length()));
    }
    StartWrite(&message_);
  }

  const StreamContext& shared_;
  const int rank_;
  const std::optional<int64_t> have_version_;
  const bool count_bytes_;
  VersionWait wait_;
  SnapshotChunks chunks_;
  grpc::ByteBuffer message_;
};

// PushPull: reads and applies a push as PushReactor does, then waits for
// the version that includes it and streams it as PullReactor does, the
// push's answer in the first chunk. Deletes itself.
class PushPullReactor
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  PushPullReactor(grpc::CallbackServerContext* context,
                  const StreamContext& shared)
      : context_(context),
        shared_(shared),
        reader_(shared),
        wait_(shared.shard->state()) {
    StartRead(&message_);
  }

  void OnReadDone(bool ok) override {
    if (ok) {
      absl::Status status = reader_.Add(&message_);
      if (!status.ok()) return Finish(ToGrpcStatus(status));
      StartRead(&message_);
      return;
    }
    if (context_->IsCancelled()) return Finish(Cancelled("push cancelled"));
    // As PushReactor: the continuation may run on another thread, and the
    // call may end (OnDone) before it returns.
    refs_.fetch_add(1);
    reader_.ApplyThen(true, [this](absl::StatusOr<AppliedPush> applied) {
      Applied(std::move(applied));
      Unref();
    });
  }

  // The push's outcome: then the wait for the version that includes it.
  void Applied(absl::StatusOr<AppliedPush> applied) {
    if (!applied.ok()) return Finish(ToGrpcStatus(applied.status()));
    response_ = ResponseFor(applied->result);
    const int64_t min_version = Shard::VersionToAwait(*applied);
    // Waiting and sending the weights, the call holds a pull slot of its
    // rank, as a pull does.
    if (!shared_.pull_slots->Acquire(reader_.worker_rank())) {
      return Finish(grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("worker rank ", reader_.worker_rank(), " already has ",
                       shared_.pull_slots->per_rank(),
                       " pulls in flight at shard ",
                       shared_.shard->state()->shard(),
                       " (--max_pulls_per_rank); its push was taken (sent "
                       "again, it is answered as a duplicate)")));
    }
    slot_held_ = true;
    if (!wait_.Start(
            min_version, [this] { Ready(); }, shared_.shard->max_wait(),
            [this, min_version] {
              End(ToGrpcStatus(
                  shared_.shard->WaitExpired("push-pull", min_version)));
            },
            shared_.barrier ? &shared_.shard->state()->barrier_wait_seconds()
                            : nullptr,
            reader_.worker_rank())) {
      End(Cancelled("push-pull cancelled"));
    }
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return End(Cancelled("push-pull cancelled"));
    WriteNext();
  }

  void OnCancel() override {
    cancelled_ = true;
    reader_.Cancel();
    // A cancellation while the push streams in ends the reads, and the read
    // path finishes the call; once the weights are being written, the
    // write path does.
    if (wait_.Cancel()) {
      End(Cancelled("push-pull cancelled while waiting for the step"));
    }
  }

  void OnDone() override {
    reader_.Done(cancelled_ || context_->IsCancelled());
    Unref();
  }

 private:
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  // Ends the call once its wait has begun, giving its pull slot back as it
  // ends (see PullReactor::End).
  void End(const grpc::Status& status) {
    if (slot_held_) shared_.pull_slots->Release(reader_.worker_rank());
    slot_held_ = false;
    Finish(status);
  }

  void Ready() {
    const UpdateRule::PullAnswer answer =
        shared_.shard->Pull(reader_.worker_rank(), reader_.have_version());
    chunks_ = SnapshotChunks(answer, shared_.chunk_values, shared_.bucket_size);
    WriteNext();
  }

  void WriteNext() {
    if (chunks_.done()) return End(grpc::Status::OK);
    message_ = chunks_.Next(first_ ? &response_ : nullptr);
    first_ = false;
    shared_.shard->state()->RecordPulledBytes(
        static_cast<int64_t>(message_.Length()));
    StartWrite(&message_);
  }

  grpc::CallbackServerContext* const context_;
  const StreamContext& shared_;
  std::atomic<bool> cancelled_ = false;  // OnCancel ran
  std::atomic<int> refs_{1};             // OnDone's, and a continuation's
  PushReader reader_;
  VersionWait wait_;
  PushResponse response_;
  SnapshotChunks chunks_;
  grpc::ByteBuffer message_;
  bool first_ = true;
  bool slot_held_ = false;
};

// Replicate: reads forwarded updates one after another, hands each to the
// Shard once whole (applied in the primary's order, maybe later, from the
// thread that applies the update before it), and answers each with a
// ReplicaAck as it ends, one write at a time. Ends once the primary has
// ended its side and every update is answered, or when End ends it.
// Deletes itself.
class ReplicateReactor
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      public ReplicateCalls::Call {
 public:
  ReplicateReactor(const StreamContext& streams, ReplicateCalls* calls)
      : streams_(streams),
        calls_(calls),
        reader_(std::make_shared<PushReader>(streams, true)) {
    StartRead(&message_);
    calls_->Add(this);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the primary ended its side, or the call ended
      Act(/*reads_done=*/true);
      return;
    }
    absl::Status status = reader_->Add(&message_);
    if (!status.ok()) return End(ToGrpcStatus(status));
    if (reader_->whole()) {
      std::shared_ptr<PushReader> reader =
          std::exchange(reader_, std::make_shared<PushReader>(streams_, true));
      {
        absl::MutexLock lock(&mu_);
        applying_.insert(reader);
      }
      refs_.fetch_add(1);
      reader->ApplyThen(false,
                        [this, reader](absl::StatusOr<AppliedPush> applied) {
                          Acknowledge(reader, applied.status());
                        });
    }
    StartRead(&message_);
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) EndLocked(Cancelled("replicate: the primary is gone"));
    }
    Act(false);
  }

  void End(const grpc::Status& status) override {
    {
      absl::MutexLock lock(&mu_);
      EndLocked(status);
    }
    Act(false);
  }

  void Hold() override { refs_.fetch_add(1); }
  void Release() override { Unref(); }

  void OnCancel() override { AbandonApplying(); }

  void OnDone() override {
    calls_->Remove(this);
    AbandonApplying();
    Unref();
  }

 private:
  // An update's outcome here, to be sent back.
  void Acknowledge(const std::shared_ptr<PushReader>& reader,
                   const absl::Status& status) {
    ReplicaAck ack;
    ack.set_replica_seq(reader->forwarded_seq());
    ack.set_code(static_cast<int>(status.code()));
    ack.set_message(std::string(status.message()));
    {
      absl::MutexLock lock(&mu_);
      applying_.erase(reader);
      if (!ending_) acks_.push_back(common::SmallMessage(ack));
    }
    Act(false);
    Unref();
  }

  void EndLocked(const grpc::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ending_) return;
    ending_ = true;
    end_status_ = status;
    acks_.clear();
  }

  // Starts the next write, or finishes the call once nothing is left to
  // write: gRPC's calls made without the lock.
  void Act(bool reads_done) {
    bool write = false;
    bool finish = false;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      if (reads_done) reads_done_ = true;
      if (finished_ || writing_) return;
      if (!ending_ && !acks_.empty()) {
        out_ = std::move(acks_.front());
        acks_.pop_front();
        writing_ = write = true;
      } else if (ending_ || (reads_done_ && applying_.empty())) {
        finished_ = finish = true;
        status = ending_ ? end_status_ : grpc::Status::OK;
      }
    }
    if (write) StartWrite(&out_);
    if (finish) Finish(status);
  }

  // The updates that wait for their turn are dropped (each then answered
  // CANCELLED, and not sent back): the primary sends them again.
  void AbandonApplying() {
    std::vector<std::shared_ptr<PushReader>> applying;
    {
      absl::MutexLock lock(&mu_);
      applying.assign(applying_.begin(), applying_.end());
    }
    for (const auto& reader : applying) reader->Cancel();
  }

  // Deletes the reactor once gRPC is done with it (OnDone) and no update
  // of it is still applying.
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  const StreamContext& streams_;
  ReplicateCalls* const calls_;
  std::shared_ptr<PushReader> reader_;  // the update being read
  grpc::ByteBuffer message_;
  std::atomic<int> refs_{1};  // OnDone's, and one per update applying

  absl::Mutex mu_;
  std::set<std::shared_ptr<PushReader>> applying_ ABSL_GUARDED_BY(mu_);
  std::deque<grpc::ByteBuffer> acks_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer out_;  // the ack being written (writing_)
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// Answer a call that fails validation at once, reading nothing.
class FailedPullReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit FailedPullReactor(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

class FailedPushReactor : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  explicit FailedPushReactor(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

class FailedPushPullReactor
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit FailedPushPullReactor(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

void ReplicateCalls::Add(Call* call) {
  std::optional<grpc::Status> ended;
  {
    absl::MutexLock lock(&mu_);
    if (ended_.has_value()) {
      ended = ended_;
    } else {
      open_.insert(call);
    }
  }
  if (ended.has_value()) call->End(*ended);
}

void ReplicateCalls::Remove(Call* call) {
  absl::MutexLock lock(&mu_);
  open_.erase(call);
}

void ReplicateCalls::EndAll(const grpc::Status& status) {
  // Each call held, so that none is deleted before it is ended, and ended
  // without the lock (gRPC may run the call's end where it is asked for).
  std::vector<Call*> open;
  {
    absl::MutexLock lock(&mu_);
    ended_ = status;
    open.assign(open_.begin(), open_.end());
    for (Call* call : open) call->Hold();
  }
  for (Call* call : open) {
    call->End(status);
    call->Release();
  }
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
NewReplicateReactor(const StreamContext& streams, ReplicateCalls* calls) {
  return new ReplicateReactor(streams, calls);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* FailedReplicate(
    const grpc::Status& status) {
  return new FailedPushPullReactor(status);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* NewPushReactor(
    grpc::CallbackServerContext* context, const StreamContext& streams,
    grpc::ByteBuffer* response) {
  return new PushReactor(context, streams, response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* NewPullReactor(
    const StreamContext& streams, int rank, int64_t min_version,
    std::optional<int64_t> have_version) {
  return new PullReactor(streams, rank, min_version, have_version);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewPushPullReactor(
    grpc::CallbackServerContext* context, const StreamContext& streams) {
  return new PushPullReactor(context, streams);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* FailedPush(
    const grpc::Status& status) {
  return new FailedPushReactor(status);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* FailedPull(
    const grpc::Status& status) {
  return new FailedPullReactor(status);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* FailedPushPull(
    const grpc::Status& status) {
  return new FailedPushPullReactor(status);
}

}  // namespace monsoon::server
