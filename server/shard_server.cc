#include "server/shard_server.h"

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/auth.h"
#include "common/config.h"
#include "common/float_bytes.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/machine_memory.h"
#include "common/model_layout.h"
#include "common/socket_buffers.h"
#include "common/sparse_ids.h"
#include "common/wire.h"
#include "server/checkpoint.h"
#include "server/policies/policy_factory.h"
#include "server/shard_metrics.h"

namespace monsoon::server {

absl::Status CheckListenAddress(absl::string_view address) {
  if (absl::StartsWith(address, kUnixPrefix)) {
    const absl::string_view path = address.substr(kUnixPrefix.size());
    // sockaddr_un holds 108 bytes with the terminating NUL.
    if (path.empty() || path.size() > 107) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--listen='", address,
          "' needs a socket path of 1 to 107 bytes after unix:, e.g. "
          "unix:/run/monsoon/ps-0.sock"));
    }
    return absl::OkStatus();
  }
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen='", address,
        "' is not host:port with a port from 0 to 65535 (0 picks a free "
        "one), e.g. 0.0.0.0:5000, nor unix:PATH (a Unix domain socket, for "
        "workers on the same machine)"));
  }
  return absl::OkStatus();
}

namespace {

// The counts and the address: INVALID_ARGUMENT saying which is wrong.
absl::Status CheckCounts(const ShardServerOptions& options,
                         const common::ModelLayout& layout) {
  if (options.num_shards < 1 ||
      static_cast<uint64_t>(options.num_shards) > layout.num_params()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num_shards must be from 1 to the parameter count (",
                     layout.num_params(), "), got ", options.num_shards));
  }
  if (options.shard < 0 || options.shard >= options.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat("--shard must be in [0, ",
                                                   options.num_shards,
                                                   "), got ", options.shard));
  }
  if (options.num_workers < 1 || options.num_workers > 100000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num_workers must be from 1 to 100000, got ", options.num_workers));
  }
  if (options.config.backup_workers() >= options.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config field 'backup_workers' is ", options.config.backup_workers(),
        " but there are --num_workers=", options.num_workers,
        ": a step needs at least one worker's gradient, so backup_workers "
        "must be fewer than the workers"));
  }
  if (absl::Status listen = CheckListenAddress(options.listen_address);
      !listen.ok()) {
    return listen;
  }
  return absl::OkStatus();
}

// The memory the shard needs, and the limits on what clients can make it
// hold: RESOURCE_EXHAUSTED or INVALID_ARGUMENT saying what and why.
absl::Status CheckLimits(const ShardServerOptions& options,
                         const common::ModelLayout& layout) {
  // The shard's weights, its optimizer state, a push being decoded and a
  // version being sent, at least: refused before any of it is allocated.
  const common::ShardRange range = common::ShardRangeFor(
      layout.num_params(), options.num_shards, options.shard);
  const uint64_t needed = range.size() * sizeof(float) * 4;
  // The machine's memory, or its container's limit where lower: beyond it
  // the kernel kills the shard.
  const uint64_t memory = common::MemoryLimitBytes();
  if (memory > 0 && needed > memory) {
    return absl::ResourceExhaustedError(
        absl::StrCat("shard ", options.shard, " of ", options.num_shards,
                     " holds ", range.size(), " parameters and needs at least ",
                     needed >> 20, " MiB, more than the ", memory >> 20,
                     " MiB of memory this process may use: use more shards, "
                     "a smaller model, or give the shard more memory"));
  }
  // Policies that keep shard-sized arrays per worker: refused where they
  // would not fit, saying what they keep.
  if (absl::Status fits =
          CheckPolicyMemory(options.config, options.num_workers, range.size(),
                            options.shard, needed, memory);
      !fits.ok()) {
    return fits;
  }
  if (!(options.max_abs_gradient > 0) ||
      !std::isfinite(options.max_abs_gradient)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_abs_gradient must be positive and finite, got ",
                     options.max_abs_gradient));
  }
  if (options.max_streams_per_connection < 1 ||
      options.max_pushes_per_rank < 1 || options.max_pulls_per_rank < 1 ||
      options.grpc_memory_bytes < 0 ||
      options.idle_connection_timeout <= absl::ZeroDuration() ||
      options.max_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "the streams per connection and the pushes and pulls per rank must be "
        "at least 1, "
        "the memory cap and the longest wait at least 0 and the idle timeout "
        "positive");
  }
  if (options.lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--lease_s must be positive");
  }
  return absl::OkStatus();
}

