// ps_server: one parameter-server shard. Flags (or MONSOON_* environment
// variables) name its index, the shard and worker counts, the listen address
// and the training config. Runs until SIGTERM or SIGINT.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/auth.h"
#include "common/config.h"
#include "common/daemon.h"
#include "common/log.h"
#include "common/model_layout.h"
#include "common/termination.h"
#include "common/tls.h"
#include "server/shard_server.h"

ABSL_FLAG(int, shard, 0, "This shard's index, 0-based (env MONSOON_SHARD).");
ABSL_FLAG(int, num_shards, 1,
          "How many shards the model is split into "
          "(env MONSOON_NUM_SHARDS).");
ABSL_FLAG(int, num_workers, 1,
          "How many workers train (sync waits for all "
          "of them at every step); in an elastic run (config elastic: true) "
          "the most ranks it may have, of which the live ones count (env "
          "MONSOON_NUM_WORKERS).");
ABSL_FLAG(std::string, listen, "127.0.0.1:5000",
          "host:port to serve on; port 0 picks a free one. The default "
          "serves this machine only: give 0.0.0.0:PORT (with "
          "--auth_token_file, and TLS off a trusted network) to serve others. "
          "unix:PATH serves on a Unix domain socket, for workers on this "
          "machine (--servers=unix:PATH): their messages skip the TCP stack "
          "(env MONSOON_LISTEN).");
ABSL_FLAG(double, max_abs_gradient, 1e9,
          "Pushes with a value beyond this magnitude are refused "
          "INVALID_ARGUMENT: finite values that large would poison the "
          "weights or the optimizer's state (env MONSOON_MAX_ABS_GRADIENT).");
ABSL_FLAG(int, grpc_memory_mb, 1024,
          "Cap on the memory gRPC may hold for this shard's connections and "
          "messages in flight; 0: none (env MONSOON_GRPC_MEMORY_MB).");
ABSL_FLAG(int, max_streams_per_connection, 32,
          "Calls one connection may have open at once "
          "(env MONSOON_MAX_STREAMS_PER_CONNECTION).");
ABSL_FLAG(int, max_pushes_per_rank, 4,
          "Pushes one worker rank may have in flight at once, each holding a "
          "shard-sized buffer; more are refused RESOURCE_EXHAUSTED "
          "(env MONSOON_MAX_PUSHES_PER_RANK).");
ABSL_FLAG(int, max_pulls_per_rank, 4,
          "Pulls one worker rank (or the evaluators together) may have in "
          "flight at once, each holding the version it sends until the client "
          "reads it; more are refused RESOURCE_EXHAUSTED "
          "(env MONSOON_MAX_PULLS_PER_RANK).");
ABSL_FLAG(double, max_wait_s, 0,
          "Seconds a pull, or a sync push-pull at the barrier, may wait for a "
          "version before it is answered DEADLINE_EXCEEDED; 0: the config's "
          "call_timeout_s plus 10, so that honest clients give up first "
          "(env MONSOON_MAX_WAIT_S).");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT to serve Prometheus metrics on (GET /metrics; port 0: "
          "any free one); empty: none (env MONSOON_METRICS_LISTEN).");
ABSL_FLAG(double, idle_connection_timeout_s, 300,
          "Seconds after which a connection without calls is closed "
          "(env MONSOON_IDLE_CONNECTION_TIMEOUT_S).");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate for TLS (with --tls_key); tools/make_certs.sh "
          "makes a set (env MONSOON_TLS_CERT).");
ABSL_FLAG(std::string, tls_key, "",
          "PEM private key of --tls_cert (env MONSOON_TLS_KEY).");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate: with it, clients must present a certificate "
          "it signed (mutual TLS) (env MONSOON_TLS_CA).");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the run's secret token (at least 16 printable "
          "characters, e.g. from openssl rand -hex 32): every call must carry "
          "it or is refused UNAUTHENTICATED. Give every daemon of the run the "
          "same file (env MONSOON_AUTH_TOKEN_FILE).");
ABSL_FLAG(std::string, config, "",
          "Training config, text-format "
          "monsoon.TrainingConfig; empty means every default (env "
          "MONSOON_CONFIG).");
