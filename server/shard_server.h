// ShardServer: one running shard: its state, its update rule, the parameter
// service and the standard gRPC health service on one listening port; with a
// checkpoint directory, it resumes from the shard's checkpoint there and
// writes a new one on request and, if asked, periodically while serving
// (server/checkpoint.h).
// Owns everything it starts, the periodic checkpoint thread included; the
// destructor shuts the server down. Methods are thread-safe.
#ifndef MONSOON_SERVER_SHARD_SERVER_H_
#define MONSOON_SERVER_SHARD_SERVER_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/metrics_exporter.h"
#include "proto/checkpoint.pb.h"
#include "proto/config.pb.h"
#include "server/parameter_service.h"
#include "server/replication.h"
#include "server/shard_sparse_tables.h"
#include "server/shard_state.h"
#include "server/shard_ticker.h"
#include "server/update_rule.h"

namespace monsoon::server {

struct ShardServerOptions {
  TrainingConfig config;  // resolved
  int shard = 0;
  int num_shards = 1;
  int num_workers = 1;
  // host:port, port 0 picking a free one (see ShardServer::port()), or
  // unix:PATH (a Unix domain socket).
  std::string listen_address = "127.0.0.1:0";
  // If not empty: an existing directory that holds this shard's checkpoint
  // (CheckpointPath). Start resumes from the checkpoint when there is one;
  // SaveCheckpoint writes it.
  std::string checkpoint_dir;
  // With a checkpoint_dir and a positive interval, a thread also writes the
  // checkpoint this often while the shard serves, so that a shard that
  // crashes loses at most this much work. Zero: only SaveCheckpoint writes.
  absl::Duration checkpoint_interval = absl::ZeroDuration();
  // Called on the checkpoint thread after each periodic write with its
  // outcome and the version saved (e.g. to log it); may be empty. A failed
  // write leaves the shard serving and the previous checkpoint intact.
  std::function<void(const absl::Status&, int64_t version)>
      on_periodic_checkpoint;
  // How long a worker rank counts as alive after its last call (sync closes
  // a step without a worker whose lease ran out; a second worker may take
  // a rank only once the first's lease has run out).
  absl::Duration lease = absl::Seconds(10);
  // How often a waiting sync step logs whom it waits for (zero: never).
  absl::Duration log_every = absl::Seconds(5);
  // How long a client may stay silent before its connection is dropped
  // (pings after half of it, drop after the other half), which cancels its
  // calls. Clients may ping as often as once a second.
  absl::Duration peer_timeout = absl::Seconds(30);
  // The run's secret (common/auth.h): every call must carry it, or it is
  // answered UNAUTHENTICATED. Empty: no authentication.
  std::string auth_token;
  // HOST:PORT for Prometheus' /metrics (port 0: any free one); empty: none.
  std::string metrics_listen;
  // TLS (common/tls.h); null: plaintext.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // A push with a value beyond this magnitude is refused INVALID_ARGUMENT
  // (finite values that large would poison the weights or the optimizer's
  // state: 1e20 once makes Adagrad's accumulator infinite).
  float max_abs_gradient = 1e9f;
  // Bounds on what clients can make the shard hold. gRPC's own memory
  // (connections, messages in flight) is capped at grpc_memory_bytes (0: no
  // cap); a connection carries at most max_streams_per_connection calls at
  // once; a rank has at most max_pushes_per_rank pushes in flight (each
  // holds a shard-sized buffer), and the evaluator's and unregistered
  // clients' pushes share the same bound per rank; likewise at most
  // max_pulls_per_rank pulls (each holds the version it sends until the
  // client reads it). A connection without
  // calls for idle_connection_timeout is closed, and one that has not
  // finished its handshake after 10 s.
  int64_t grpc_memory_bytes = int64_t{1} << 30;
  int max_streams_per_connection = 32;
  int max_pushes_per_rank = 4;
  int max_pulls_per_rank = 4;
  // See ServicePolicy::max_wait (zero: derived from the config).
  absl::Duration max_wait = absl::ZeroDuration();
  absl::Duration idle_connection_timeout = absl::Minutes(5);
  // Replication (server/replication.h): 1 gives shard s's range a backup
  // in the process of shard (s + 1) % num_shards, and makes this process
  // the backup of shard (s - 1)'s range; `servers` then lists every
  // shard's address in shard order (this one's included), where the
  // processes reach each other. 0: none (the default).
  int replicas = 0;
  std::vector<std::string> servers;
  // How the processes reach each other with replicas (null: plaintext).
  std::shared_ptr<grpc::ChannelCredentials> peer_credentials;
};

// What starts a listen address that is a Unix domain socket's path
// (unix:/run/monsoon/ps-0.sock): for workers on the shard's machine, whose
// messages then skip the TCP stack.
inline constexpr absl::string_view kUnixPrefix = "unix:";

// OK for host:port with a port from 0 to 65535, or unix:PATH with a path
// that fits a socket address (1 to 107 bytes); INVALID_ARGUMENT, with an
// example, for anything else (gRPC would otherwise pick a random port for
// an out-of-range one).
absl::Status CheckListenAddress(absl::string_view address);

class ShardServer {
 public:
  // Validates the options (INVALID_ARGUMENT, also for a checkpoint_dir that
  // is not a directory or a listen address that is neither host:port with a
  // valid port nor unix:PATH; RESOURCE_EXHAUSTED for a shard larger than the
  // memory this process may use, before allocating it), builds the shard,
  // resumes it from its checkpoint if there is one, and starts serving
  // (UNAVAILABLE when the address cannot be bound). A checkpoint of another
  // config, shard or shard count gets FAILED_PRECONDITION; an unreadable one
  // DATA_LOSS. Nothing is served then.
  static absl::StatusOr<std::unique_ptr<ShardServer>> Start(
      const ShardServerOptions& options);
  ~ShardServer();

