// launch_local: a whole Monsoon cluster on this machine. Starts --servers
// shards, --workers replicas and an evaluator on loopback, streams their logs
// with role prefixes, stops everything at the end or on Ctrl-C, and writes
// the run's metrics as JSON.
#include <signal.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/daemon.h"
#include "common/log.h"
#include "common/model_config.h"
#include "common/model_layout.h"
#include "common/temp_dir.h"
#include "tools/chaos.h"
#include "tools/config_flags.h"
#include "tools/local_cluster.h"
#include "tools/metrics.h"
#include "tools/process_supervisor.h"
#include "worker/dataset.h"

ABSL_FLAG(std::string, mode, "",
          "sync, downpour, easgd, hogwild, onebit or allreduce "
          "(default: the config's "
          "mode, else sync).");
ABSL_FLAG(std::string, model, "",
          "A model preset, mlp, lenet or sparse_lr (libsvm data: README "
          "\"Sparse models\"), instead of the config's model (default: the "
          "config's, the MLP unless it says otherwise).");
ABSL_FLAG(int, servers, 2, "Parameter-server shards to start.");
ABSL_FLAG(std::string, workers, "2",
          "Worker replicas to start. With --elastic also MIN:MAX: start MIN, "
          "and give every daemon --num_workers=MAX, so that up to MAX - MIN "
          "workers may join (add: faults, or ps_worker started by hand with "
          "a rank below MAX); without MAX the run has the workers started "
          "plus one rank per add.");
ABSL_FLAG(std::string, metrics_out, "",
          "Write the run's metrics (JSON) "
          "here; they are printed either way.");
ABSL_FLAG(double, eval_interval_s, 2, "Seconds between evaluations.");
ABSL_FLAG(double, time_limit_s, 0,
          "Stop training after this many seconds (0: train the config's "
          "epochs): the workers get SIGTERM, end their step and leave; the "
          "run then ends as usual, with its final evaluation.");
ABSL_FLAG(std::string, device, "cpu",
          "The workers' and evaluator's compute backend: cpu (OpenBLAS), "
          "cuda (GPU 0), cuda:N, or auto (GPU 0 where there is a usable one, "
          "else the CPU). A GPU needs binaries built with "
          "bazel build --config=cuda; several workers share one GPU.");
ABSL_FLAG(std::string, worker_cmd, "",
          "Run this command (by /bin/sh) as each worker instead of ps_worker: "
          "a PyTorch script using monsoon.torch, e.g. 'python3 train.py'. It "
          "is first run once with MONSOON_EXPORT_LAYOUT to learn its model; "
          "each rank then gets MONSOON_SERVERS, _RANK, _NUM_WORKERS, _CONFIG, "
          "_REPORT_OUT and the token and TLS settings. The evaluator runs it "
          "too, with MONSOON_RANK=-1 (worker/python/README.md).");
ABSL_FLAG(std::string, evaluator_cmd, "",
          "With --worker_cmd: the evaluator's command (default the same).");
ABSL_FLAG(std::string, bin_dir, "",
          "Folder holding server/ps_server and "
          "worker/ps_{worker,evaluator} (default: found beside this binary).");
ABSL_FLAG(bool, restart_failed, true,
          "Start a server or worker that dies during training again (a "
          "worker's first restart after 0.1 s; then, and a server's, after "
          "1 s, doubling per restart), as Kubernetes would; the servers then "
          "checkpoint into WORK_DIR/checkpoints every 2 s. --norestart_failed: "
          "the first death ends the run.");
ABSL_FLAG(int, max_restarts, 3,
          "With --restart_failed, how often each process may be restarted "
          "before the run fails.");
ABSL_FLAG(int, replicas, 0,
          "1: every server's range gets a live backup in the next server "
          "(ps_server --replicas), which takes the range over when the server "
          "dies: a killed server loses no acknowledged update; restarted, it "
          "copies its ranges back and is their backup. Every mode but "
          "allreduce, every option but elastic runs (sparse tables too); 0: "
          "none, a dead server restarts from its checkpoint.");
ABSL_FLAG(bool, unix_sockets, false,
          "The servers listen on Unix domain sockets (ps_server "
          "--listen=unix:PATH) in a fresh folder under $TMPDIR, and every "
          "process reaches them there: messages between processes of this "
          "machine skip the TCP stack (a push-pull of 4 MiB in 0.7x the "
          "time; socket buffers up to net.core.wmem_max). Not with --link; "
          "allreduce's ring stays on TCP.");