// Keepalive, message sizes, ports and the bounds on what clients can make
// the shard hold, on `builder`; `quota` must outlive the build.
void ConfigureBuilder(const ShardServerOptions& options,
                      grpc::ServerBuilder* builder,
                      grpc::ResourceQuota* quota) {
  builder->SetMaxReceiveMessageSize(common::kMaxMessageBytes);
  builder->SetMaxSendMessageSize(common::kMaxMessageBytes);
  // gRPC sets SO_REUSEPORT by default, which would let a second shard bind
  // a port already in use and silently share its connections.
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Buffers for messages of a MiB on a Unix domain socket.
  common::SetUnixSocketBuffers(builder);
  // Keepalive both ways (see ShardServerOptions::peer_timeout and
  // worker/ps_client.h): the shard pings silent clients, and accepts the
  // clients' pings however idle the connection.
  const int half_ms = static_cast<int>(std::max<int64_t>(
      1000, absl::ToInt64Milliseconds(options.peer_timeout) / 2));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, half_ms);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, half_ms);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder->AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // Bounds on what clients can make the shard hold (ShardServerOptions).
  if (options.grpc_memory_bytes > 0) {
    quota->Resize(static_cast<size_t>(options.grpc_memory_bytes));
    builder->SetResourceQuota(*quota);
  }
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                              options.max_streams_per_connection);
  builder->AddChannelArgument(
      GRPC_ARG_MAX_CONNECTION_IDLE_MS,
      static_cast<int>(std::min<int64_t>(
          absl::ToInt64Milliseconds(options.idle_connection_timeout),
          std::numeric_limits<int>::max())));
  builder->AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10000);
}

}  // namespace

