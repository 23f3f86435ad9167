#include "tools/bench/monsoon_wire.h"

#include "common/config.h"
#include "common/model_layout.h"
#include "common/onebit.h"

namespace monsoon::tools {

absl::StatusOr<std::unique_ptr<MonsoonWire>> MonsoonWire::Start(
    uint64_t values, Mode mode, bool onebit, uint64_t chunk_bytes) {
  std::unique_ptr<MonsoonWire> wire(new MonsoonWire());
  TrainingConfig config;
  // One layer of k outputs and (values / k - 1) inputs: `values`
  // parameters. k is the least power of two from 2 that keeps the input
  // within the config's limit on a layer's size.
  uint64_t k = 2;
  while (values % k == 0 && values / k - 1 > (1u << 20)) k *= 2;
  if (values < 4 || values % k != 0) {
    return absl::InvalidArgumentError(
        "the parameter count must be a multiple of a power of two, at least 4");
  }
  config.add_layer_sizes(static_cast<int>(values / k - 1));
  config.add_layer_sizes(static_cast<int>(k));
  config.set_mode(mode);
  config.set_chunk_bytes(static_cast<int>(chunk_bytes));
  if (onebit) config.set_compression(COMPRESSION_ONEBIT);
  absl::StatusOr<TrainingConfig> resolved = common::ResolveConfig(config);
  if (!resolved.ok()) return resolved.status();
  wire->config_ = *resolved;

  server::ShardServerOptions options;
  options.config = wire->config_;
  options.num_workers = 1;
  options.listen_address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<server::ShardServer>> server =
      server::ShardServer::Start(options);
  if (!server.ok()) return server.status();
  wire->server_ = *std::move(server);

  worker::PsClientOptions client_options;
  client_options.server_addresses = {wire->server_->address()};
  client_options.config = wire->config_;
  absl::StatusOr<std::unique_ptr<worker::PsClient>> client =
      worker::PsClient::Connect(client_options);
  if (!client.ok()) return client.status();
  wire->client_ = *std::move(client);
  // Small gradients: thousands of SGD steps with momentum stay finite.
  wire->grads_ = common::UniformValues(values, /*seed=*/7, 1e-4f);
  wire->params_.resize(values);
  return wire;
}

uint64_t MonsoonWire::push_wire_bytes() const {
  const uint64_t n = grads_.size();
  if (config_.compression() != COMPRESSION_ONEBIT) return n * sizeof(float);
  const int bucket = config_.onebit_bucket_size();
  return common::OneBitBitsBytes(n, bucket) +
         common::OneBitBuckets(n, bucket) * 2 * sizeof(float);
}

absl::Status MonsoonWire::Push() {
  absl::Status status = client_->Push(grads_, versions_, /*samples=*/1);
  ++versions_[0];
  return status;
}

absl::Status MonsoonWire::Pull() {
  return client_->Pull(versions_[0], absl::Seconds(30),
                       absl::MakeSpan(params_), &versions_);
}

absl::Status MonsoonWire::PushPull() {
  absl::Status status = Push();
  if (!status.ok()) return status;
  return Pull();
}

}  // namespace monsoon::tools
