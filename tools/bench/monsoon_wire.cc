#include "tools/bench/monsoon_wire.h"

#include "common/config.h"
#include "common/model_layout.h"
#include "common/onebit.h"
#include "worker/cpu_backend.h"

namespace monsoon::tools {
namespace {

// One shard of `resolved` on `listen` (one worker) and a client of it.
absl::Status StartShardAndClient(const TrainingConfig& resolved,
                                 const std::string& listen,
                                 std::unique_ptr<server::ShardServer>* server,
                                 std::unique_ptr<worker::PsClient>* client) {
  server::ShardServerOptions options;
  options.config = resolved;
  options.num_workers = 1;
  options.listen_address = listen;
  absl::StatusOr<std::unique_ptr<server::ShardServer>> started =
      server::ShardServer::Start(options);
  if (!started.ok()) return started.status();
  *server = *std::move(started);
  worker::PsClientOptions client_options;
  client_options.server_addresses = {(*server)->address()};
  client_options.config = resolved;
  absl::StatusOr<std::unique_ptr<worker::PsClient>> connected =
      worker::PsClient::Connect(client_options);
  if (!connected.ok()) return connected.status();
  *client = *std::move(connected);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<MonsoonWire>> MonsoonWire::Start(
    uint64_t values, Mode mode, bool onebit, uint64_t chunk_bytes,
    const std::string& listen) {
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

  if (absl::Status s = StartShardAndClient(wire->config_, listen,
                                           &wire->server_, &wire->client_);
      !s.ok()) {
    return s;
  }
  wire->backend_ = worker::MakeCpuBackend(1);
  absl::StatusOr<std::unique_ptr<worker::GradientPusher>> pusher =
      worker::GradientPusher::Create(wire->backend_.get(), wire->client_.get(),
                                     wire->config_);
  if (!pusher.ok()) return pusher.status();
  wire->pusher_ = *std::move(pusher);
  absl::StatusOr<float*> grads = wire->backend_->AllocateFloats(values);
  if (!grads.ok()) return grads.status();
  wire->grads_ = *grads;
  wire->values_ = values;
  // Small gradients: thousands of SGD steps with momentum stay finite.
  const std::vector<float> host = common::UniformValues(values, 7, 1e-4f);
  absl::Status copied = wire->backend_->CopyToDevice(host.data(), wire->grads_,
                                                     values * sizeof(float));
  if (!copied.ok()) return copied;
  wire->params_.resize(values);
  return wire;
}

uint64_t MonsoonWire::push_wire_bytes() const {
  const uint64_t n = values_;
  if (config_.compression() != COMPRESSION_ONEBIT) return n * sizeof(float);
  const int bucket = config_.onebit_bucket_size();
  return common::OneBitBitsBytes(n, bucket) +
         common::OneBitBuckets(n, bucket) * 2 * sizeof(float);
}

double MonsoonWire::update_seconds() const {
  return server_->state()->apply_seconds().Read().sum;
}

MonsoonWire::~MonsoonWire() {
  pusher_.reset();
  if (grads_ != nullptr) backend_->Free(grads_);
}

absl::Status MonsoonWire::Push(const worker::PullTarget* pull) {
  absl::StatusOr<std::unique_ptr<worker::PendingCall>> push =
      pusher_->Push(grads_, versions_, /*samples=*/1, next_offset_++, pull);
  absl::Status status = push.ok() ? (*push)->Wait() : push.status();
  if (pull == nullptr) ++versions_[0];  // a push-pull sets them
  return status;
}

absl::Status MonsoonWire::Push() { return Push(nullptr); }

absl::Status MonsoonWire::Pull() {
  return client_->Pull(versions_[0], absl::Seconds(30), absl::MakeSpan(params_),
                       &versions_);
}

absl::Status MonsoonWire::PushPull() {
  const worker::PullTarget pull{absl::MakeSpan(params_), &versions_,
                                absl::Seconds(30)};
  return Push(&pull);
}

absl::StatusOr<std::unique_ptr<SparseWire>> SparseWire::Start(int dim,
                                                             int64_t rows,
                                                             int batch) {
  std::unique_ptr<SparseWire> wire(new SparseWire());
  TrainingConfig config;
  // A token dense model beside the table: the shard holds one anyway.
  config.add_layer_sizes(4);
  config.add_layer_sizes(2);
  config.set_mode(DOWNPOUR);
  SparseTableConfig* table = config.add_sparse_tables();
  table->set_name("emb");
  table->set_dim(dim);
  table->set_max_rows(rows);
  absl::StatusOr<TrainingConfig> resolved = common::ResolveConfig(config);
  if (!resolved.ok()) return resolved.status();

  if (absl::Status s = StartShardAndClient(*resolved, "127.0.0.1:0",
                                           &wire->server_, &wire->client_);
      !s.ok()) {
    return s;
  }
  wire->dim_ = dim;
  wire->rows_ = rows;
  wire->ids_.resize(batch);
  wire->grads_ = common::UniformValues(static_cast<size_t>(batch) * dim,
                                       /*seed=*/5, 1e-2f);
  wire->pulled_.resize(static_cast<size_t>(batch) * dim);
  return wire;
}

void SparseWire::NextIds() {
  for (uint64_t& id : ids_) {
    id = common::SplitMix64(++draws_) % static_cast<uint64_t>(rows_);
  }
}

absl::Status SparseWire::Push() {
  NextIds();
  const int64_t before = client_->bytes_pushed();
  absl::Status status =
      client_->SparsePush("emb", ids_, grads_, absl::Seconds(30));
  push_bytes_ = static_cast<uint64_t>(client_->bytes_pushed() - before);
  return status;
}

absl::Status SparseWire::Pull() {
  NextIds();
  const int64_t before = client_->bytes_pulled();
  absl::Status status = client_->SparsePull("emb", ids_,
                                            absl::MakeSpan(pulled_),
                                            absl::Seconds(30));
  pull_bytes_ = static_cast<uint64_t>(client_->bytes_pulled() - before);
  return status;
}

}  // namespace monsoon::tools