namespace {

// The state and rule of shard `shard`'s range.
absl::Status MakeRangeCore(const ShardServerOptions& options,
                           const common::ModelLayout& layout, int shard,
                           std::unique_ptr<ShardState>* state,
                           std::unique_ptr<UpdateRule>* rule) {
  *state = std::make_unique<ShardState>(layout, options.config.seed(), shard,
                                        options.num_shards);
  if (!options.config.initial_weights().empty()) {
    absl::StatusOr<std::vector<float>> initial =
        common::ReadInitialWeights(options.config.initial_weights(),
                                   layout.num_params(), (*state)->range());
    if (!initial.ok()) return initial.status();
    (*state)->SetInitialValues(*std::move(initial));
  }
  (*state)->set_lease(options.lease);
  (*state)->SetNumWorkers(options.num_workers);
  if (options.config.elastic()) {
    // Shard 0 hands out the data.
    (*state)->SetElastic(shard == 0 ? (*state)->MakeDataQueue(
                                          options.config.epochs(),
                                          options.config.batch_size(),
                                          options.config.data_shard_batches())
                                    : nullptr);
  }
  if (std::optional<StalenessBound> bound =
          StalenessBoundFor(options.config, options.num_workers);
      bound.has_value()) {
    (*state)->SetStalenessBound(*std::move(bound));
  }
  *rule = MakeUpdateRule(options.config, options.num_workers, state->get());
  if (*rule == nullptr) {
    return absl::InvalidArgumentError("no update rule for this mode");
  }
  return absl::OkStatus();
}

// What replication needs: INVALID_ARGUMENT saying what is missing or not
// replicated yet, and why.
absl::Status CheckReplicas(const ShardServerOptions& options) {
  if (options.replicas == 0) return absl::OkStatus();
  if (options.replicas != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--replicas must be 0 or 1 (one backup per range), got ",
        options.replicas));
  }
  if (options.num_shards < 2) {
    return absl::InvalidArgumentError(
        "--replicas=1 needs at least 2 shards: a range's backup lives in the "
        "next shard's process");
  }
  if (options.servers.size() != static_cast<size_t>(options.num_shards)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--replicas=1 needs --servers with every shard's address in shard "
        "order (", options.num_shards, "), got ", options.servers.size()));
  }
  const TrainingConfig& c = options.config;
  const char* why = nullptr;
  switch (c.mode()) {
    case ALLREDUCE:
      why = "mode allreduce (the shards hold no live state to replicate)";
      break;
    default:
      break;
  }
  if (why == nullptr && c.elastic()) {
    why = "elastic (shard 0's data queue is not forwarded yet)";
  }
  if (why != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--replicas=1 is not built for ", why,
                     ": run it with --replicas=0 (checkpoints)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardServer>> ShardServer::Start(
    const ShardServerOptions& options) {
  const common::ModelLayout layout =
      common::ModelLayout::FromConfig(options.config);
  if (absl::Status counts = CheckCounts(options, layout); !counts.ok()) {
    return counts;
  }
  if (absl::Status limits = CheckLimits(options, layout); !limits.ok()) {
    return limits;
  }
  if (absl::Status replicas = CheckReplicas(options); !replicas.ok()) {
    return replicas;
  }
  std::unique_ptr<ShardServer> server(new ShardServer());
  if (absl::Status core = server->BuildCore(options, layout); !core.ok()) {
    return core;
  }
  if (absl::Status opened = server->OpenCheckpoints(options, layout);
      !opened.ok()) {
    return opened;
  }
  if (absl::Status replicas = server->BuildReplicas(options, layout);
      !replicas.ok()) {
    return replicas;
  }
  if (absl::Status served = server->Serve(options); !served.ok()) {
    return served;
  }
  if (absl::Status metrics = server->StartMetrics(options); !metrics.ok()) {
    return metrics;
  }
  if (server->replication_ != nullptr) {
    // A process restarted after a failure: its ranges may have moved on,
    // and are copied back from where they went.
    const int n = options.num_shards;
    server->replication_->CheckAtStart(server->state_->version(),
                                       server->sparse_->row_pushes());
    server->backup_replication_->CheckAtStart(
        server->backup_state_->version(), server->backup_sparse_->row_pushes());
    if (server->replication_->NeedsRepair()) {
      server->RepairRange(options, server->state_.get(), server->rule_.get(),
                          server->sparse_.get(), server->replication_.get(),
                          options.servers[(options.shard + 1) % n]);
    }
    if (server->backup_replication_->NeedsRepair()) {
      server->RepairRange(
          options, server->backup_state_.get(), server->backup_rule_.get(),
          server->backup_sparse_.get(), server->backup_replication_.get(),
          options.servers[(options.shard + n - 1) % n]);
    }
  }
  auto* health = server->server_->GetHealthCheckService();
  health->SetServingStatus(true);
  server->StartThreads(options);
  return server;
}

absl::Status ShardServer::BuildCore(const ShardServerOptions& options,
                                    const common::ModelLayout& layout) {
  if (absl::Status core =
          MakeRangeCore(options, layout, options.shard, &state_, &rule_);
      !core.ok()) {
    return core;
  }
  // With replicas the process holds a second range's tables, its
  // neighbour's backup: each gets half the memory.
  absl::StatusOr<std::unique_ptr<ShardSparseTables>> sparse =
      ShardSparseTables::Create(options.config, options.shard,
                                options.num_shards, /*memory_bytes=*/0,
                                /*copies=*/options.replicas > 0 ? 2 : 1);
  if (!sparse.ok()) return sparse.status();
  sparse_ = *std::move(sparse);
  config_ = options.config;
  config_fingerprint_ = common::ConfigFingerprint(options.config);
  return absl::OkStatus();
}

