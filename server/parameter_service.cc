#include "server/parameter_service.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "common/config.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/wire.h"
#include "server/push_decoder.h"

namespace monsoon::server {
namespace {

using common::ToGrpcStatus;
using Shared = ParameterServiceImpl::Shared;

grpc::Status InvalidArgument(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

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

// Reads a push stream chunk by chunk into a PushDecoder. Shared by Push and
// PushPull.
class PushReader {
 public:
  explicit PushReader(const Shared& shared)
      : shared_(shared),
        decoder_(shared.state->shard(), shared.state->size(),
                 shared.num_workers, shared.encoding, shared.bucket_size,
                 &shared.state->buffers(), shared.limits) {}

  // Takes the message just read.
  absl::Status Add(grpc::ByteBuffer* message) {
    absl::Status status = decoder_.Add(*message);
    message->Clear();
    if (status.ok() && !session_checked_ && decoder_.has_header()) {
      // Only the process that holds the rank may push for it: checked as
      // soon as the header is in, so that no one else holds the rank's
      // push slots or buffers while the rest streams in (and again at the
      // end, in case another process took the rank meanwhile).
      session_checked_ = true;
      status = shared_.state->CheckSession(decoder_.worker_rank(),
                                           decoder_.session());
    }
    if (!status.ok()) shared_.state->RecordRejectedPush(status.code());
    return status;
  }

  // Applies the whole push, once the stream has ended. With
  // `answer_repeats`, a push that is in the shard already (ALREADY_EXISTS:
  // its sync step is still collecting) or too stale to apply (ABORTED: its
  // step has closed) is answered rather than refused: the first as a
  // duplicate, the second as stale, so that a push-pull still gets weights.
  absl::StatusOr<PushResult> Apply(bool answer_repeats) {
    absl::StatusOr<PushData> push = decoder_.Finish();
    if (push.ok()) {
      // Only the process that holds the rank may push for it.
      if (absl::Status held =
              shared_.state->CheckSession(push->worker_rank, push->session);
          !held.ok()) {
        shared_.state->RecordRejectedPush(held.code());
        return held;
      }
      base_version_ = push->base_version;
      have_version_ = push->have_version;
      worker_rank_ = push->worker_rank;
      shared_.state->Touch(push->worker_rank);  // renews the rank's lease
    }
    absl::StatusOr<PushResult> result =
        push.ok() ? shared_.rule->Apply(*push)
                  : absl::StatusOr<PushResult>(push.status());
    if (answer_repeats && !result.ok() &&
        (result.status().code() == absl::StatusCode::kAlreadyExists ||
         result.status().code() == absl::StatusCode::kAborted)) {
      PushResult answer;
      answer.version = base_version_;
      answer.duplicate =
          result.status().code() == absl::StatusCode::kAlreadyExists;
      answer.stale = !answer.duplicate;
      repeat_in_step_ = answer.duplicate;
      return answer;
    }
    if (!result.ok()) shared_.state->RecordRejectedPush(result.status().code());
    return result;
  }

  int64_t base_version() const { return base_version_; }
  std::optional<int64_t> have_version() const { return have_version_; }
  int worker_rank() const { return worker_rank_; }
  // Apply answered a sync push that the step in progress already holds.
  bool repeat_in_step() const { return repeat_in_step_; }

 private:
  const Shared& shared_;
  PushDecoder decoder_;
  int64_t base_version_ = 0;
  std::optional<int64_t> have_version_;
  int worker_rank_ = 0;
  bool repeat_in_step_ = false;
  bool session_checked_ = false;
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
  PushReactor(grpc::CallbackServerContext* context, const Shared& shared,
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
    absl::StatusOr<PushResult> result = reader_.Apply(false);
    if (!result.ok()) return Finish(ToGrpcStatus(result.status()));
    *response_ = common::SmallMessage(ResponseFor(*result));
    Finish(grpc::Status::OK);
  }

  void OnDone() override { delete this; }

 private:
  grpc::CallbackServerContext* const context_;
  PushReader reader_;
  grpc::ByteBuffer* const response_;
  grpc::ByteBuffer message_;
};

// The answer to a call whose wait for `min_version` outlasted the shard's
// bound (a client without a deadline of its own cannot wait forever).
grpc::Status WaitExpired(const Shared& shared, const char* what,
                         int64_t min_version) {
  if (shared.state->has_staleness_bound()) {
    const std::vector<std::string> waits =
        shared.state->DescribeClockWaits(absl::Now());
    return grpc::Status(
        grpc::StatusCode::DEADLINE_EXCEEDED,
        absl::StrCat(what, " waited ", absl::FormatDuration(shared.max_wait),
                     " (the shard's --max_wait_s) at shard ",
                     shared.state->shard(),
                     " for the slowest worker (bounded staleness: "
                     "max_staleness)",
                     waits.empty() ? "" : ": ", absl::StrJoin(waits, "; "),
                     "; has a worker stopped without leaving?"));
  }
  return grpc::Status(
      grpc::StatusCode::DEADLINE_EXCEEDED,
      absl::StrCat(what, " waited ", absl::FormatDuration(shared.max_wait),
                   " for version ", min_version, " of shard ",
                   shared.state->shard(), ", which is at version ",
                   shared.state->version(),
                   " (the shard's --max_wait_s): is a worker of the sync "
                   "step missing?"));
}

// Pull: waits (without a thread) for the wanted version, then streams the
// rule's snapshot. Holds one of its rank's pull slots, taken by the caller,
// until it ends. Deletes itself.
class PullReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  PullReactor(const Shared& shared, int rank, int64_t min_version,
              std::optional<int64_t> have_version)
      : shared_(shared),
        rank_(rank),
        have_version_(have_version),
        count_bytes_(rank >= 0),
        wait_(shared.state) {
    // May call Ready() at once, on this thread.
    wait_.Start(
        min_version, [this] { Ready(); }, shared.max_wait,
        [this, min_version] { End(WaitExpired(shared_, "pull", min_version)); },
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
        shared_.rule->PullFrom(rank_, have_version_);
    shared_.rule->Pulled(rank_, answer.weights);
    chunks_ = SnapshotChunks(answer, shared_.chunk_values, shared_.bucket_size);
    WriteNext();
  }

  void WriteNext() {
    if (chunks_.done()) return End(grpc::Status::OK);
    message_ = chunks_.Next(nullptr);
    if (count_bytes_) {
      shared_.state->RecordPulledBytes(static_cast<int64_t>(message_.Length()));
    }
    StartWrite(&message_);
  }

  const Shared& shared_;
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
  PushPullReactor(grpc::CallbackServerContext* context, const Shared& shared)
      : context_(context),
        shared_(shared),
        reader_(shared),
        wait_(shared.state) {
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
    absl::StatusOr<PushResult> result = reader_.Apply(true);
    if (!result.ok()) return Finish(ToGrpcStatus(result.status()));
    response_ = ResponseFor(*result);
    // The version that includes the push: in sync the step's close (the
    // rule answers with the version still collecting until then), in the
    // other modes the version the push made. A repeat of examples already
    // applied, or a stale push, gets the weights as they are; a repeat of a
    // sync push still being collected, the weights once its step closes.
    int64_t min_version = std::max(result->version, reader_.base_version() + 1);
    if (result->stale || (result->duplicate && !reader_.repeat_in_step())) {
      min_version = 0;
    }
    // Waiting and sending the weights, the call holds a pull slot of its
    // rank, as a pull does.
    if (!shared_.pull_slots->Acquire(reader_.worker_rank())) {
      return Finish(grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("worker rank ", reader_.worker_rank(), " already has ",
                       shared_.pull_slots->per_rank(),
                       " pulls in flight at shard ", shared_.state->shard(),
                       " (--max_pulls_per_rank); its push was taken (sent "
                       "again, it is answered as a duplicate)")));
    }
    slot_held_ = true;
    if (!wait_.Start(
            min_version, [this] { Ready(); }, shared_.max_wait,
            [this, min_version] {
              End(WaitExpired(shared_, "push-pull", min_version));
            },
            shared_.barrier ? &shared_.state->barrier_wait_seconds() : nullptr,
            reader_.worker_rank())) {
      End(Cancelled("push-pull cancelled"));
    }
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return End(Cancelled("push-pull cancelled"));
    WriteNext();
  }

  void OnCancel() override {
    // A cancellation while the push streams in ends the reads, and the read
    // path finishes the call; once the weights are being written, the
    // write path does.
    if (wait_.Cancel()) {
      End(Cancelled("push-pull cancelled while waiting for the step"));
    }
  }

  void OnDone() override { delete this; }

 private:
  // Ends the call once its wait has begun, giving its pull slot back as it
  // ends (see PullReactor::End).
  void End(const grpc::Status& status) {
    if (slot_held_) shared_.pull_slots->Release(reader_.worker_rank());
    slot_held_ = false;
    Finish(status);
  }

  void Ready() {
    const UpdateRule::PullAnswer answer =
        shared_.rule->PullFrom(reader_.worker_rank(), reader_.have_version());
    shared_.rule->Pulled(reader_.worker_rank(), answer.weights);
    chunks_ = SnapshotChunks(answer, shared_.chunk_values, shared_.bucket_size);
    WriteNext();
  }

  void WriteNext() {
    if (chunks_.done()) return End(grpc::Status::OK);
    message_ = chunks_.Next(first_ ? &response_ : nullptr);
    first_ = false;
    shared_.state->RecordPulledBytes(static_cast<int64_t>(message_.Length()));
    StartWrite(&message_);
  }

  grpc::CallbackServerContext* const context_;
  const Shared& shared_;
  PushReader reader_;
  VersionWait wait_;
  PushResponse response_;
  SnapshotChunks chunks_;
  grpc::ByteBuffer message_;
  bool first_ = true;
  bool slot_held_ = false;
};

// Answer a call that fails validation at once, reading nothing.
class FailedPull : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit FailedPull(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

class FailedPush : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  explicit FailedPush(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

class FailedPushPull
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit FailedPushPull(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

namespace {

// The most worker steps one push of `resolved`'s mode summarizes.
int StepsPerPush(const TrainingConfig& resolved) {
  switch (resolved.mode()) {
    case DOWNPOUR:
    case ONEBIT:
      return std::max(1, resolved.n_push());
    case EASGD:
      return std::max(1, resolved.tau());
    default:
      return 1;
  }
}

}  // namespace

ParameterServiceImpl::ParameterServiceImpl(const TrainingConfig& resolved,
                                           int num_workers, ShardState* state,
                                           UpdateRule* rule,
                                           ServicePolicy policy)
    : fingerprint_(common::ConfigFingerprint(resolved)),
      auth_token_(std::move(policy.auth_token)),
      push_slots_(policy.max_pushes_per_rank),
      pull_slots_(policy.max_pulls_per_rank),
      shared_{
          num_workers,
          static_cast<size_t>(resolved.chunk_bytes()) / sizeof(float),
          common::PushEncodingFor(resolved),
          resolved.onebit_bucket_size(),
          state,
          rule,
          PushLimits{policy.max_abs_gradient,
                     static_cast<int64_t>(resolved.batch_size()) *
                         StepsPerPush(resolved),
                     &push_slots_,
                     /*digest=*/resolved.mode() == SYNC},
          &pull_slots_,
          policy.max_wait > absl::ZeroDuration()
              ? policy.max_wait
              : absl::Seconds(resolved.sync_timeout_s()) + absl::Seconds(10),
          /*barrier=*/resolved.mode() == SYNC} {}

grpc::Status ParameterServiceImpl::Authenticate(
    const grpc::CallbackServerContext* context) const {
  if (auth_token_.empty()) return grpc::Status::OK;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(common::kAuthMetadataKey);
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this shard wants the run's auth token, and the call "
                        "has none: give every daemon of the run the same "
                        "--auth_token_file");
  }
  if (!common::BearerMatches(
          absl::string_view(it->second.data(), it->second.size()),
          auth_token_)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "wrong auth token: give every daemon of the run the "
                        "same --auth_token_file");
  }
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* ParameterServiceImpl::Register(
    grpc::CallbackServerContext* context, const RegisterRequest* request,
    RegisterResponse* response) {
  ShardState* const state = shared_.state;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status auth = Authenticate(context); !auth.ok()) {
    reactor->Finish(auth);
    return reactor;
  }
  if (request->config_fingerprint() != fingerprint_) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrFormat("config fingerprint %016x differs from shard %d's "
                        "%016x: every daemon of a run must read the same "
                        "config (data_dir aside)",
                        request->config_fingerprint(), state->shard(),
                        fingerprint_)));
    return reactor;
  }
  if (request->shard() != state->shard()) {
    reactor->Finish(InvalidArgument(
        absl::StrCat("this is shard ", state->shard(), ", not shard ",
                     request->shard(), ": list --servers in shard order")));
    return reactor;
  }
  // The counts are not in the config (nor its fingerprint): a worker told
  // another worker count would train on the wrong part of the data.
  if (request->num_workers() != 0 &&
      request->num_workers() != shared_.num_workers) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("this worker was started with --num_workers=",
                     request->num_workers(), " but shard ", state->shard(),
                     " with --num_workers=", shared_.num_workers,
                     ": every daemon of a run must be given the same worker "
                     "count")));
    return reactor;
  }
  if (request->num_shards() != 0 &&
      request->num_shards() != state->num_shards()) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("this client lists ", request->num_shards(),
                     " shards in --servers but shard ", state->shard(),
                     " was started with --num_shards=", state->num_shards(),
                     ": list every shard, in shard order")));
    return reactor;
  }
  if (request->worker_rank() < -1 ||
      request->worker_rank() >= shared_.num_workers) {
    reactor->Finish(InvalidArgument(absl::StrCat(
        "worker rank ", request->worker_rank(), " is outside [0, ",
        shared_.num_workers, ") (-1 for an evaluator): check --num_workers")));
    return reactor;
  }
  if (request->worker_rank() >= 0 && request->leaving()) {
    // Only the rank's holder (or a worker of a rank this shard has not seen
    // register, as after the shard's restart) may end it or finish it.
    if (absl::Status held =
            state->CheckSession(request->worker_rank(), request->session());
        !held.ok()) {
      common::LogWarning("shard %d: refused a leave: %s", state->shard(),
                         held.ToString());
      reactor->Finish(ToGrpcStatus(held));
      return reactor;
    }
    state->EndSession(request->worker_rank(), request->session());
    if (request->finished()) {
      const bool last = state->FinishRank(request->worker_rank());
      common::Log("shard %d: rank %d finished its training%s", state->shard(),
                  request->worker_rank(),
                  last ? "; every worker has finished" : "");
    } else {
      common::Log("shard %d: rank %d left (stopping)", state->shard(),
                  request->worker_rank());
    }
  } else if (request->worker_rank() == -1 && request->finished()) {
    // The finisher: the results are collected, the run is over.
    if (absl::Status closed = state->CloseRun(); !closed.ok()) {
      common::LogWarning("shard %d: refused to close the run: %s",
                         state->shard(), closed.ToString());
      reactor->Finish(ToGrpcStatus(closed));
      return reactor;
    }
    common::Log("shard %d: the run is closed (results collected)",
                state->shard());
  } else if (request->worker_rank() >= 0) {
    absl::Status session =
        state->OpenSession(request->worker_rank(), request->session());
    if (!session.ok()) {
      common::LogWarning("shard %d: refused a registration: %s", state->shard(),
                         session.ToString());
      reactor->Finish(ToGrpcStatus(session));
      return reactor;
    }
    common::Log(
        "shard %d: rank %d registered (its data resumes at example "
        "%d)",
        state->shard(), request->worker_rank(),
        state->SamplePosition(request->worker_rank()));
  }
  response->set_shard(state->shard());
  response->set_num_shards(state->num_shards());
  response->set_offset(state->range().begin);
  response->set_length(state->size());
  response->set_version(state->version());
  if (request->worker_rank() >= 0) {
    response->set_samples_applied(
        state->SamplePosition(request->worker_rank()));
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerReadReactor<grpc::ByteBuffer>* ParameterServiceImpl::Push(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  if (grpc::Status auth = Authenticate(context); !auth.ok()) {
    return new FailedPush(auth);
  }
  return new PushReactor(context, shared_, response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ParameterServiceImpl::Pull(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw) {
  if (grpc::Status auth = Authenticate(context); !auth.ok()) {
    return new FailedPull(auth);
  }
  PullRequest request;
  if (absl::Status s = common::ParseSmallMessage(*raw, &request); !s.ok()) {
    return new FailedPull(ToGrpcStatus(s));
  }
  ShardState* const state = shared_.state;
  if (request.shard() != state->shard()) {
    return new FailedPull(
        InvalidArgument(absl::StrCat("pull for shard ", request.shard(),
                                     " reached shard ", state->shard())));
  }
  if (request.worker_rank() < -1 ||
      request.worker_rank() >= shared_.num_workers) {
    return new FailedPull(InvalidArgument(
        absl::StrCat("worker rank ", request.worker_rank(), " is outside [-1, ",
                     shared_.num_workers, ")")));
  }
  if (request.min_version() < 0) {
    return new FailedPull(InvalidArgument("min_version must not be negative"));
  }
  if (request.worker_rank() >= 0) {
    if (absl::Status held =
            state->CheckSession(request.worker_rank(), request.session());
        !held.ok()) {
      return new FailedPull(ToGrpcStatus(held));
    }
    state->Touch(request.worker_rank());
  }
  if (!pull_slots_.Acquire(request.worker_rank())) {
    return new FailedPull(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat(request.worker_rank() >= 0
                         ? absl::StrCat("worker rank ", request.worker_rank())
                         : std::string("the evaluators"),
                     " already ", request.worker_rank() >= 0 ? "has" : "have",
                     " ", pull_slots_.per_rank(), " pulls in flight at shard ",
                     state->shard(),
                     " (--max_pulls_per_rank): each holds the version it "
                     "sends until the client reads it")));
  }
  return new PullReactor(
      shared_, request.worker_rank(), request.min_version(),
      request.has_have_version() && request.worker_rank() >= 0
          ? std::optional<int64_t>(request.have_version())
          : std::nullopt);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
ParameterServiceImpl::PushPull(grpc::CallbackServerContext* context) {
  if (grpc::Status auth = Authenticate(context); !auth.ok()) {
    return new FailedPushPull(auth);
  }
  return new PushPullReactor(context, shared_);
}

grpc::ServerUnaryReactor* ParameterServiceImpl::Stats(
    grpc::CallbackServerContext* context, const StatsRequest* /*request*/,
    StatsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status auth = Authenticate(context); !auth.ok()) {
    reactor->Finish(auth);
    return reactor;
  }
  *response = shared_.state->Stats();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace monsoon::server
