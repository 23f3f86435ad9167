// ParameterServiceImpl: the gRPC face of one shard, on the callback API so
// that a pull waiting for a version holds no thread. It authenticates each
// call and translates it for the Shard (server/shard.h), which decides
// everything; the tensor streams are raw messages that common/wire.h reads
// and writes (server/stream_reactors.h), so that tensors are copied once on
// the way in and not at all on the way out. Thread-safe.
#ifndef MONSOON_SERVER_PARAMETER_SERVICE_H_
#define MONSOON_SERVER_PARAMETER_SERVICE_H_

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <memory>
#include <string>

#include "proto/config.pb.h"
#include "proto/service.grpc.pb.h"
#include "server/rank_slots.h"
#include "server/replication.h"
#include "server/shard.h"
#include "server/shard_state.h"
#include "server/stream_reactors.h"
#include "server/task_threads.h"
#include "server/update_rule.h"

namespace monsoon::server {

// The unary calls typed, the tensor streams raw.
// clang-format off
using RawParameterService = ParameterService::WithCallbackMethod_Register<
    ParameterService::WithRawCallbackMethod_Push<
        ParameterService::WithRawCallbackMethod_Pull<
            ParameterService::WithRawCallbackMethod_PushPull<
                ParameterService::WithCallbackMethod_Stats<
                    ParameterService::WithCallbackMethod_Leave<
                        ParameterService::WithCallbackMethod_FinishRank<
                            ParameterService::WithCallbackMethod_CloseRun<
                                ParameterService::WithCallbackMethod_SparsePull<
                                    ParameterService::WithCallbackMethod_SparsePush<
                                        ParameterService::WithCallbackMethod_RendezvousSet<
                                            ParameterService::WithCallbackMethod_RendezvousGet<
                                                ParameterService::WithCallbackMethod_Repair<
                                                    ParameterService::WithRawCallbackMethod_Replicate<
                                                        ParameterService::WithCallbackMethod_TakeData<
                                                            ParameterService::Service>>>>>>>>>>>>>>>;
// clang-format on

// What a shard's service lets clients do.
struct ServicePolicy {
  // With a token, every call must carry it (common/auth.h) or is answered
  // UNAUTHENTICATED before anything is read or changed.
  std::string auth_token;
  // A push with a value beyond this magnitude is refused.
  float max_abs_gradient = 1e9f;
  // Pushes one rank may have in flight (each holds a shard-sized buffer);
  // more are refused RESOURCE_EXHAUSTED.
  int max_pushes_per_rank = 4;
  // Pulls (and push-pulls past their push) one rank may have in flight,
  // each holding the version it sends until the client has read it; more
  // are refused RESOURCE_EXHAUSTED.
  int max_pulls_per_rank = 4;
  // The longest a pull (or a push-pull's wait for its step) waits for a
  // version before it is answered DEADLINE_EXCEEDED. Zero: the config's
  // call_timeout_s plus 10 s, so that honest clients, which wait at most
  // call_timeout_s, give up first.
  absl::Duration max_wait = absl::ZeroDuration();
};

// One range's core, not owned (each must outlive the service).
struct RangeCore {
  ShardState* state = nullptr;
  UpdateRule* rule = nullptr;
  ShardSparseTables* sparse = nullptr;  // null: none
  Replication* replication = nullptr;   // null: not replicated
};

class ParameterServiceImpl final : public RawParameterService {
 public:
  // `state`, `rule` and `sparse` (the shard's sparse tables; null: none)
  // are not owned and must outlive the service.
  ParameterServiceImpl(const TrainingConfig& resolved, int num_workers,
                       ShardState* state, UpdateRule* rule,
                       ServicePolicy policy = {},
                       ShardSparseTables* sparse = nullptr);
  // With replication (ps_server --replicas): the process's own range and
  // the backup of the previous shard's.
  ParameterServiceImpl(const TrainingConfig& resolved, int num_workers,
                       const RangeCore& own, const RangeCore& backup,
                       ServicePolicy policy = {});

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const RegisterRequest* request,
                                     RegisterResponse* response) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* Push(
      grpc::CallbackServerContext* context,
      grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Pull(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* PushPull(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context,
                                  const StatsRequest* request,
                                  StatsResponse* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const LeaveRequest* request,
                                  LeaveResponse* response) override;
  grpc::ServerUnaryReactor* FinishRank(grpc::CallbackServerContext* context,
                                       const LeaveRequest* request,
                                       LeaveResponse* response) override;
  grpc::ServerUnaryReactor* CloseRun(grpc::CallbackServerContext* context,
                                     const CloseRunRequest* request,
                                     CloseRunResponse* response) override;
  grpc::ServerUnaryReactor* SparsePull(grpc::CallbackServerContext* context,
                                       const SparsePullRequest* request,
                                       SparsePullResponse* response) override;
  grpc::ServerUnaryReactor* SparsePush(grpc::CallbackServerContext* context,
                                       const SparsePushRequest* request,
                                       SparsePushResponse* response) override;
  grpc::ServerUnaryReactor* RendezvousSet(
      grpc::CallbackServerContext* context,
      const RendezvousSetRequest* request,
      RendezvousSetResponse* response) override;
  grpc::ServerUnaryReactor* RendezvousGet(
      grpc::CallbackServerContext* context,
      const RendezvousGetRequest* request,
      RendezvousGetResponse* response) override;
  grpc::ServerUnaryReactor* Repair(grpc::CallbackServerContext* context,
                                   const RepairRequest* request,
                                   RepairResponse* response) override;
  grpc::ServerUnaryReactor* TakeData(grpc::CallbackServerContext* context,
                                     const TakeDataRequest* request,
                                     TakeDataResponse* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Replicate(
      grpc::CallbackServerContext* context) override;

  // Ends the Replicate calls open on this service, and refuses new ones:
  // the process is stopping (a primary keeps its call open for the run).
  void EndReplicateCalls();

 private:
  // One range's core and what its calls share. With --replicas a service
  // holds two: the process's own range and the previous shard's backup.
  struct Range {
    Range(const TrainingConfig& resolved, int num_workers,
          const ServicePolicy& policy, const RangeCore& core);
    RankSlots push_slots;
    RankSlots pull_slots;
    Shard shard;
    StreamContext streams;
  };

  // OK, or UNAUTHENTICATED when the call lacks the run's token.
  grpc::Status Authenticate(const grpc::CallbackServerContext* context) const;
  // The range a call is for: the backup's when `shard` names it, else the
  // process's own.
  Range& For(int shard);
  // The range a stream call is for, from its metadata
  // (common::kRangeMetadataKey; absent: the process's own).
  Range& ForStream(const grpc::CallbackServerContext* context);

  // Constant after construction.
  const std::string auth_token_;  // empty: no authentication
  // With replication: the threads that forward pushes (StreamContext::tasks).
  std::unique_ptr<TaskThreads> tasks_;
  std::unique_ptr<Range> own_;
  std::unique_ptr<Range> backup_;  // null without --replicas
  ReplicateCalls replicate_calls_;
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_PARAMETER_SERVICE_H_