absl::Status ShardServer::BuildReplicas(const ShardServerOptions& options,
                                        const common::ModelLayout& layout) {
  if (options.replicas == 0) return absl::OkStatus();
  const int s = options.shard;
  const int n = options.num_shards;
  const int previous = (s + n - 1) % n;
  if (absl::Status core = MakeRangeCore(options, layout, previous,
                                        &backup_state_, &backup_rule_);
      !core.ok()) {
    return core;
  }
  absl::StatusOr<std::unique_ptr<ShardSparseTables>> sparse =
      ShardSparseTables::Create(options.config, previous, n,
                                /*memory_bytes=*/0, /*copies=*/2);
  if (!sparse.ok()) return sparse.status();
  backup_sparse_ = *std::move(sparse);
  ReplicationOptions mine;
  mine.range = s;
  mine.num_shards = n;
  mine.peer_address = options.servers[(s + 1) % n];
  mine.chunk_values =
      static_cast<size_t>(options.config.chunk_bytes()) / sizeof(float);
  mine.onebit_bucket_size = options.config.onebit_bucket_size();
  // As many as the service's forwarding threads (ParameterServiceImpl).
  mine.blocking_threads =
      std::clamp(options.num_workers * options.max_pushes_per_rank, 4, 64);
  mine.auth_token = options.auth_token;
  mine.credentials = options.peer_credentials;
  ReplicationOptions theirs = mine;
  theirs.range = previous;
  theirs.peer_address = options.servers[previous];
  replication_ = Replication::Primary(mine, state_->version());
  backup_replication_ =
      Replication::Backup(theirs, backup_state_->version());
  return absl::OkStatus();
}

absl::Status ShardServer::OpenCheckpoints(const ShardServerOptions& options,
                                          const common::ModelLayout& layout) {
  if (options.checkpoint_dir.empty()) return absl::OkStatus();
  struct stat info;
  if (::stat(options.checkpoint_dir.c_str(), &info) != 0 ||
      !S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint_dir '", options.checkpoint_dir,
                     "' is not an existing directory"));
  }
  checkpoint_path_ =
      CheckpointPath(options.checkpoint_dir, options.shard, options.num_shards);
  checkpoint_dir_ = options.checkpoint_dir;
  layout_params_ = layout.num_params();
  return Resume();
}

absl::Status ShardServer::Serve(const ShardServerOptions& options) {
  const ServicePolicy policy{options.auth_token, options.max_abs_gradient,
                             options.max_pushes_per_rank,
                             options.max_pulls_per_rank, options.max_wait};
  if (replication_ != nullptr) {
    service_ = std::make_unique<ParameterServiceImpl>(
        options.config, options.num_workers,
        RangeCore{state_.get(), rule_.get(), sparse_.get(), replication_.get()},
        RangeCore{backup_state_.get(), backup_rule_.get(), backup_sparse_.get(),
                  backup_replication_.get()},
        policy);
  } else {
    service_ = std::make_unique<ParameterServiceImpl>(
        options.config, options.num_workers, state_.get(), rule_.get(), policy,
        sparse_.get());
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address,
                           options.credentials != nullptr
                               ? options.credentials
                               : grpc::InsecureServerCredentials(),
                           &port_);
  builder.RegisterService(service_.get());
  grpc::ResourceQuota quota(
      absl::StrCat("shard-", options.shard, "-of-", options.num_shards));
  ConfigureBuilder(options, &builder, &quota);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on '", options.listen_address,
        absl::StartsWith(options.listen_address, kUnixPrefix)
            ? "': does its directory exist and may this process write there? "
              "(A socket left by a dead shard is replaced; any other file at "
              "the path is left alone and blocks it.)"
            : "': is the address valid and the port free?"));
  }
  const absl::string_view address = options.listen_address;
  address_ =
      absl::StartsWith(address, kUnixPrefix)
          ? std::string(address)
          : absl::StrCat(address.substr(0, address.rfind(':')), ":", port_);
  return absl::OkStatus();
}