ABSL_FLAG(std::string, chaos, "",
          "Faults to inject, their times from the start of training (a "
          "shard's first push; in mode allreduce, the workers' start): "
          "comma-separated "
          "kill:TARGET@TIME (SIGKILL) or stop:TARGET@TIME+DURATION (SIGSTOP, "
          "then SIGCONT), TARGET serverN or workerN, e.g. "
          "kill:server1@10s,stop:server0@5s+10s. With --elastic also "
          "add:worker@TIME (a worker of the next rank joins) and "
          "remove:workerN@TIME (it leaves cleanly); a killed worker is then "
          "not restarted (its session is ended on the shards at once, so its "
          "data shard goes back to the queue), and taking the last worker "
          "away is refused.");
ABSL_FLAG(std::string, tls_dir, "",
          "Mutual TLS for every connection, with the certificates in this "
          "folder (as tools/make_certs.sh DIR makes them). Default: "
          "plaintext on loopback; every run has its own auth token either "
          "way.");
ABSL_FLAG(bool, tls, false,
          "Mutual TLS for every connection with a throwaway CA and "
          "certificates made for this run in WORK_DIR/tls (openssl, through "
          "tools/make_certs.sh); --tls_dir uses certificates of your own.");
ABSL_FLAG(int, metrics_port, -1,
          "Every daemon serves Prometheus metrics (GET /metrics) on 127.0.0.1 "
          "from this port on: shards first, then workers, then the evaluator; "
          "WORK_DIR/metrics_targets.json lists them for Prometheus' "
          "file_sd_configs. -1: consecutive free ports the launcher finds "
          "(it logs them); 0: no metrics.");
ABSL_FLAG(double, metrics_linger_s, 0,
          "Workers keep serving their final metrics this many seconds after "
          "training (ps_worker --metrics_linger_s), so that a Prometheus "
          "scraping the run sees them; 0: they exit at once.");
ABSL_FLAG(std::string, work_dir, "",
          "Folder for the run's config and curve "
          "(default: a new monsoon-run-XXXXXX under $TMPDIR, else /tmp).");

namespace {

using monsoon::common::kExitConfigError;
using monsoon::common::kExitFailure;
using monsoon::common::kExitOk;
using monsoon::tools::LocalClusterOptions;

int Fail(int code, const absl::Status& status) {
  return monsoon::common::Fail("launch", code, status);
}

// The config from --mode, --model and the config flags.
absl::StatusOr<monsoon::TrainingConfig> ConfigFromFlags() {
  monsoon::Mode mode = monsoon::MODE_UNSPECIFIED;
  if (!absl::GetFlag(FLAGS_mode).empty()) {
    auto parsed = monsoon::common::ParseMode(absl::GetFlag(FLAGS_mode));
    if (!parsed.ok()) return parsed.status();
    mode = *parsed;
  }
  monsoon::Model model = monsoon::MODEL_AUTO;
  if (!absl::GetFlag(FLAGS_model).empty()) {
    auto parsed = monsoon::common::ParseModel(absl::GetFlag(FLAGS_model));
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model: ", parsed.status().message()));
    }
    model = *parsed;
  }
  return monsoon::tools::ConfigFromFlags(mode, model);
}

// --servers, --workers, the data, --max_restarts, --restart_failed and
// --chaos into `options` (its config set); INVALID_ARGUMENT for the first
// bad one.
absl::Status SetRunFromFlags(LocalClusterOptions* options) {
  const int servers = absl::GetFlag(FLAGS_servers);
  if (servers < 1 || servers > 64) {
    return absl::InvalidArgumentError("--servers must be in [1, 64]");
  }
  absl::StatusOr<monsoon::tools::WorkerCount> count =
      monsoon::tools::ParseWorkerCount(absl::GetFlag(FLAGS_workers),
                                       options->config.elastic());
  if (!count.ok()) return count.status();
  const int workers = count->start;
  if (auto s =
          monsoon::worker::CheckDataFilesFor(options->config);
      !s.ok()) {
    return s;
  }
  const int max_restarts = absl::GetFlag(FLAGS_max_restarts);
  if (max_restarts < 0 || max_restarts > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_restarts must be in [0, 100], got ", max_restarts));
  }
  auto faults = monsoon::tools::ParseChaos(absl::GetFlag(FLAGS_chaos), servers,
                                           workers, options->config.elastic());
  if (!faults.ok()) return faults.status();
  options->servers = servers;
  options->workers = workers;
  absl::StatusOr<int> ranks = monsoon::tools::RanksFor(*faults, *count);
  if (!ranks.ok()) return ranks.status();
  options->max_workers = *ranks;
  options->max_restarts =
      absl::GetFlag(FLAGS_restart_failed) ? max_restarts : 0;
  options->faults = *std::move(faults);
  options->replicas = absl::GetFlag(FLAGS_replicas);
  options->unix_sockets = absl::GetFlag(FLAGS_unix_sockets);
  if (options->replicas < 0 || options->replicas > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--replicas must be 0 or 1, got ", options->replicas));
  }
  return absl::OkStatus();
}

