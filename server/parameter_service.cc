#include "server/parameter_service.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/grpc_status.h"
#include "common/wire.h"

namespace monsoon::server {
namespace {

using common::ToGrpcStatus;

// Finishes a unary call with `status`.
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context,
                                 const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

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

ParameterServiceImpl::Range::Range(const TrainingConfig& resolved,
                                   int num_workers,
                                   const ServicePolicy& policy,
                                   const RangeCore& core)
    : push_slots(policy.max_pushes_per_rank),
      pull_slots(policy.max_pulls_per_rank),
      shard(resolved, num_workers, core.state, core.rule,
            policy.max_wait > absl::ZeroDuration()
                ? policy.max_wait
                : absl::Seconds(resolved.call_timeout_s()) + absl::Seconds(10),
            core.sparse, core.replication),
      streams{&shard,
              static_cast<size_t>(resolved.chunk_bytes()) / sizeof(float),
              common::PushEncodingFor(resolved),
              resolved.onebit_bucket_size(),
              // allreduce: rank 0 publishes the weights with the run's
              // examples since its last publish, any number of steps.
              PushLimits{policy.max_abs_gradient,
                         resolved.mode() == ALLREDUCE
                             ? std::numeric_limits<int64_t>::max()
                             : static_cast<int64_t>(resolved.batch_size()) *
                                   StepsPerPush(resolved),
                         &push_slots,
                         /*digest=*/resolved.mode() == SYNC},
              &pull_slots,
              /*barrier=*/resolved.mode() == SYNC} {}

ParameterServiceImpl::ParameterServiceImpl(const TrainingConfig& resolved,
                                           int num_workers, ShardState* state,
                                           UpdateRule* rule,
                                           ServicePolicy policy,
                                           ShardSparseTables* sparse)
    : auth_token_(policy.auth_token),
      own_(std::make_unique<Range>(resolved, num_workers, policy,
                                   RangeCore{state, rule, sparse, nullptr})) {}

ParameterServiceImpl::ParameterServiceImpl(const TrainingConfig& resolved,
                                           int num_workers,
                                           const RangeCore& own,
                                           const RangeCore& backup,
                                           ServicePolicy policy)
    : auth_token_(policy.auth_token),
      // Forwards block until the backup has applied them: enough threads
      // for every rank's pushes in flight, within reason.
      tasks_(std::make_unique<TaskThreads>(
          std::clamp(num_workers * policy.max_pushes_per_rank, 4, 64))),
      own_(std::make_unique<Range>(resolved, num_workers, policy, own)),
      backup_(std::make_unique<Range>(resolved, num_workers, policy, backup)) {
  own_->streams.tasks = tasks_.get();
  backup_->streams.tasks = tasks_.get();
}

ParameterServiceImpl::Range& ParameterServiceImpl::For(int shard) {
  if (backup_ != nullptr && shard == backup_->shard.state()->shard()) {
    return *backup_;
  }
  return *own_;
}

ParameterServiceImpl::Range& ParameterServiceImpl::ForStream(
    const grpc::CallbackServerContext* context) {
  if (backup_ == nullptr) return *own_;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(common::kRangeMetadataKey);
  int shard = -1;
  if (it == metadata.end() ||
      !absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()),
                        &shard)) {
    return *own_;
  }
  return For(shard);
}

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
  grpc::Status status = Authenticate(context);
  if (status.ok()) {
    absl::StatusOr<RegisterResponse> registered = For(request->shard()).shard.Register(*request);
    status = ToGrpcStatus(registered.status());
    if (registered.ok()) *response = *std::move(registered);
  }
  return Answer(context, status);
}

grpc::ServerUnaryReactor* ParameterServiceImpl::Leave(
    grpc::CallbackServerContext* context, const LeaveRequest* request,
    LeaveResponse* /*response*/) {
  grpc::Status status = Authenticate(context);
  if (status.ok()) status = ToGrpcStatus(For(request->shard()).shard.Leave(*request));
  return Answer(context, status);
}

grpc::ServerUnaryReactor* ParameterServiceImpl::FinishRank(
    grpc::CallbackServerContext* context, const LeaveRequest* request,
    LeaveResponse* /*response*/) {
  grpc::Status status = Authenticate(context);
  if (status.ok()) status = ToGrpcStatus(For(request->shard()).shard.FinishRank(*request));
  return Answer(context, status);
}