ABSL_FLAG(std::string, data_dir, "",
          "Overrides the config's data_dir (env MONSOON_DATA_DIR). A shard "
          "reads only the training files' shape, and only when the config "
          "leaves the model's input shape or classes to the data.");
ABSL_FLAG(std::string, port_file, "",
          "If set, write the chosen port to this "
          "file once serving (for launchers that use port 0); with "
          "--listen=unix:PATH, that address instead.");
ABSL_FLAG(double, shutdown_grace_s, 5,
          "Seconds that running calls get to "
          "finish after SIGTERM (env MONSOON_SHUTDOWN_GRACE_S).");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "If set, an existing directory: "
          "the shard resumes from DIR/shard-<i>-of-<S>.ckpt when it exists "
          "and writes it on SIGTERM (env MONSOON_CHECKPOINT_DIR).");
ABSL_FLAG(double, peer_timeout_s, 30,
          "Seconds a client may stay silent before its connection is "
          "dropped and its calls cancelled: pinged after half, dropped after "
          "the rest (env MONSOON_PEER_TIMEOUT_S).");
ABSL_FLAG(double, lease_s, 10,
          "Seconds a worker counts as alive after its last call: sync closes "
          "a step without a worker whose lease ran out (and logs it), and a "
          "second worker may take a rank only once the first's has run out "
          "(env MONSOON_LEASE_S).");
ABSL_FLAG(double, log_every_s, 5,
          "Seconds between the lines a waiting sync step logs about the "
          "workers it waits for (0: none) (env MONSOON_LOG_EVERY_S).");
ABSL_FLAG(int, replicas, 0,
          "1: every shard's range gets a live backup in the next shard's "
          "process (shard s's in shard s+1's, the last one's in shard 0's), "
          "which applies every update before the worker is told it counts "
          "and takes the range over when the process dies: a dead shard "
          "loses no acknowledged update; restarted, the process copies its "
          "ranges back from where they are served and is their backup. "
          "Needs --servers. 0: none (a dead shard restarts from its "
          "checkpoint). Env MONSOON_REPLICAS.");
ABSL_FLAG(std::string, peer_tls_cert, "",
          "With --replicas and TLS: the certificate this shard presents when "
          "it dials the other shards, which require a client certificate of "
          "the run's CA (the workers' client.pem does). Default: --tls_cert, "
          "which serves only if it is also for client authentication (a "
          "server-only certificate fails every handshake, and each range "
          "goes on without its backup). Env MONSOON_PEER_TLS_CERT.");
ABSL_FLAG(std::string, peer_tls_key, "",
          "The private key of --peer_tls_cert (env MONSOON_PEER_TLS_KEY).");
ABSL_FLAG(std::string, servers, "",
          "With --replicas: every shard's address in shard order, as the "
          "workers' --servers (one address holding {i}, as ps-{i}.ps:5000, "
          "stands for all of them). Env MONSOON_SERVERS.");
ABSL_FLAG(double, checkpoint_interval_s, 60,
          "With --checkpoint_dir, also write the checkpoint every this many "
          "seconds while serving, so that a crash loses at most that much "
          "work; 0 writes it only on SIGTERM (env "
          "MONSOON_CHECKPOINT_INTERVAL_S).");