absl::Status ShardServer::StartMetrics(const ShardServerOptions& options) {
  if (options.metrics_listen.empty()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<common::MetricsExporter>> metrics =
      common::MetricsExporter::Start(
          options.metrics_listen,
          common::BuildInfoLabels("shard", options.config,
                                  {{"shard", absl::StrCat(options.shard)}}));
  if (!metrics.ok()) return metrics.status();
  metrics_ = *std::move(metrics);
  metrics_->Add(std::make_shared<ShardMetrics>(state_.get(), sparse_.get()));
  if (replication_ != nullptr) {
    metrics_->Add(std::make_shared<ReplicaMetrics>(
        std::vector<ReplicaMetrics::Range>{
            {state_.get(), replication_.get()},
            {backup_state_.get(), backup_replication_.get()}}));
  }
  return absl::OkStatus();
}

void ShardServer::StartThreads(const ShardServerOptions& options) {
  ticker_ = std::make_unique<ShardTicker>(state_.get(), rule_.get(),
                                          options.log_every,
                                          options.config.max_staleness(),
                                          options.config.mode() != ALLREDUCE);
  if (backup_replication_ != nullptr) {
    // The copy of the range this process backs up is ticked too once it
    // has taken the range over: its leases, waits and barrier.
    backup_ticker_ = std::make_unique<ShardTicker>(
        backup_state_.get(), backup_rule_.get(), options.log_every,
        options.config.max_staleness(), /*log_lapses=*/true,
        [replication = backup_replication_.get()] {
          return replication->CheckServing().ok();
        });
  }
  if (!checkpoint_path_.empty() &&
      options.checkpoint_interval > absl::ZeroDuration()) {
    ShardServer* raw = this;
    checkpointer_ = std::thread([raw, interval = options.checkpoint_interval,
                                 report = options.on_periodic_checkpoint] {
      raw->CheckpointEvery(interval, report);
    });
  }
  if (replication_ != nullptr) {
    repairer_ = std::thread([this, options] { RepairWhileRunning(options); });
  }
}

void ShardServer::RepairWhileRunning(const ShardServerOptions& options) {
  const int n = options.num_shards;
  struct Copy {
    ShardState* state;
    UpdateRule* rule;
    ShardSparseTables* sparse;
    Replication* replication;
    std::string peer;
    absl::Duration backoff = absl::Seconds(1);
    absl::Time next_try = absl::InfinitePast();
  };
  Copy copies[] = {
      {state_.get(), rule_.get(), sparse_.get(), replication_.get(),
       options.servers[(options.shard + 1) % n]},
      {backup_state_.get(), backup_rule_.get(), backup_sparse_.get(),
       backup_replication_.get(),
       options.servers[(options.shard + n - 1) % n]}};
  while (!stop_repairs_.WaitForNotificationWithTimeout(absl::Seconds(1))) {
    for (Copy& copy : copies) {
      const absl::Time now = absl::Now();
      if (!copy.replication->NeedsRepair() || now < copy.next_try) continue;
      RepairRange(options, copy.state, copy.rule, copy.sparse, copy.replication,
                  copy.peer);
      if (copy.replication->NeedsRepair()) {
        copy.next_try = absl::Now() + copy.backoff;
        copy.backoff = std::min(copy.backoff * 2, absl::Seconds(30));
      } else {
        copy.backoff = absl::Seconds(1);
      }
    }
  }
}

absl::Status ShardServer::Resume() {
  absl::StatusOr<std::optional<ShardCheckpoint>> read =
      ReadCheckpoint(checkpoint_path_);
  if (!read.ok()) return read.status();
  if (!read->has_value()) {
    // No file of this shard count: perhaps a set of another.
    read = ReshardedCheckpoint(checkpoint_dir_, layout_params_, state_->shard(),
                               state_->num_shards(), config_fingerprint_,
                               &config_);
    if (!read.ok()) return read.status();
    if (!read->has_value()) return absl::OkStatus();
    resharded_ = true;
  }
  const ShardCheckpoint& checkpoint = **read;
  if (checkpoint.stats().run_closed()) {
    // Resuming would "train" a finished run for zero steps and look like
    // success: a new run must be started on purpose.
    return absl::FailedPreconditionError(absl::StrCat(
        resharded_ ? checkpoint_dir_ : checkpoint_path_,
        ": the final checkpoint of a finished run (version ",
        checkpoint.version(),
        ", every worker finished and the results were collected); a shard "
        "does not resume it. To train again, start a new run with an empty "
        "--checkpoint_dir (in Kubernetes, tools/k8s/README.md, \"A new "
        "run\"); move the file elsewhere first to keep its weights"));
  }
  absl::Status matches =
      CheckCheckpointMatches(checkpoint, config_fingerprint_, state_->shard(),
                             state_->num_shards(), state_->size(), &config_);
  if (!matches.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(checkpoint_path_, ": ", matches.message()));
  }
  absl::Status restored = rule_->RestoreState(SavedStateOf(checkpoint));
  if (!restored.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(checkpoint_path_, ": ", restored.message()));
  }
  if (absl::Status rows = RestoreSparseTables(checkpoint); !rows.ok()) {
    return rows;
  }
  // Which row pushes it applied, so that one sent again is not applied
  // twice (a checkpoint of another shard count saw other ids: none).
  if (!resharded_) sparse_->RestoreMarks(checkpoint);
  state_->RestoreStats(checkpoint.stats());
  if (absl::Status queue = state_->RestoreDataQueue(checkpoint.stats());
      !queue.ok()) {
    return absl::DataLossError(
        absl::StrCat(checkpoint_path_, ": ", queue.message()));
  }
  resumed_version_ = checkpoint.version();
  return absl::OkStatus();
}