  // The port it serves on (when listening on host:port).
  int port() const { return port_; }
  // The port of /metrics, or 0 when not serving metrics.
  int metrics_port() const;
  // Where workers reach it: host:port, or unix:PATH.
  std::string address() const;
  ShardState* state() { return state_.get(); }
  UpdateRule* rule() { return rule_.get(); }
  // With replicas: the backup of the previous shard's range and the
  // replication of each range (null without).
  ShardState* backup_state() { return backup_state_.get(); }
  UpdateRule* backup_rule() { return backup_rule_.get(); }
  Replication* replication() { return replication_.get(); }
  Replication* backup_replication() { return backup_replication_.get(); }
  // The shard's sparse tables (empty when the run has none), and with
  // replicas the backup's of the previous shard's range.
  const ShardSparseTables* sparse_tables() const { return sparse_.get(); }
  const ShardSparseTables* backup_sparse_tables() const {
    return backup_sparse_.get();
  }
  // The version the shard resumed from, or -1 when it started afresh.
  int64_t resumed_version() const { return resumed_version_; }
  // Whether it resumed from the checkpoints of another shard count.
  bool resharded() const { return resharded_; }
  // Notified when the run's finisher has closed the run (every worker
  // finished, results collected; RegisterRequest.finished): the daemon then
  // shuts down and saves its final checkpoint.
  const absl::Notification& run_closed() const { return state_->run_closed(); }
  // Whether the daemon's work is over: its own range's run is closed, and
  // so is that of a range it took over and serves (--replicas), whose close
  // the finisher sends here after the own range's. A range it only backs up
  // ends with its primary's close (Replication::ForwardClose), or not at
  // all if its primary is gone: it is not waited for.
  bool RunClosedEverywhereServed() const;
  // Where SaveCheckpoint writes; empty without a checkpoint_dir.
  const std::string& checkpoint_path() const { return checkpoint_path_; }

  // Writes the shard's checkpoint (weights, version, optimizer state,
  // statistics) atomically to checkpoint_path(); one write at a time. While
  // serving, sync, downpour and easgd save a state between two updates (in
  // sync, a step whose gradients were only partly collected is not saved);
  // hogwild's weights may mix the pushes being applied, as its pulls do.
  // After Shutdown every mode's state is final. FAILED_PRECONDITION without
  // a checkpoint_dir; INTERNAL when the file cannot be written. `version`
  // (if not null) gets the version saved.
  absl::Status SaveCheckpoint(int64_t* version = nullptr);

  // Stops the periodic checkpoints, reports NOT_SERVING, then stops: calls
  // still running after `grace` are cancelled (pulls waiting for a version
  // among them). Idempotent.
  void Shutdown(absl::Duration grace = absl::Seconds(2));