namespace {

using monsoon::common::kExitConfigError;
using monsoon::common::kExitFailure;
using monsoon::common::kExitOk;
using monsoon::server::kUnixPrefix;
using monsoon::server::ShardServer;
using monsoon::server::ShardServerOptions;

constexpr char kProgram[] = "ps_server";

int Fail(int code, const absl::Status& status) {
  return monsoon::common::Fail(kProgram, code, status);
}
int Fail(int code, absl::string_view message) {
  return monsoon::common::Fail(kProgram, code, message);
}

monsoon::common::DaemonInfo Info() {
  monsoon::common::DaemonInfo info;
  info.program = kProgram;
  info.usage =
      "Monsoon parameter-server shard.\n\n"
      "  ps_server --shard=0 --num_shards=2 --num_workers=4 "
      "--listen=0.0.0.0:5000 --config=train.textproto\n\n"
      "Every flag may also come from MONSOON_<FLAG> in the environment; a "
      "flag on the command line wins. Exit codes: 0 after SIGTERM/SIGINT (and "
      "the checkpoint, with --checkpoint_dir), and after the run's finisher "
      "closed the run (every worker finished); 2 for a configuration error "
      "(a bad flag or config, a checkpoint of another config or shard, or "
      "the final checkpoint of a finished run), 1 otherwise.";
  info.main_file = "server/ps_server_main.cc";
  return info;
}

// The flags in seconds into `options`. INVALID_ARGUMENT, whose message is
// the line to log, for one out of range.
absl::Status SetTimesFromFlags(ShardServerOptions* options) {
  const double interval_s = absl::GetFlag(FLAGS_checkpoint_interval_s);
  const double grace_s = absl::GetFlag(FLAGS_shutdown_grace_s);
  const double peer_s = absl::GetFlag(FLAGS_peer_timeout_s);
  const double lease_s = absl::GetFlag(FLAGS_lease_s);
  const double log_every_s = absl::GetFlag(FLAGS_log_every_s);
  for (const auto& [name, seconds] :
       {std::pair<const char*, double>{"checkpoint_interval_s", interval_s},
        {"shutdown_grace_s", grace_s},
        {"peer_timeout_s", peer_s},
        {"lease_s", lease_s},
        {"log_every_s", log_every_s}}) {
    if (!(seconds >= 0 && seconds <= 1e6)) {  // NaN too
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, " must be from 0 to 1e6 seconds, got ", seconds));
    }
  }
  if (peer_s < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--peer_timeout_s must be at least 2 seconds, got ", peer_s));
  }
  options->checkpoint_interval = absl::Seconds(interval_s);
  options->peer_timeout = absl::Seconds(peer_s);
  if (lease_s < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lease_s must be at least 1 second, got ", lease_s));
  }
  options->lease = absl::Seconds(lease_s);
  options->log_every = absl::Seconds(log_every_s);
  options->max_wait = absl::Seconds(absl::GetFlag(FLAGS_max_wait_s));
  options->idle_connection_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_idle_connection_timeout_s));
  return absl::OkStatus();
}

// The shard's place in the run, its address and its limits.
void SetServingFromFlags(ShardServerOptions* options) {
  options->shard = absl::GetFlag(FLAGS_shard);
  options->num_shards = absl::GetFlag(FLAGS_num_shards);
  options->num_workers = absl::GetFlag(FLAGS_num_workers);
  options->listen_address = absl::GetFlag(FLAGS_listen);
  options->checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  options->max_abs_gradient =
      static_cast<float>(absl::GetFlag(FLAGS_max_abs_gradient));
  options->grpc_memory_bytes =
      static_cast<int64_t>(absl::GetFlag(FLAGS_grpc_memory_mb)) << 20;
  options->max_streams_per_connection =
      absl::GetFlag(FLAGS_max_streams_per_connection);
  options->max_pushes_per_rank = absl::GetFlag(FLAGS_max_pushes_per_rank);
  options->max_pulls_per_rank = absl::GetFlag(FLAGS_max_pulls_per_rank);
  options->metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options->replicas = absl::GetFlag(FLAGS_replicas);
  const std::string servers = absl::GetFlag(FLAGS_servers);
  if (absl::StrContains(servers, "{i}") && !absl::StrContains(servers, ",")) {
    for (int i = 0; i < options->num_shards; ++i) {
      options->servers.push_back(
          absl::StrReplaceAll(servers, {{"{i}", absl::StrCat(i)}}));
    }
  } else if (!servers.empty()) {
    options->servers = absl::StrSplit(servers, ',', absl::SkipEmpty());
  }
}