// --metrics_port and --metrics_linger_s into `options` (its counts set).
// The exit code for an error: finding no free ports is not the flags'
// fault.
absl::Status SetMetricsFromFlags(LocalClusterOptions* options, int* exit_code) {
  const int daemons =
      options->servers + monsoon::tools::RunRanks(*options) + 1;
  *exit_code = kExitConfigError;
  options->metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (options->metrics_port == -1) {
    absl::StatusOr<int> first = monsoon::tools::FreePortRange(daemons);
    if (!first.ok()) {
      *exit_code = kExitFailure;
      return first.status();
    }
    options->metrics_port = *first;
  }
  options->metrics_linger_s = absl::GetFlag(FLAGS_metrics_linger_s);
  if (!(options->metrics_linger_s >= 0 && options->metrics_linger_s <= 3600)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_linger_s must be from 0 to 3600, got ",
                     options->metrics_linger_s));
  }
  if (options->metrics_port < 0 ||
      options->metrics_port + daemons - 1 > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_port=", options->metrics_port, " leaves no room for ",
        daemons, " daemons below port 65536"));
  }
  return absl::OkStatus();
}

// --work_dir, created, or a new folder under TMPDIR.
absl::StatusOr<std::string> MakeWorkDir() {
  std::string work_dir = absl::GetFlag(FLAGS_work_dir);
  if (work_dir.empty()) return monsoon::common::MakeTempDir("monsoon-run");
  std::error_code error;
  std::filesystem::create_directories(work_dir, error);
  if (error) {
    return absl::InternalError(absl::StrCat(
        "cannot create --work_dir=", work_dir, ": ", error.message()));
  }
  return work_dir;
}

// With --tls, certificates made for this run in its work dir (--tls_dir
// taken as it is).
absl::Status MakeTlsIfAsked(LocalClusterOptions* options, int* exit_code) {
  if (!absl::GetFlag(FLAGS_tls)) return absl::OkStatus();
  if (!options->tls_dir.empty()) {
    *exit_code = kExitConfigError;
    return absl::InvalidArgumentError(
        "--tls makes certificates, --tls_dir takes yours: give one of them");
  }
  options->tls_dir = options->work_dir + "/tls";
  if (absl::Status made = monsoon::tools::MakeThrowawayCerts(options->tls_dir);
      !made.ok()) {
    *exit_code = kExitFailure;
    return made;
  }
  monsoon::common::Log("launch: mutual TLS with certificates made in %s",
                       options->tls_dir);
  return absl::OkStatus();
}

// What the run will be, before it starts.
void LogPlan(const LocalClusterOptions& options) {
  const monsoon::TrainingConfig& config = options.config;
  if (!options.worker_cmd.empty()) {
    monsoon::common::Log(
        "launch: mode %s, %d servers, %d workers running '%s', %d epochs, "
        "batch %d, lr %g; the model is the script's; work dir %s",
        monsoon::common::ModeName(config.mode()), options.servers,
        options.workers, options.worker_cmd, config.epochs(),
        config.batch_size(), config.learning_rate(), options.work_dir);
    return;
  }
  if (config.model() == monsoon::SPARSE_LR) {
    monsoon::common::Log(
        "launch: mode %s, %d servers, %d workers, %d epochs, batch %d, model "
        "sparse_lr on %s (rows in table '%s', %d dense parameters), dense "
        "optimizer %s lr %g; work dir %s",
        monsoon::common::ModeName(config.mode()), options.servers,
        options.workers, config.epochs(), config.batch_size(),
        config.data_dir(), monsoon::common::kSparseLrTable,
        monsoon::common::kSparseLrDenseValues,
        monsoon::common::OptimizerName(config.optimizer()),
        config.learning_rate(), options.work_dir);
    return;
  }
  const monsoon::common::ModelLayout layout =
      monsoon::common::ModelLayout::FromConfig(config);
  monsoon::common::Log(
      "launch: mode %s, %d servers, %d workers, %d epochs, batch %d, model "
      "%s on %s examples (%d parameters), optimizer %s lr %g; work dir %s",
      monsoon::common::ModeName(config.mode()), options.servers,
      options.workers, config.epochs(), config.batch_size(), layout.Describe(),
      monsoon::common::ShapeString(layout.input()), layout.num_params(),
      monsoon::common::OptimizerName(config.optimizer()),
      config.learning_rate(), options.work_dir);
  if (config.elastic()) {
    monsoon::common::Log(
        "launch: elastic: ranks 0 to %d, %d started now; shard 0 hands the "
        "data out in data shards of %d batches",
        monsoon::tools::RunRanks(options) - 1, options.workers,
        config.data_shard_batches());
  }
  if (options.metrics_port != 0) {
    monsoon::common::Log(
        "launch: metrics on 127.0.0.1:%d-%d (GET /metrics; shards, workers, "
        "evaluator), listed in %s/metrics_targets.json",
        options.metrics_port,
        options.metrics_port + options.servers +
            monsoon::tools::RunRanks(options),
        options.work_dir);
  }
}

