// ParameterServiceImpl: the gRPC face of one shard, on the callback API so
// that a pull waiting for a version holds no thread. Push, Pull and PushPull
// take and give raw messages that common/wire.h reads and writes, so that
// tensors are copied once on the way in and not at all on the way out
// (pulls send the rule's Weights, shared). It validates requests
// (PushDecoder), then hands them to the shard's UpdateRule. Thread-safe.
#ifndef MONSOON_SERVER_PARAMETER_SERVICE_H_
#define MONSOON_SERVER_PARAMETER_SERVICE_H_

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <string>

#include "proto/config.pb.h"
#include "proto/service.grpc.pb.h"
#include "server/push_decoder.h"
#include "server/rank_slots.h"
#include "server/shard_state.h"
#include "server/update_rule.h"

namespace monsoon::server {

// Register and Stats typed, the tensor streams raw.
using RawParameterService = ParameterService::WithCallbackMethod_Register<
    ParameterService::WithRawCallbackMethod_Push<
        ParameterService::WithRawCallbackMethod_Pull<
            ParameterService::WithRawCallbackMethod_PushPull<
                ParameterService::WithCallbackMethod_Stats<
                    ParameterService::Service>>>>>;

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
  // sync_timeout_s plus 10 s, so that honest clients, which wait at most
  // sync_timeout_s, give up first.
  absl::Duration max_wait = absl::ZeroDuration();
};

class ParameterServiceImpl final : public RawParameterService {
 public:
  // `state` and `rule` are not owned and must outlive the service.
  ParameterServiceImpl(const TrainingConfig& resolved, int num_workers,
                       ShardState* state, UpdateRule* rule,
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

  // What every push and pull call of this service shares.
  struct Shared {
    int num_workers = 0;
    size_t chunk_values = 0;  // float32 values per pull chunk
    PushEncoding encoding = ENCODING_FLOAT32;
    int bucket_size = 0;
    ShardState* state = nullptr;
    UpdateRule* rule = nullptr;
    PushLimits limits;
    RankSlots* pull_slots = nullptr;
    absl::Duration max_wait;  // ServicePolicy::max_wait, resolved
    // Sync: a push-pull's wait for its step is the barrier, timed into
    // ShardState::barrier_wait_seconds().
    bool barrier = false;
  };

 private:
  // OK, or UNAUTHENTICATED when the call lacks the run's token.
  grpc::Status Authenticate(const grpc::CallbackServerContext* context) const;

  // Constant after construction.
  const uint64_t fingerprint_;
  const std::string auth_token_;  // empty: no authentication
  RankSlots push_slots_;
  RankSlots pull_slots_;
  const Shared shared_;
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_PARAMETER_SERVICE_H_
