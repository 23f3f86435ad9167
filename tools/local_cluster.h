// RunLocalCluster: S ps_server shards, W ps_worker replicas and one
// ps_evaluator as local processes on loopback, supervised until training
// ends; then the run's metrics. Used by launch_local and compare_modes.
#ifndef MONSOON_TOOLS_LOCAL_CLUSTER_H_
#define MONSOON_TOOLS_LOCAL_CLUSTER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/free_ports.h"
#include "proto/config.pb.h"
#include "tools/chaos.h"
#include "tools/metrics.h"
#include "tools/process_supervisor.h"

namespace monsoon::tools {

// Where each process runs and which addresses reach the servers, for runs
// on emulated hosts (tools/emulated_network.h). Sizes match the counts.
struct HostPlacement {
  // Command prefixes, e.g. {"ip", "netns", "exec", "host-3"}.
  std::vector<std::vector<std::string>> server_prefix;
  std::vector<std::vector<std::string>> worker_prefix;
  std::vector<std::string> server_listen;     // each server's --listen
  std::vector<std::string> worker_addresses;  // what workers dial, per shard
  // Each worker's own address on the shaped network, per rank: where its
  // peers reach it (allreduce's ring: ps_worker --ring_host).
  std::vector<std::string> worker_hosts;
  // What the evaluator and the launcher (both unplaced) dial, per shard.
  std::vector<std::string> control_addresses;
  // Where the kernel cannot delay packets (no netem): the one-way delay of
  // a worker's path to a server, which a delay proxy (tools/delay_proxy.h)
  // on the worker's host adds in front of each server; 0: none.
  double proxy_delay_ms = 0;
};

// This program's path (from /proc/self/exe); empty if it cannot be read.
std::string ExecutablePath();

// Where the daemons are for a tool built beside them: for
// bazel-bin/tools/<tool>, bazel-bin (holding server/ and worker/). "." if
// this program's path cannot be read.
std::string DefaultBinDir();

// Checks a --device value for the workers and the evaluator: cpu, auto,
// cuda or cuda:N (N >= 0). INVALID_ARGUMENT naming the value otherwise.
// Whether a GPU is there is the daemons' to find out.
absl::Status CheckDeviceName(absl::string_view device);

// Checks the launchers' --eval_interval_s (above 0, at most an hour) and
// --time_limit_s (0: none, or a finite number of seconds).
// INVALID_ARGUMENT naming the flag and the value otherwise.
absl::Status CheckRunSeconds(double eval_interval_s, double time_limit_s);

// Makes a throwaway CA and a server and a client certificate for loopback
// in `dir` with tools/make_certs.sh (found in this tool's runfiles), for
// LocalClusterOptions.tls_dir. INTERNAL, with the script's output, when it
// fails; NOT_FOUND when the script is not there.
absl::Status MakeThrowawayCerts(const std::string& dir);

// How far a run has come, read from its daemons while training runs (never
// from their log lines): the shards' Stats and the evaluator's curve file.
struct RunProgressSample {
  double time_s = 0;  // since the start of training
  // Shard 0's training examples applied and version (every push reaches
  // every shard); 0 until a shard first answers.
  int64_t samples = 0;
  int64_t version = 0;
  // Examples applied per second between the last two Stats answers, about a
  // second apart (0 until there are two, and while a shard does not
  // answer): a rate of the last second, which moves from the first seconds
  // on and does not wait for the evaluator.
  double samples_per_s = 0;
  // The epoch the workers are in, 1 to `epochs`, from samples over the
  // examples an epoch of every worker trains (the smallest partition's
  // whole batches, times the workers); 0 when the training set's size could
  // not be read.
  int epoch = 0;
  int epochs = 0;  // the config's
  // The evaluator's latest point (--curve_out, rewritten after every point),
  // if it has written one: its test accuracy (and a click model's AUC, 0
  // for others) and time since the start.
  bool evaluated = false;
  double test_accuracy = 0;
  double test_auc = 0;
  double eval_time_s = 0;
};

// FreePortRange (common/free_ports.h): the launchers' metrics ports.
using ::monsoon::common::FreePortRange;

struct LocalClusterOptions {
  TrainingConfig config;  // resolved
  int servers = 2;
  int workers = 2;  // started at once
  // Elastic runs (config.elastic): the ranks the run may have, every
  // daemon's --num_workers (0: `workers`). The chaos's add faults start
  // workers of the ranks after the first `workers`; a worker that dies is
  // not started again (its data shards go back to the queue), and one that
  // a remove fault stops leaves. Loopback only (not with a placement).
  int max_workers = 0;
  // Folder with server/ps_server, worker/ps_worker, worker/ps_evaluator.
  std::string bin_dir;
  // Where the config, port files and the curve are written (must exist).
  std::string work_dir;
  double eval_interval_s = 2;
  std::string device = "cpu";  // the workers' and evaluator's --device
  // A training script run by /bin/sh in place of ps_worker, once per rank,
  // with the MONSOON_* environment monsoon.torch reads (tools/
  // script_workers.h); the run's model is then the script's. The evaluator
  // runs evaluator_cmd, or the same script (MONSOON_RANK=-1). Empty: the
  // C++ daemons.
  std::string worker_cmd;
  std::string evaluator_cmd;
  // Seconds a server may take to start listening.
  double start_timeout_s = 30;
  // Stop training after this many seconds (0: train every epoch): workers
  // get SIGTERM, finish their step and exit; the run then ends as usual.
  double time_limit_s = 0;
  // Processes on emulated hosts; null: everything on loopback, each server
  // on a free port.
  const HostPlacement* placement = nullptr;
  // How often a server or worker that dies during training is started
  // again, as Kubernetes would (0: never; the run fails instead). The
  // servers then write checkpoints into WORK_DIR/checkpoints every
  // checkpoint_interval_s (cleared at the start), which a restarted one
  // resumes from. A worker that exits 2 at its first start (bad flags or
  // config) is not restarted.
  int max_restarts = 3;
  double checkpoint_interval_s = 2;
  // The servers' --replicas (server/replication.h): 1 gives every shard's
  // range a live backup in the next server, which takes it over when the
  // server dies; a server that dies is then not started again (it would
  // have to copy its ranges back from the live copies, which is not built
  // yet), and the run fails only when two neighbouring servers are gone
  // (both copies of a range). Loopback only (not with a placement).
  int replicas = 0;
  // The servers listen on Unix domain sockets (ps_server --listen=unix:PATH,
  // in a fresh folder under $TMPDIR or /tmp, removed at the end: a socket's
  // path must fit 107 bytes), where the workers, the evaluator and the
  // servers themselves reach them: messages skip the TCP stack, as they can
  // between processes of one machine. Loopback only (not with a
  // placement); mode allreduce's ring stays on TCP (gloo's).
  bool unix_sockets = false;
  // The servers' --lease_s: how long a dead worker holds up a sync step,
  // and a restarted one waits to take its rank back. Shorter than the
  // daemons' default of 10 s: on one machine a live worker calls far more
  // often.
  double lease_s = 3;
  // Faults to inject (ParseChaos), counted from the start of training: the
  // first push a shard applied (in mode allreduce, the workers' start).
  std::vector<Fault> faults;
  // A folder as tools/make_certs.sh makes it (ca.pem, server.pem/key,
  // client.pem/key): every connection then uses mutual TLS. Empty:
  // plaintext.
  std::string tls_dir;
  // If not 0, every daemon serves Prometheus metrics on 127.0.0.1: shard s
  // on metrics_port + s, worker r on metrics_port + servers + r, the
  // evaluator on metrics_port + servers + RunRanks(); and
  // WORK_DIR/metrics_targets.json lists them for Prometheus'
  // file_sd_configs (labels role and, for shards and workers, index).
  int metrics_port = 0;
  // Stragglers: worker rank -> slowdown factor (ps_worker --slowdown).
  std::map<int, double> slowdown;
  // Workers keep serving their final metrics this long after training
  // (ps_worker --metrics_linger_s); with metrics only.
  double metrics_linger_s = 0;
  // If set, called about once a second while training runs, on the thread
  // that runs RunLocalCluster (between the supervisor's events), with the
  // run's progress. The figures are read on a thread of the launcher's own,
  // so that a shard that does not answer (stopped by a fault, restarting)
  // never holds up the supervisor; a sample then keeps its last figures.
  std::function<void(const RunProgressSample&)> on_progress;
};

// The ranks of a run: `max_workers` in an elastic run that sets it, else
// `workers`. Metrics ports are kept for each.
int RunRanks(const LocalClusterOptions& options);

// Runs the cluster to the end. CANCELLED on Ctrl-C, after stopping every
// process; INTERNAL naming the process when one fails for good (it exited
// during training with no restart left). `supervisor` must be the
// process's only one, constructed before any thread started.
absl::StatusOr<RunMetrics> RunLocalCluster(const LocalClusterOptions& options,
                                           ProcessSupervisor* supervisor);

}  // namespace monsoon::tools

#endif  // MONSOON_TOOLS_LOCAL_CLUSTER_H_