void ShardServer::RepairRange(const ShardServerOptions& options,
                              ShardState* state, UpdateRule* rule,
                              ShardSparseTables* sparse,
                              Replication* replication,
                              const std::string& peer) {
  replication->BeginRepair();
  sparse->BeginRepair();
  // Each way out: the copy made, or given up (its held row pushes dropped).
  auto failed = [replication, sparse](const std::string& why) {
    sparse->EndRepair();
    replication->RepairFailed(why);
  };
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // a whole range's state
  common::SetUnixSocketBuffers(&args);
  std::unique_ptr<ParameterService::Stub> stub =
      ParameterService::NewStub(grpc::CreateCustomChannel(
          peer,
          options.peer_credentials != nullptr
              ? options.peer_credentials
              : grpc::InsecureChannelCredentials(),
          args));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  if (!options.auth_token.empty()) {
    context.AddMetadata(common::kAuthMetadataKey,
                        common::BearerValue(options.auth_token));
  }
  RepairRequest request;
  request.set_shard(state->shard());
  request.set_config_fingerprint(config_fingerprint_);
  RepairResponse response;
  const grpc::Status status = stub->Repair(&context, request, &response);
  if (!status.ok()) {
    return failed(common::ToAbslStatus(status).ToString());
  }
  ShardCheckpoint checkpoint;
  if (!checkpoint.ParseFromString(response.checkpoint())) {
    return failed("the copy does not parse");
  }
  if (absl::Status matches = CheckCheckpointMatches(
          checkpoint, config_fingerprint_, state->shard(), state->num_shards(),
          state->size(), &config_);
      !matches.ok()) {
    return failed(std::string(matches.message()));
  }
  RuleState copy = SavedStateOf(checkpoint);
  copy.pull_residual.assign(response.pull_residual().begin(),
                            response.pull_residual().end());
  if (absl::Status restored = rule->RestoreState(copy); !restored.ok()) {
    return failed(std::string(restored.message()));
  }
  // A fenced primary's copy may have been ahead (updates its backup
  // refused): the version goes back with it.
  state->ResetVersion(checkpoint.version());
  state->RestoreStats(checkpoint.stats());
  // The rows, and the row pushes forwarded while the copy was made.
  if (absl::Status rows = sparse->RestoreCopy(checkpoint); !rows.ok()) {
    return failed(absl::StrCat("its sparse tables: ", rows.message()));
  }
  replication->Repaired(checkpoint.version(), response.range_epoch());
}

