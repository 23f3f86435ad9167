#include "server/parameter_service.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/config.h"
#include "common/float_bytes.h"
#include "common/grpc_status.h"
#include "server/push_decoder.h"

namespace monsoon::server {
namespace {

using common::ToGrpcStatus;

grpc::Status InvalidArgument(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

// Reads a push stream chunk by chunk, then applies it. Deletes itself.
class PushReactor : public grpc::ServerReadReactor<PushChunk> {
 public:
  PushReactor(grpc::CallbackServerContext* context, ShardState* state,
              UpdateRule* rule, int num_workers, PushEncoding encoding,
              int bucket_size, PushResponse* response)
      : context_(context),
        state_(state),
        rule_(rule),
        decoder_(state->shard(), state->size(), num_workers, encoding,
                 bucket_size),
        response_(response) {
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    if (ok) {
      absl::Status status = decoder_.Add(chunk_);
      if (!status.ok()) return Reject(status);
      StartRead(&chunk_);
      return;
    }
    // The stream ended, or the call was cancelled: apply only a whole push.
    if (context_->IsCancelled()) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "push cancelled"));
      return;
    }
    absl::StatusOr<PushData> push = decoder_.Finish();
    if (!push.ok()) return Reject(push.status());
    absl::StatusOr<PushResult> result = rule_->Apply(*push);
    if (!result.ok()) return Reject(result.status());
    response_->set_version(result->version);
    response_->set_staleness(result->staleness);
    Finish(grpc::Status::OK);
  }

  void OnDone() override { delete this; }

 private:
  void Reject(const absl::Status& status) {
    state_->RecordRejectedPush();
    Finish(ToGrpcStatus(status));
  }

  grpc::CallbackServerContext* const context_;
  ShardState* const state_;
  UpdateRule* const rule_;
  PushDecoder decoder_;
  PushResponse* const response_;
  PushChunk chunk_;
};

// Waits (without a thread) for the wanted version, then streams a snapshot.
// Deletes itself.
class PullReactor : public grpc::ServerWriteReactor<PullChunk> {
 public:
  PullReactor(ShardState* state, UpdateRule* rule, int64_t min_version,
              bool count_bytes, size_t chunk_values)
      : state_(state),
        rule_(rule),
        count_bytes_(count_bytes),
        chunk_values_(chunk_values) {
    // May call Ready() at once, on this thread.
    waiter_id_ = state_->WhenVersionAtLeast(min_version, [this] { Ready(); });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "pull cancelled"));
      return;
    }
    WriteNext();
  }

  void OnCancel() override {
    // If the waiter had already run, the write path finishes the call.
    if (state_->CancelWaiter(waiter_id_)) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                          "pull cancelled while waiting for its version"));
    }
  }

  void OnDone() override { delete this; }

 private:
  void Ready() {
    rule_->Snapshot(&snapshot_, &version_);
    WriteNext();
  }

  // Sends the next chunk, or finishes once all are sent. Shards are never
  // empty (the server refuses more shards than parameters).
  void WriteNext() {
    if (sent_ == snapshot_.size()) {
      Finish(grpc::Status::OK);
      return;
    }
    const size_t n = std::min(chunk_values_, snapshot_.size() - sent_);
    chunk_.Clear();
    chunk_.set_version(version_);
    chunk_.set_offset(sent_);
    common::AppendFloatBytes(absl::MakeConstSpan(snapshot_.data() + sent_, n),
                             chunk_.mutable_data());
    sent_ += n;
    if (count_bytes_) {
      state_->RecordPulledBytes(static_cast<int64_t>(chunk_.ByteSizeLong()));
    }
    StartWrite(&chunk_);
  }

  ShardState* const state_;
  UpdateRule* const rule_;
  const bool count_bytes_;
  const size_t chunk_values_;
  uint64_t waiter_id_ = 0;
  std::vector<float> snapshot_;
  int64_t version_ = 0;
  size_t sent_ = 0;
  PullChunk chunk_;
};

}  // namespace

ParameterServiceImpl::ParameterServiceImpl(const TrainingConfig& resolved,
                                           int num_workers, ShardState* state,
                                           UpdateRule* rule)
    : fingerprint_(common::ConfigFingerprint(resolved)),
      num_workers_(num_workers),
      chunk_values_(static_cast<size_t>(resolved.chunk_bytes()) /
                    sizeof(float)),
      encoding_(PushEncodingFor(resolved)),
      bucket_size_(resolved.onebit_bucket_size()),
      state_(state),
      rule_(rule) {}

grpc::ServerUnaryReactor* ParameterServiceImpl::Register(
    grpc::CallbackServerContext* context, const RegisterRequest* request,
    RegisterResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (request->config_fingerprint() != fingerprint_) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrFormat("config fingerprint %016x differs from shard %d's "
                        "%016x: every daemon of a run must read the same "
                        "config (data_dir aside)",
                        request->config_fingerprint(), state_->shard(),
                        fingerprint_)));
    return reactor;
  }
  if (request->shard() != state_->shard()) {
    reactor->Finish(InvalidArgument(
        absl::StrCat("this is shard ", state_->shard(), ", not shard ",
                     request->shard(), ": list --servers in shard order")));
    return reactor;
  }
  if (request->worker_rank() < -1 || request->worker_rank() >= num_workers_) {
    reactor->Finish(InvalidArgument(absl::StrCat(
        "worker rank ", request->worker_rank(), " is outside [0, ",
        num_workers_, ") (-1 for an evaluator): check --num_workers")));
    return reactor;
  }
  response->set_shard(state_->shard());
  response->set_num_shards(state_->num_shards());
  response->set_offset(state_->range().begin);
  response->set_length(state_->size());
  response->set_version(state_->version());
  if (request->worker_rank() >= 0) {
    response->set_samples_applied(
        state_->AppliedSamples(request->worker_rank()));
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerReadReactor<PushChunk>* ParameterServiceImpl::Push(
    grpc::CallbackServerContext* context, PushResponse* response) {
  return new PushReactor(context, state_, rule_, num_workers_, encoding_,
                         bucket_size_, response);
}

namespace {

// Answers a pull that fails validation at once.
class FailedPull : public grpc::ServerWriteReactor<PullChunk> {
 public:
  explicit FailedPull(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerWriteReactor<PullChunk>* ParameterServiceImpl::Pull(
    grpc::CallbackServerContext* context, const PullRequest* request) {
  if (request->shard() != state_->shard()) {
    return new FailedPull(
        InvalidArgument(absl::StrCat("pull for shard ", request->shard(),
                                     " reached shard ", state_->shard())));
  }
  if (request->worker_rank() < -1 || request->worker_rank() >= num_workers_) {
    return new FailedPull(
        InvalidArgument(absl::StrCat("worker rank ", request->worker_rank(),
                                     " is outside [-1, ", num_workers_, ")")));
  }
  if (request->min_version() < 0) {
    return new FailedPull(InvalidArgument("min_version must not be negative"));
  }
  return new PullReactor(state_, rule_, request->min_version(),
                         request->worker_rank() >= 0, chunk_values_);
}

grpc::ServerUnaryReactor* ParameterServiceImpl::Stats(
    grpc::CallbackServerContext* context, const StatsRequest* /*request*/,
    StatsResponse* response) {
  *response = state_->Stats();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace monsoon::server
