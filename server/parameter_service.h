// ParameterServiceImpl: the gRPC face of one shard, on the callback API so
// that a pull waiting for a version holds no thread. It validates requests
// (PushDecoder), then hands them to the shard's UpdateRule. Thread-safe.
#ifndef MONSOON_SERVER_PARAMETER_SERVICE_H_
#define MONSOON_SERVER_PARAMETER_SERVICE_H_

#include <cstdint>

#include "proto/config.pb.h"
#include "proto/service.grpc.pb.h"
#include "server/shard_state.h"
#include "server/update_rule.h"

namespace monsoon::server {

class ParameterServiceImpl final : public ParameterService::CallbackService {
 public:
  // `state` and `rule` are not owned and must outlive the service.
  ParameterServiceImpl(const TrainingConfig& resolved, int num_workers,
                       ShardState* state, UpdateRule* rule);

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const RegisterRequest* request,
                                     RegisterResponse* response) override;
  grpc::ServerReadReactor<PushChunk>* Push(grpc::CallbackServerContext* context,
                                           PushResponse* response) override;
  grpc::ServerWriteReactor<PullChunk>* Pull(
      grpc::CallbackServerContext* context,
      const PullRequest* request) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context,
                                  const StatsRequest* request,
                                  StatsResponse* response) override;

 private:
  // Constant after construction.
  const uint64_t fingerprint_;
  const int num_workers_;
  const size_t chunk_values_;
  const PushEncoding encoding_;
  const int bucket_size_;
  ShardState* const state_;
  UpdateRule* const rule_;
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_PARAMETER_SERVICE_H_