// TLS and the auth token, from the files the flags name.
absl::Status SetSecurityFromFlags(ShardServerOptions* options) {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      monsoon::common::ServerCredentialsFrom({absl::GetFlag(FLAGS_tls_cert),
                                              absl::GetFlag(FLAGS_tls_key),
                                              absl::GetFlag(FLAGS_tls_ca)});
  if (!credentials.ok()) return credentials.status();
  options->credentials = *std::move(credentials);
  const std::string peer_cert = absl::GetFlag(FLAGS_peer_tls_cert);
  const std::string peer_key = absl::GetFlag(FLAGS_peer_tls_key);
  if (peer_cert.empty() != peer_key.empty()) {
    return absl::InvalidArgumentError(
        "--peer_tls_cert and --peer_tls_key go together: give both");
  }
  if (!peer_cert.empty() && absl::GetFlag(FLAGS_tls_cert).empty()) {
    return absl::InvalidArgumentError(
        "--peer_tls_cert without --tls_cert: the shards speak TLS to each "
        "other only when they serve it");
  }
  if (absl::GetFlag(FLAGS_replicas) > 0) {
    // The processes forward updates to each other as clients.
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> peer =
        monsoon::common::ChannelCredentialsFrom(
            {peer_cert.empty() ? absl::GetFlag(FLAGS_tls_cert) : peer_cert,
             peer_key.empty() ? absl::GetFlag(FLAGS_tls_key) : peer_key,
             absl::GetFlag(FLAGS_tls_ca)});
    if (!peer.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--replicas with TLS: the shards reach each other as clients: ",
          peer.status().message()));
    }
    options->peer_credentials = *std::move(peer);
  }
  if (!absl::GetFlag(FLAGS_auth_token_file).empty()) {
    absl::StatusOr<std::string> token =
        monsoon::common::ReadTokenFile(absl::GetFlag(FLAGS_auth_token_file));
    if (!token.ok()) return token.status();
    options->auth_token = *std::move(token);
  }
  return absl::OkStatus();
}

// Logs each periodic checkpoint of shard `shard`; a failed one is not fatal.
std::function<void(const absl::Status&, int64_t)> PeriodicCheckpointLog(
    int shard) {
  return [shard](const absl::Status& status, int64_t version) {
    if (status.ok()) {
      monsoon::common::Log("ps_server: shard %d checkpointed version %d", shard,
                           version);
    } else {
      monsoon::common::LogError(
          "ps_server: shard %d: periodic checkpoint failed, still serving "
          "(the previous checkpoint is intact): %s",
          shard, status.ToString());
    }
  };
}

// The exit code for a shard that could not start: a bad flag, a model too
// large for the machine, or a checkpoint that is not this shard's or
// unreadable is a configuration error (restarting will not help).
int ExitCodeForStartError(const absl::Status& status) {
  const absl::StatusCode code = status.code();
  const bool config_error = code == absl::StatusCode::kInvalidArgument ||
                            code == absl::StatusCode::kFailedPrecondition ||
                            code == absl::StatusCode::kDataLoss ||
                            code == absl::StatusCode::kResourceExhausted;
  return config_error ? kExitConfigError : kExitFailure;
}

// What --port_file holds: the port, or with --listen=unix:PATH the address.
std::string PortFileLine(const ShardServerOptions& options,
                         const ShardServer& server) {
  return absl::StartsWith(options.listen_address, kUnixPrefix)
             ? server.address()
             : absl::StrCat(server.port());
}

// The lines that say what the shard serves, once it does.
void LogServing(const ShardServerOptions& options,
                const monsoon::TrainingConfig& config, ShardServer& server) {
  if (server.resumed_version() >= 0) {
    if (server.resharded()) {
      monsoon::common::Log(
          "ps_server: shard %d of %d resumed at version %d from the "
          "checkpoints another shard count left in %s",
          options.shard, options.num_shards, server.resumed_version(),
          options.checkpoint_dir);
    } else {
      monsoon::common::Log("ps_server: shard %d resumed from %s at version %d",
                           options.shard, server.checkpoint_path(),
                           server.resumed_version());
    }
  }
  const auto range = server.state()->range();
  monsoon::common::Log(
      "ps_server: shard %d/%d serving on %s, mode %s, optimizer %s, "
      "params [%d, %d) of %d, config %016x",
      options.shard, options.num_shards,
      absl::StartsWith(options.listen_address, kUnixPrefix)
          ? server.address()
          : absl::StrCat("port ", server.port()),
      monsoon::common::ModeName(config.mode()),
      monsoon::common::OptimizerName(config.optimizer()), range.begin,
      range.end, monsoon::common::ModelLayout::FromConfig(config).num_params(),
      monsoon::common::ConfigFingerprint(config));
  if (config.delay_compensation() > 0) {
    monsoon::common::Log(
        "ps_server: shard %d: delay compensation %g keeps each worker's last "
        "pulled weights: up to %d x %.1f MB",
        options.shard, config.delay_compensation(), options.num_workers,
        range.size() * sizeof(float) / 1e6);
  }
  if (server.metrics_port() != 0) {
    monsoon::common::Log("ps_server: metrics on port %d (GET /metrics)",
                         server.metrics_port());
  }
}

