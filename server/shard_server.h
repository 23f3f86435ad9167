// ShardServer: one running shard: its state, its update rule, the parameter
// service and the standard gRPC health service on one listening port.
// Owns everything it starts; the destructor shuts the server down. Methods
// are thread-safe.
#ifndef MONSOON_SERVER_SHARD_SERVER_H_
#define MONSOON_SERVER_SHARD_SERVER_H_

#include <memory>
#include <string>

#include <grpcpp/server.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/config.pb.h"
#include "server/parameter_service.h"
#include "server/shard_state.h"
#include "server/update_rule.h"

namespace monsoon::server {

struct ShardServerOptions {
  TrainingConfig config;  // resolved
  int shard = 0;
  int num_shards = 1;
  int num_workers = 1;
  // host:port; port 0 picks a free one (see ShardServer::port()).
  std::string listen_address = "127.0.0.1:0";
};

class ShardServer {
 public:
  // Validates the options (INVALID_ARGUMENT), builds the shard and starts
  // serving (UNAVAILABLE when the address cannot be bound).
  static absl::StatusOr<std::unique_ptr<ShardServer>> Start(
      const ShardServerOptions& options);
  ~ShardServer();

  int port() const { return port_; }
  std::string address() const;
  ShardState* state() { return state_.get(); }

  // Reports NOT_SERVING, then stops: calls still running after `grace` are
  // cancelled (pulls waiting for a version among them). Idempotent.
  void Shutdown(absl::Duration grace = absl::Seconds(2));

 private:
  ShardServer() = default;

  // Constant after Start. Destroyed in reverse order: the server first, then
  // the service, the rule and the state that its calls use.
  std::string host_;
  int port_ = 0;
  std::unique_ptr<ShardState> state_;
  std::unique_ptr<UpdateRule> rule_;
  std::unique_ptr<ParameterServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
};

// Tensor streams use chunks of up to 4 MiB; leave room for the headers.
inline constexpr int kMaxMessageBytes = 8 << 20;

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_SHARD_SERVER_H_