// Prints the run's metrics and writes them to --metrics_out, if set.
absl::Status ReportMetrics(const monsoon::tools::RunMetrics& metrics) {
  const std::string json = monsoon::tools::MetricsJson(metrics);
  std::fputs(json.c_str(), stdout);
  const std::string out_path = absl::GetFlag(FLAGS_metrics_out);
  if (!out_path.empty()) {
    std::ofstream out(out_path);
    out << json;
    if (!out) return absl::InternalError("cannot write " + out_path);
    monsoon::common::Log("launch: metrics written to %s", out_path);
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Runs a Monsoon cluster on this machine and reports its metrics.\n\n"
      "  launch_local --mode=downpour --servers=2 --workers=2 --epochs=3 "
      "--metrics_out=/tmp/downpour.json\n\n"
      "Each process's log lines are prefixed with its role. A process that "
      "dies is restarted (--restart_failed); --chaos injects faults. Ctrl-C "
      "stops everything. Exit codes: 0 done, 2 bad flags or config, 130 "
      "interrupted, 1 a process failed.");
  // Before any thread: the supervisor takes over SIGINT, SIGTERM, SIGCHLD.
  monsoon::tools::ProcessSupervisor supervisor;
  monsoon::tools::ShowConfigFlagsInHelp("tools/launch_local_main.cc");
  absl::ParseCommandLine(argc, argv);

  auto config = ConfigFromFlags();
  if (!config.ok()) return Fail(kExitConfigError, config.status());
  LocalClusterOptions options;
  options.config = *config;
  if (absl::Status set = SetRunFromFlags(&options); !set.ok()) {
    return Fail(kExitConfigError, set);
  }
  options.tls_dir = absl::GetFlag(FLAGS_tls_dir);
  int exit_code = kExitConfigError;
  if (absl::Status set = SetMetricsFromFlags(&options, &exit_code); !set.ok()) {
    return Fail(exit_code, set);
  }
  options.bin_dir = absl::GetFlag(FLAGS_bin_dir).empty()
                        ? monsoon::tools::DefaultBinDir()
                        : absl::GetFlag(FLAGS_bin_dir);
  options.eval_interval_s = absl::GetFlag(FLAGS_eval_interval_s);
  options.time_limit_s = absl::GetFlag(FLAGS_time_limit_s);
  if (absl::Status ok = monsoon::tools::CheckRunSeconds(options.eval_interval_s,
                                                        options.time_limit_s);
      !ok.ok()) {
    return Fail(kExitConfigError, ok);
  }
  options.device = absl::GetFlag(FLAGS_device);
  if (absl::Status ok = monsoon::tools::CheckDeviceName(options.device);
      !ok.ok()) {
    return Fail(kExitConfigError, ok);
  }
  options.worker_cmd = absl::GetFlag(FLAGS_worker_cmd);
  options.evaluator_cmd = absl::GetFlag(FLAGS_evaluator_cmd);
  if (options.worker_cmd.empty() && !options.evaluator_cmd.empty()) {
    return Fail(kExitConfigError,
                absl::InvalidArgumentError(
                    "--evaluator_cmd is for a run of --worker_cmd scripts; "
                    "give --worker_cmd too"));
  }
  absl::StatusOr<std::string> work_dir = MakeWorkDir();
  if (!work_dir.ok()) return Fail(kExitFailure, work_dir.status());
  options.work_dir = *work_dir;
  if (absl::Status made = MakeTlsIfAsked(&options, &exit_code); !made.ok()) {
    return Fail(exit_code, made);
  }
  LogPlan(options);

  auto metrics = monsoon::tools::RunLocalCluster(options, &supervisor);
  if (!metrics.ok()) {
    const bool interrupted =
        metrics.status().code() == absl::StatusCode::kCancelled;
    monsoon::common::LogError("launch: %s; stopping every process",
                              interrupted ? "interrupted" : "run failed");
    supervisor.StopAll(absl::Seconds(5));
    return Fail(
        interrupted ? monsoon::common::ExitCodeForSignal(SIGINT) : kExitFailure,
        metrics.status());
  }
  if (absl::Status reported = ReportMetrics(*metrics); !reported.ok()) {
    return Fail(kExitFailure, reported);
  }
  const auto& last = metrics->curve.points(metrics->curve.points_size() - 1);
  monsoon::common::Log(
      "launch: %s done: final test accuracy %.4f, wall time %.1f s",
      monsoon::common::ModeName(config->mode()), last.test_accuracy(),
      metrics->wall_time_s);
  return kExitOk;
}