 private:
  ShardServer() = default;
  // Start's steps, in order.
  // The shard's state, policies and rule.
  absl::Status BuildCore(const ShardServerOptions& options,
                         const common::ModelLayout& layout);
  // With replicas: the backup's core and both ranges' replication (after
  // the checkpoint: a primary's forwards follow on from its version).
  absl::Status BuildReplicas(const ShardServerOptions& options,
                             const common::ModelLayout& layout);
  // With a checkpoint_dir: checks it and resumes from it.
  absl::Status OpenCheckpoints(const ShardServerOptions& options,
                               const common::ModelLayout& layout);
  // The service on options.listen_address, with its limits.
  absl::Status Serve(const ShardServerOptions& options);
  // The metrics endpoint, with options.metrics_listen.
  absl::Status StartMetrics(const ShardServerOptions& options);
  // The ticker and, with checkpoints and an interval, the checkpoint thread.
  void StartThreads(const ShardServerOptions& options);
  // Restores the state and the rule from checkpoint_path_, if it exists.
  absl::Status Resume();
  // With replicas, at start: a range this process restarted behind (its
  // own, taken over by its backup; or the previous one, which went on
  // without this backup) is copied from the process that serves it
  // (ParameterService.Repair), and this process becomes its backup. A copy
  // that cannot be made is logged; the range then runs without a backup.
  void RepairRange(const ShardServerOptions& options, ShardState* state,
                   UpdateRule* rule, ShardSparseTables* sparse,
                   Replication* replication, const std::string& peer);
  // The repairer's body: every second, a range whose copy here stopped
  // following (a backup its primary went on without, after a partition; a
  // primary fenced after it was frozen) is copied again (RepairRange), with
  // the attempts spaced out from 1 s to 30 s while they fail.
  void RepairWhileRunning(const ShardServerOptions& options);
  // The periodic checkpoint thread's body.
  void CheckpointEvery(
      absl::Duration interval,
      std::function<void(const absl::Status&, int64_t)> report);

  // Constant after Start. Destroyed in reverse order: the server first, then
  // the service, the rule and the state that its calls use.
  int port_ = 0;
  std::string address_;  // what address() says
  TrainingConfig config_;  // resolved
  uint64_t config_fingerprint_ = 0;
  std::string checkpoint_path_;
  std::string checkpoint_dir_;
  uint64_t layout_params_ = 0;
  int64_t resumed_version_ = -1;
  bool resharded_ = false;
  std::unique_ptr<ShardState> state_;
  std::unique_ptr<UpdateRule> rule_;
  std::unique_ptr<ShardSparseTables> sparse_;
  // With replicas: the backup's core, and each range's replication.
  std::unique_ptr<ShardState> backup_state_;
  std::unique_ptr<UpdateRule> backup_rule_;
  std::unique_ptr<ShardSparseTables> backup_sparse_;
  std::unique_ptr<Replication> replication_;
  std::unique_ptr<Replication> backup_replication_;
  std::unique_ptr<ParameterServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  // After state_, so that it stops serving metrics before the state goes.
  std::unique_ptr<common::MetricsExporter> metrics_;

  // Periodic checkpoints: the thread runs until stop_checkpoints_ is
  // notified, and is joined in Shutdown before the server stops.
  absl::Notification stop_checkpoints_;
  std::thread checkpointer_;
  // With replicas: the thread that repairs, while the process runs, a
  // copy that stopped following (RepairWhileRunning), until stop_repairs_.
  absl::Notification stop_repairs_;
  std::thread repairer_;
  // Leases, waits past their deadline, progress logs (server/shard_ticker.h);
  // stopped in Shutdown.
  std::unique_ptr<ShardTicker> ticker_;
  // The same for the range this process backs up, once it serves it.
  std::unique_ptr<ShardTicker> backup_ticker_;

  // The checkpoint's sparse rows of this shard's buckets into its tables.
  absl::Status RestoreSparseTables(const ShardCheckpoint& checkpoint);
  // SaveCheckpoint's write, timed by it.
  absl::Status WriteCheckpointLocked(int64_t* version)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(save_mu_);
  absl::Mutex save_mu_;      // one checkpoint write at a time
  absl::Mutex shutdown_mu_;  // one Shutdown at a time
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_SHARD_SERVER_H_