// Serves until SIGTERM, or until the run's finisher closes the run (every
// worker finished and the results are collected) for every range this
// process serves (ShardServer::RunClosedEverywhereServed).
void ServeUntilTheEnd(const monsoon::common::TerminationWatcher& termination,
                      ShardServer& server, int shard) {
  bool said = false;
  while (!termination.terminated().WaitForNotificationWithTimeout(
             absl::Milliseconds(200)) &&
         !server.RunClosedEverywhereServed()) {
    if (!said && server.run_closed().HasBeenNotified()) {
      said = true;
      monsoon::common::Log(
          "ps_server: shard %d: the run is closed for its own range; this "
          "process still serves the range of shard %d, which it took over, "
          "until the run's finisher closes it there",
          shard, server.backup_state()->shard());
    }
  }
  if (termination.terminated().HasBeenNotified()) {
    monsoon::common::Log("ps_server: shard %d: signal %d, shutting down", shard,
                         termination.signal());
  } else {
    monsoon::common::Log(
        "ps_server: shard %d: every worker finished and the run is closed; "
        "saving the final checkpoint and stopping",
        shard);
  }
}

// Stops serving, writes the final checkpoint (with --checkpoint_dir) and
// logs the shard's totals; the exit code.
int Stop(const ShardServerOptions& options, ShardServer& server) {
  // Shutdown reports NOT_SERVING first, then stops the calls; after it no
  // push runs, so the checkpoint is consistent.
  server.Shutdown(absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_s)));
  if (!options.checkpoint_dir.empty()) {
    absl::Status saved = server.SaveCheckpoint();
    if (!saved.ok()) return Fail(kExitFailure, saved.ToString());
    monsoon::common::Log("ps_server: shard %d wrote checkpoint %s",
                         options.shard, server.checkpoint_path());
  }
  const monsoon::StatsResponse stats = server.state()->Stats();
  monsoon::common::Log(
      "ps_server: shard %d stopped at version %d after %d "
      "pushes (%d rejected)",
      options.shard, stats.version(), stats.pushes(), stats.rejected_pushes());
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<monsoon::common::TerminationWatcher> termination;
  if (absl::Status started =
          monsoon::common::StartDaemon(Info(), argc, argv, &termination);
      !started.ok()) {
    return Fail(kExitConfigError, started);
  }
  auto config = monsoon::common::LoadResolvedConfig(
      absl::GetFlag(FLAGS_config), absl::GetFlag(FLAGS_data_dir));
  if (!config.ok()) return Fail(kExitConfigError, config.status());

  ShardServerOptions options;
  options.config = *config;
  SetServingFromFlags(&options);
  if (absl::Status times = SetTimesFromFlags(&options); !times.ok()) {
    return Fail(kExitConfigError, times.message());
  }
  if (absl::Status security = SetSecurityFromFlags(&options); !security.ok()) {
    return Fail(kExitConfigError, security);
  }
  options.on_periodic_checkpoint = PeriodicCheckpointLog(options.shard);
  auto server = ShardServer::Start(options);
  if (!server.ok()) {
    return Fail(ExitCodeForStartError(server.status()), server.status());
  }
  LogServing(options, *config, **server);
  if (const std::string port_file = absl::GetFlag(FLAGS_port_file);
      !port_file.empty()) {
    // Written whole, then renamed, so that a reader never sees a partial
    // file.
    absl::Status written = monsoon::common::WriteFileAtomically(
        port_file, absl::StrCat(PortFileLine(options, **server), "\n"));
    if (!written.ok()) return Fail(kExitFailure, written.message());
  }
  ServeUntilTheEnd(*termination, **server, options.shard);
  return Stop(options, **server);
}