grpc::ServerUnaryReactor* ParameterServiceImpl::CloseRun(
    grpc::CallbackServerContext* context, const CloseRunRequest* request,
    CloseRunResponse* /*response*/) {
  grpc::Status status = Authenticate(context);
  if (status.ok()) status = ToGrpcStatus(For(request->shard()).shard.CloseRun(*request));
  return Answer(context, status);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* ParameterServiceImpl::Push(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  if (grpc::Status auth = Authenticate(context); !auth.ok()) {
    return FailedPush(auth);
  }
  return NewPushReactor(context, ForStream(context).streams, response);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
ParameterServiceImpl::Replicate(grpc::CallbackServerContext* context) {
  if (grpc::Status auth = Authenticate(context); !auth.ok()) {
    return FailedReplicate(auth);
  }
  return NewReplicateReactor(ForStream(context).streams, &replicate_calls_);
}

void ParameterServiceImpl::EndReplicateCalls() {
  replicate_calls_.EndAll(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                       "the backup's process is stopping"));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ParameterServiceImpl::Pull(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw) {
  if (grpc::Status auth = Authenticate(context); !auth.ok()) {
    return FailedPull(auth);
  }
  PullRequest request;
  if (absl::Status s = common::ParseSmallMessage(*raw, &request); !s.ok()) {
    return FailedPull(ToGrpcStatus(s));
  }
  Range& range = For(request.shard());
  if (absl::Status admitted = range.shard.AdmitPull(request); !admitted.ok()) {
    return FailedPull(ToGrpcStatus(admitted));
  }
  if (!range.pull_slots.Acquire(request.worker_rank())) {
    return FailedPull(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat(request.worker_rank() >= 0
                         ? absl::StrCat("worker rank ", request.worker_rank())
                         : std::string("the evaluators"),
                     " already ", request.worker_rank() >= 0 ? "has" : "have",
                     " ", range.pull_slots.per_rank(),
                     " pulls in flight at shard ", range.shard.state()->shard(),
                     " (--max_pulls_per_rank): each holds the version it "
                     "sends until the client reads it")));
  }
  return NewPullReactor(range.streams, request.worker_rank(), request.min_version(),
                        request.has_have_version() && request.worker_rank() >= 0
                            ? std::optional<int64_t>(request.have_version())
                            : std::nullopt);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
ParameterServiceImpl::PushPull(grpc::CallbackServerContext* context) {
  if (grpc::Status auth = Authenticate(context); !auth.ok()) {
    return FailedPushPull(auth);
  }
  return NewPushPullReactor(context, ForStream(context).streams);
}

grpc::ServerUnaryReactor* ParameterServiceImpl::Stats(
    grpc::CallbackServerContext* context, const StatsRequest* request,
    StatsResponse* response) {
  grpc::Status status = Authenticate(context);
  if (status.ok()) {
    const Shard& shard =
        (request->has_shard() ? For(request->shard()) : *own_).shard;
    *response = shard.Stats();
    if (request->with_config()) *response->mutable_config() = shard.config();
  }
  return Answer(context, status);
}

grpc::ServerUnaryReactor* ParameterServiceImpl::Repair(
    grpc::CallbackServerContext* context, const RepairRequest* request,
    RepairResponse* response) {
  grpc::Status status = Authenticate(context);
  if (status.ok()) {
    absl::StatusOr<RepairResponse> copy =
        For(request->shard()).shard.Repair(*request);
    status = ToGrpcStatus(copy.status());
    if (copy.ok()) *response = *std::move(copy);
  }
  return Answer(context, status);
}

grpc::ServerUnaryReactor* ParameterServiceImpl::TakeData(
    grpc::CallbackServerContext* context, const TakeDataRequest* request,
    TakeDataResponse* response) {
  grpc::Status status = Authenticate(context);
  if (status.ok()) {
    absl::StatusOr<TakeDataResponse> next =
        For(request->shard()).shard.TakeData(*request);
    status = ToGrpcStatus(next.status());
    if (next.ok()) *response = *std::move(next);
  }
  return Answer(context, status);
}

grpc::ServerUnaryReactor* ParameterServiceImpl::SparsePull(
    grpc::CallbackServerContext* context, const SparsePullRequest* request,
    SparsePullResponse* response) {
  grpc::Status status = Authenticate(context);
  if (status.ok()) {
    absl::StatusOr<SparsePullResponse> rows = For(request->caller().shard()).shard.SparsePull(*request);
    status = ToGrpcStatus(rows.status());
    if (rows.ok()) *response = *std::move(rows);
  }
  return Answer(context, status);
}

grpc::ServerUnaryReactor* ParameterServiceImpl::SparsePush(
    grpc::CallbackServerContext* context, const SparsePushRequest* request,
    SparsePushResponse* response) {
  grpc::Status status = Authenticate(context);
  if (status.ok() && tasks_ != nullptr && !request->from_primary()) {
    // Replicated: the push waits for the range's backup to apply it, which
    // takes one of gRPC's threads in the backup's process: not on one of
    // gRPC's here (two processes forwarding to each other would hold them
    // all).
    Range& range = For(request->caller().shard());
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    tasks_->Run([&range, request, response, reactor] {
      absl::StatusOr<SparsePushResponse> applied =
          range.shard.SparsePush(*request);
      if (applied.ok()) *response = *std::move(applied);
      reactor->Finish(ToGrpcStatus(applied.status()));
    });
    return reactor;
  }
  if (status.ok()) {
    absl::StatusOr<SparsePushResponse> applied =
        For(request->caller().shard()).shard.SparsePush(*request);
    status = ToGrpcStatus(applied.status());
    if (applied.ok()) *response = *std::move(applied);
  }
  return Answer(context, status);
}

grpc::ServerUnaryReactor* ParameterServiceImpl::RendezvousSet(
    grpc::CallbackServerContext* context, const RendezvousSetRequest* request,
    RendezvousSetResponse* /*response*/) {
  grpc::Status status = Authenticate(context);
  if (status.ok()) status = ToGrpcStatus(
        For(request->caller().shard()).shard.RendezvousSet(*request));
  return Answer(context, status);
}

grpc::ServerUnaryReactor* ParameterServiceImpl::RendezvousGet(
    grpc::CallbackServerContext* context, const RendezvousGetRequest* request,
    RendezvousGetResponse* response) {
  grpc::Status status = Authenticate(context);
  if (status.ok()) {
    absl::StatusOr<RendezvousGetResponse> found =
        For(request->caller().shard()).shard.RendezvousGet(*request);
    status = ToGrpcStatus(found.status());
    if (found.ok()) *response = *std::move(found);
  }
  return Answer(context, status);
}

}  // namespace monsoon::server