absl::Status ShardServer::RestoreSparseTables(
    const ShardCheckpoint& checkpoint) {
  const std::string& where = resharded_ ? checkpoint_dir_ : checkpoint_path_;
  const common::BucketRange mine = common::BucketsOfShard(
      state_->shard(), sparse_->buckets(), state_->num_shards());
  for (const std::string& bytes : checkpoint.sparse_tables()) {
    SparseTableSnapshot snapshot;
    if (!snapshot.ParseFromString(bytes)) {
      return absl::DataLossError(
          absl::StrCat(where, ": a sparse table's rows do not parse"));
    }
    absl::StatusOr<SparseTable*> table =
        sparse_->Find(snapshot.config().name());
    if (!table.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": ", table.status().message()));
    }
    absl::StatusOr<int64_t> restored = (*table)->Restore(
        snapshot, mine.first, mine.last, sparse_->buckets());
    if (!restored.ok()) {
      return absl::Status(restored.status().code(),
                          absl::StrCat(where, ": ", restored.status().message()));
    }
  }
  return absl::OkStatus();
}

void ShardServer::CheckpointEvery(
    absl::Duration interval,
    std::function<void(const absl::Status&, int64_t)> report) {
  while (!stop_checkpoints_.WaitForNotificationWithTimeout(interval)) {
    int64_t version = -1;
    absl::Status status = SaveCheckpoint(&version);
    if (report) report(status, version);
  }
}

absl::Status ShardServer::SaveCheckpoint(int64_t* version) {
  if (checkpoint_path_.empty()) {
    return absl::FailedPreconditionError("no checkpoint directory was given");
  }
  absl::MutexLock lock(&save_mu_);
  const absl::Time began = absl::Now();
  absl::Status written = WriteCheckpointLocked(version);
  const absl::Time ended = absl::Now();
  state_->RecordCheckpoint(ended, ended - began, written.ok());
  return written;
}

absl::Status ShardServer::WriteCheckpointLocked(int64_t* version) {
  const RuleState saved = rule_->SaveState();
  if (version != nullptr) *version = saved.version;
  ShardCheckpoint checkpoint = CheckpointOf(saved, *state_, config_);
  // The rows as they are now: pushes that arrive while the weights above
  // are written may be in them or not, as with an asynchronous push.
  sparse_->SaveTo(&checkpoint);
  return WriteCheckpoint(checkpoint_path_, checkpoint);
}

ShardServer::~ShardServer() { Shutdown(absl::ZeroDuration()); }

bool ShardServer::RunClosedEverywhereServed() const {
  if (!state_->run_closed().HasBeenNotified()) return false;
  if (backup_replication_ == nullptr) return true;
  const Replication::Role role = backup_replication_->role();
  const bool serves = role == Replication::Role::kPrimary ||
                      role == Replication::Role::kDegraded;
  return !serves || backup_state_->run_closed().HasBeenNotified();
}

int ShardServer::metrics_port() const {
  return metrics_ != nullptr ? metrics_->port() : 0;
}

std::string ShardServer::address() const { return address_; }

void ShardServer::Shutdown(absl::Duration grace) {
  absl::MutexLock lock(&shutdown_mu_);
  if (checkpointer_.joinable()) {
    stop_checkpoints_.Notify();
    checkpointer_.join();
  }
  if (repairer_.joinable()) {
    stop_repairs_.Notify();
    repairer_.join();
  }
  if (ticker_ != nullptr) ticker_->Stop();
  if (backup_ticker_ != nullptr) backup_ticker_->Stop();
  if (server_ == nullptr) return;
  server_->GetHealthCheckService()->SetServingStatus(false);
  // Its primaries' forwarding calls stay open for the run: ended here, not
  // waited for.
  service_->EndReplicateCalls();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
  server_.reset();
}

}  // namespace monsoon::server
