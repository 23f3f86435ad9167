// ps_worker: one training replica. Flags (or MONSOON_* environment
// variables) name its rank, the worker count, the shards' addresses in shard
// order, the config, the device and the data.
#include <google/protobuf/text_format.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/auth.h"
#include "common/config.h"
#include "common/daemon.h"
#include "common/log.h"
#include "common/metrics_exporter.h"
#include "common/model_config.h"
#include "common/model_layout.h"
#include "common/termination.h"
#include "common/tls.h"
#include "proto/metrics.pb.h"
#include "worker/backend_factory.h"
#include "worker/client_flags.h"
#include "worker/dataset.h"
#include "worker/model/model.h"
#include "worker/ps_client.h"
#include "worker/script_worker.h"
#include "worker/sparse_lr.h"
#include "worker/training_loop.h"
#include "worker/worker_metrics.h"

ABSL_FLAG(int, rank, 0, "This worker's rank, 0-based (env MONSOON_RANK).");
ABSL_FLAG(int, num_workers, 1,
          "How many workers train; worker r trains on "
          "the r-th 1/num_workers of the training set. In an elastic run "
          "(config elastic: true) the most ranks the run may have, the data "
          "handed out by shard 0 (env MONSOON_NUM_WORKERS).");
ABSL_FLAG(std::string, servers, "",
          "Comma-separated host:port of every "
          "ps_server, in shard order (env MONSOON_SERVERS).");
ABSL_FLAG(std::string, config, "",
          "Training config, text-format "
          "monsoon.TrainingConfig; empty means every default (env "
          "MONSOON_CONFIG). Must match the servers'.");
ABSL_FLAG(std::string, data_dir, "",
          "Overrides the config's data_dir "
          "(env MONSOON_DATA_DIR).");
ABSL_FLAG(std::string, device, "auto",
          "auto, cpu or cuda (env "
          "MONSOON_DEVICE).");
ABSL_FLAG(int, cpu_threads, 1, "OpenBLAS threads for the CPU backend.");
ABSL_FLAG(double, shard_lost_timeout_s, 300,
          "How long to wait for a shard that was lost mid-run (restarted, "
          "rescheduled, frozen) to come back before giving up; the worker "
          "logs what it waits for every --log_every_s and carries on once "
          "the shard answers (env MONSOON_SHARD_LOST_TIMEOUT_S).");
ABSL_FLAG(double, log_every_s, 5, "Seconds between progress lines (0: none).");
ABSL_FLAG(std::string, report_out, "",
          "If set, write what this run trained here when the worker stops "
          "(text-format monsoon.WorkerReport: steps, examples, the times of "
          "the first and last step, how it ended), also after an error or a "
          "signal (env MONSOON_REPORT_OUT).");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT to serve Prometheus metrics on (GET /metrics; port 0: "
          "any free one); empty: none (env MONSOON_METRICS_LISTEN).");
ABSL_FLAG(double, metrics_linger_s, 0,
          "With --metrics_listen: after training, keep serving the final "
          "metrics this many seconds (or until a signal) before exiting, so "
          "that a Prometheus scraping every N s sees them; set it above the "
          "scrape interval (env MONSOON_METRICS_LINGER_S).");
ABSL_FLAG(double, slowdown, 1,
          "For experiments with stragglers: after each step wait (FACTOR - 1) "
          "times that step's compute time, so that this worker's steps take "
          "about FACTOR times as long (1 to 100; 1: no wait).");
ABSL_FLAG(std::string, ring_host, "127.0.0.1",
          "Mode allreduce: the address of this machine that the other "
          "workers reach it at; the ring listens there on a port of the "
          "system's choosing and publishes it at shard 0's rendezvous. On "
          "Kubernetes, the pod's IP (env MONSOON_RING_HOST from the downward "
          "API's status.podIP).");
ABSL_FLAG(double, publish_every_s, 1,
          "Mode allreduce: how often rank 0 publishes the weights to the "
          "shards, for the evaluator and checkpoints (0.05 to 3600 s; each "
          "publish sends the whole model from rank 0) (env "
          "MONSOON_PUBLISH_EVERY_S).");
ABSL_FLAG(bool, resume, true,
          "Start this rank's data after the examples the servers have "
          "already applied from it, so that a restarted worker continues "
          "where it stopped. --noresume trains the whole run again.");

namespace {

using monsoon::common::kExitConfigError;
using monsoon::common::kExitFailure;
using monsoon::common::kExitOk;
using monsoon::common::TerminationWatcher;
using monsoon::worker::PsClient;
using monsoon::worker::WorkerContext;

constexpr char kProgram[] = "ps_worker";

int Fail(int code, const absl::Status& status) {
  return monsoon::common::Fail(kProgram, code, status);
}

monsoon::common::DaemonInfo Info() {
  monsoon::common::DaemonInfo info;
  info.program = kProgram;
  info.usage =
      "Monsoon worker: trains the config's model on its slice of the data.\n\n"
      "  ps_worker --rank=0 --num_workers=2 "
      "--servers=ps-0:5000,ps-1:5000 --config=train.textproto\n\n"
      "Every flag may also come from MONSOON_<FLAG> in the environment; a "
      "flag on the command line wins. Exit codes: 0 when training is done, "
      "2 for a configuration error, 128+N after signal N (SIGTERM or SIGINT "
      "stop training between steps), 1 otherwise.";
  info.main_file = "worker/ps_worker_main.cc";
  info.more_flag_files = {"worker/client_flags.cc"};
  return info;
}

// Writes --report_out, if set; a failure to write is logged, not fatal.
void WriteReport(int rank, int64_t resumed_steps,
                 const monsoon::worker::WorkerResult& progress,
                 const monsoon::worker::WorkerCounters& counters,
                 const monsoon::worker::ReplicaLedger& ledger,
                 const std::string& outcome, absl::Time registered) {
  const std::string path = absl::GetFlag(FLAGS_report_out);
  if (path.empty()) return;
  monsoon::WorkerReport report = monsoon::worker::MakeWorkerReport(
      rank, resumed_steps, progress, counters, outcome);
  report.set_updates_acknowledged(ledger.updates_acknowledged);
  report.set_updates_answered_as_duplicate(
      ledger.updates_answered_as_duplicate);
  report.set_updates_lost(ledger.updates_lost);
  report.set_examples_lost(ledger.examples_lost);
  report.set_take_overs(ledger.take_overs);
  if (registered != absl::InfinitePast()) {
    report.set_registered_unix_s(absl::ToUnixMicros(registered) * 1e-6);
  }
  std::string text;
  google::protobuf::TextFormat::PrintToString(report, &text);
  std::ofstream out(path);
  out << text;
  if (!out) {
    monsoon::common::LogError("ps_worker: cannot write --report_out=%s", path);
  }
}

// --rank, --num_workers, --slowdown and --metrics_linger_s; INVALID_ARGUMENT
// for the first out of range.
absl::Status CheckWorkerFlags() {
  const int rank = absl::GetFlag(FLAGS_rank);
  const int num_workers = absl::GetFlag(FLAGS_num_workers);
  if (num_workers < 1 || rank < 0 || rank >= num_workers) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--rank=%d must be in [0, --num_workers=%d)", rank, num_workers));
  }
  if (const double slowdown = absl::GetFlag(FLAGS_slowdown);
      !(slowdown >= 1 && slowdown <= 100)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--slowdown must be from 1 to 100, got ", slowdown));
  }
  if (const double linger = absl::GetFlag(FLAGS_metrics_linger_s);
      !(linger >= 0 && linger <= 3600)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_linger_s must be from 0 to 3600, got ", linger));
  }
  return absl::OkStatus();
}

// --servers, split; INVALID_ARGUMENT when it is empty.
absl::StatusOr<std::vector<std::string>> ServersFromFlag() {
  std::vector<std::string> servers =
      absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipWhitespace());
  if (servers.empty()) {
    return absl::InvalidArgumentError(
        "--servers is empty: give every shard's host:port, in shard order");
  }
  return servers;
}

// The backend --device and --cpu_threads ask for; logs why --device=auto
// chose the CPU.
absl::StatusOr<std::unique_ptr<monsoon::worker::ComputeBackend>>
BackendFromFlags() {
  std::string why_no_gpu;
  auto backend = monsoon::worker::MakeBackend(absl::GetFlag(FLAGS_device),
                                              absl::GetFlag(FLAGS_cpu_threads),
                                              &why_no_gpu);
  if (backend.ok() && !why_no_gpu.empty()) {
    monsoon::common::Log("ps_worker: --device=auto chose the CPU: %s",
                         why_no_gpu);
  }
  return backend;
}

// The training loop's settings from the flags (the rest of `context` is
// set already); INVALID_ARGUMENT for --shard_lost_timeout_s out of range.
absl::Status SetLoopFlags(const TerminationWatcher& termination,
                          WorkerContext* context) {
  context->log_interval = absl::Seconds(absl::GetFlag(FLAGS_log_every_s));
  const double lost_s = absl::GetFlag(FLAGS_shard_lost_timeout_s);
  if (!(lost_s >= 0 && lost_s <= 1e6)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shard_lost_timeout_s must be from 0 to 1e6, got ", lost_s));
  }
  context->shard_lost_timeout = absl::Seconds(lost_s);
  context->slowdown = absl::GetFlag(FLAGS_slowdown);
  if (context->slowdown > 1) {
    monsoon::common::Log(
        "ps_worker: rank %d: a straggler: each step waits %g times its "
        "compute time (--slowdown=%g)",
        context->rank, context->slowdown - 1, context->slowdown);
  }
  context->ring_host = absl::GetFlag(FLAGS_ring_host);
  const double publish_s = absl::GetFlag(FLAGS_publish_every_s);
  if (!(publish_s >= 0.05 && publish_s <= 3600)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--publish_every_s must be from 0.05 to 3600, got ", publish_s));
  }
  context->publish_every = absl::Seconds(publish_s);
  // SIGTERM or SIGINT stops training between steps.
  context->stop = &termination.terminated();
  return absl::OkStatus();
}

// For a worker the servers are already past (context->resume_steps > 0):
// the exit code when it has nothing left to train, after telling the
// shards; nothing when it goes on training.
std::optional<int> ExitIfNothingLeft(PsClient& client,
                                     const WorkerContext& context,
                                     int64_t train_size) {
  const monsoon::TrainingConfig& config = context.config;
  const int rank = context.rank;
  // The steps every worker of this run takes (the smallest partition's).
  const int64_t total =
      monsoon::worker::SmallestPartition(train_size, context.num_workers) /
      config.batch_size() * config.epochs();
  if (context.resume_steps >= total &&
      client.RankFinished(absl::Seconds(10)).value_or(false)) {
    // This rank finished and told the shards so: a pod started again
    // after its worker was done (a drained node) has nothing to do.
    monsoon::common::Log(
        "ps_worker: rank %d has already finished its training; nothing "
        "to do",
        rank);
    client.Leave(absl::Seconds(2), /*finished=*/true).IgnoreError();
    // A report of no steps: a launcher that restarted this worker (killed
    // as it finished) reads one from every process that exits 0.
    const monsoon::worker::WorkerResult no_steps;
    const monsoon::worker::WorkerCounters no_counters;
    WriteReport(rank, context.resume_steps, no_steps, no_counters,
                client.ledger(), "done: the rank had already finished",
                context.registered);
    return kExitOk;
  }
  if (context.resume_steps >= total) {
    client.Leave(absl::Seconds(2)).IgnoreError();
    return Fail(
        kExitConfigError,
        absl::FailedPreconditionError(absl::StrCat(
            "rank ", rank,
            " has nothing left to train: the servers have "
            "applied all ",
            total, " of its steps (", client.applied_samples(),
            " examples), as in a run that finished (a checkpoint directory "
            "of an earlier run?). Pass --noresume to train the whole run "
            "again, or start the servers without that checkpoint")));
  }
  monsoon::common::Log(
      "ps_worker: rank %d: the servers are past the first %d examples of "
      "this rank (applied, or skipped by sync steps that closed without "
      "it); resuming after its first %d batches (--noresume starts over)",
      rank, client.applied_samples(), context.resume_steps);
  return std::nullopt;
}

// With --metrics_listen, serves the metrics of `context`'s counters and
// client (null without).
absl::StatusOr<std::unique_ptr<monsoon::common::MetricsExporter>> StartMetrics(
    const WorkerContext& context) {
  auto metrics = monsoon::common::MetricsExporter::StartIfListening(
      absl::GetFlag(FLAGS_metrics_listen),
      monsoon::common::BuildInfoLabels("worker", context.config,
                                       {{"rank", absl::StrCat(context.rank)}}),
      {std::make_shared<monsoon::worker::WorkerMetrics>(context.counters,
                                                        context.client)});
  if (metrics.ok() && *metrics != nullptr) {
    monsoon::common::Log("ps_worker: rank %d: metrics on port %d", context.rank,
                         (*metrics)->port());
  }
  return metrics;
}

// After the training loop: leaves the shards, writes the report, lingers
// for the metrics; the exit code.
int Finish(const absl::StatusOr<monsoon::worker::WorkerResult>& result,
           const TerminationWatcher& termination, PsClient& client,
           const WorkerContext& context, bool serving_metrics) {
  const int rank = context.rank;
  // Done or stopping: no sync step should wait for this rank's lease. Done
  // (every example trained) also counts the rank as finished, which ends
  // the run once every rank has (tools/k8s/run_finisher).
  const bool finished =
      result.ok() && !termination.terminated().HasBeenNotified();
  if (absl::Status left = client.Leave(absl::Seconds(2), finished);
      !left.ok() && result.ok()) {
    monsoon::common::LogWarning(
        "ps_worker: rank %d: could not tell every shard it is done (%s); a "
        "sync step waits for its lease to run out",
        rank, left.ToString());
  }
  if (!result.ok() && termination.terminated().HasBeenNotified()) {
    // Errors after a signal are the shutdown's echo (servers going away).
    monsoon::common::Log("ps_worker: rank %d stopped by signal %d", rank,
                         termination.signal());
    WriteReport(rank, context.resume_steps, *context.progress,
                *context.counters, client.ledger(),
                absl::StrCat("stopped by signal ", termination.signal()),
                context.registered);
    return monsoon::common::ExitCodeForSignal(termination.signal());
  }
  WriteReport(rank, context.resume_steps, *context.progress, *context.counters,
              client.ledger(),
              result.ok() ? "done" : result.status().ToString(),
              context.registered);
  if (const double linger = absl::GetFlag(FLAGS_metrics_linger_s);
      serving_metrics && linger > 0) {
    monsoon::common::Log(
        "ps_worker: rank %d: serving the final metrics for %.0f s "
        "(--metrics_linger_s)",
        rank, linger);
    termination.terminated().WaitForNotificationWithTimeout(
        absl::Seconds(linger));
  }
  if (!result.ok()) return Fail(kExitFailure, result.status());
  return kExitOk;
}

// The PsClient's options from the flags.
monsoon::worker::PsClientOptions ClientOptions(
    const monsoon::TrainingConfig& config,
    const std::vector<std::string>& servers,
    const TerminationWatcher& termination) {
  monsoon::worker::PsClientOptions options;
  options.server_addresses = servers;
  options.config = config;
  options.worker_rank = absl::GetFlag(FLAGS_rank);
  options.num_workers = absl::GetFlag(FLAGS_num_workers);
  options.stop = &termination.terminated();
  options.log_every = absl::Seconds(absl::GetFlag(FLAGS_log_every_s));
  return options;
}

// A SPARSE_LR worker (worker/sparse_lr.h): the rows by id, the dense part through
// a ScriptWorker in the run's mode; the exit code.
int RunSparseLr(const monsoon::TrainingConfig& config,
                const std::vector<std::string>& servers,
                const TerminationWatcher& termination) {
  auto train = monsoon::worker::LibsvmFile(config.data_dir(), "train");
  if (!train.ok()) return Fail(kExitConfigError, train.status());
  if (absl::GetFlag(FLAGS_slowdown) > 1) {
    return Fail(kExitConfigError,
                absl::InvalidArgumentError(
                    "--slowdown is not built for sparse_lr workers yet"));
  }
  int connect_error = kExitFailure;
  auto client = monsoon::worker::ConnectWithClientFlags(
      ClientOptions(config, servers, termination), &connect_error);
  if (!client.ok()) return Fail(connect_error, client.status());
  WorkerContext context;
  context.config = config;
  context.rank = absl::GetFlag(FLAGS_rank);
  context.num_workers = absl::GetFlag(FLAGS_num_workers);
  context.client = client->get();
  if (absl::Status set = SetLoopFlags(termination, &context); !set.ok()) {
    return Fail(kExitConfigError, set);
  }
  auto dense = monsoon::worker::ScriptWorker::Create(
      client->get(), config, context.rank, context.num_workers,
      context.shard_lost_timeout, context.stop);
  if (!dense.ok()) return Fail(kExitConfigError, dense.status());
  monsoon::common::Log(
      "ps_worker: rank %d/%d, model sparse_lr, mode %s, data %s, table '%s' "
      "on %d shards",
      context.rank, context.num_workers,
      monsoon::common::ModeName(config.mode()), *train,
      monsoon::common::kSparseLrTable, servers.size());
  monsoon::worker::WorkerResult progress;
  context.progress = &progress;
  context.counters = (*dense)->mutable_counters();
  // After the client and the counters: stops serving before they go.
  auto metrics = StartMetrics(context);
  if (!metrics.ok()) return Fail(kExitConfigError, metrics.status());
  monsoon::worker::SparseLrOptions options;
  options.rank = context.rank;
  options.num_workers = context.num_workers;
  options.log_interval = context.log_interval;
  options.stop = context.stop;
  auto result = monsoon::worker::TrainSparseLr(
      client->get(), dense->get(), config, *train, options, &progress,
      context.counters);
  return Finish(result, termination, **client, context, *metrics != nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<TerminationWatcher> termination;
  if (absl::Status started =
          monsoon::common::StartDaemon(Info(), argc, argv, &termination);
      !started.ok()) {
    return Fail(kExitConfigError, started);
  }
  auto config = monsoon::common::LoadResolvedConfig(
      absl::GetFlag(FLAGS_config), absl::GetFlag(FLAGS_data_dir));
  if (!config.ok()) return Fail(kExitConfigError, config.status());
  if (absl::Status built_in = monsoon::common::CheckBuiltInModel(*config);
      !built_in.ok()) {
    return Fail(kExitConfigError, built_in);
  }
  const int rank = absl::GetFlag(FLAGS_rank);
  const int num_workers = absl::GetFlag(FLAGS_num_workers);
  if (absl::Status checked = CheckWorkerFlags(); !checked.ok()) {
    return Fail(kExitConfigError, checked);
  }
  auto servers = ServersFromFlag();
  if (!servers.ok()) return Fail(kExitConfigError, servers.status());
  if (config->model() == monsoon::SPARSE_LR) {
    return RunSparseLr(*config, *servers, *termination);
  }
  auto train =
      monsoon::worker::LoadDatasetFor(*config, monsoon::worker::Split::kTrain);
  if (!train.ok()) return Fail(kExitConfigError, train.status());
  auto backend = BackendFromFlags();
  if (!backend.ok()) return Fail(kExitConfigError, backend.status());
  const monsoon::common::ModelLayout layout =
      monsoon::common::ModelLayout::FromConfig(*config);
  auto model = monsoon::worker::Model::Create(backend->get(), layout,
                                              config->batch_size());
  if (!model.ok()) return Fail(kExitFailure, model.status());
  (*model)->set_weight_decay(config->weight_decay());

  int connect_error = kExitFailure;
  auto client = monsoon::worker::ConnectWithClientFlags(
      ClientOptions(*config, *servers, *termination), &connect_error);
  if (!client.ok() && config->elastic() &&
      absl::IsOutOfRange(client.status())) {
    // A worker started after an elastic run's data was all trained (a
    // Kubernetes Job's later index, a launcher's add as the run ends):
    // nothing to do, and a report of no steps, which a launcher reads from
    // every worker that exits 0.
    monsoon::common::Log("ps_worker: rank %d has nothing left to train: %s",
                         rank, client.status().message());
    WriteReport(rank, 0, monsoon::worker::WorkerResult(),
                monsoon::worker::WorkerCounters(),
                monsoon::worker::ReplicaLedger(), "done: nothing left to train",
                absl::InfinitePast());
    return kExitOk;
  }
  if (!client.ok()) return Fail(connect_error, client.status());
  monsoon::common::Log(
      "ps_worker: rank %d/%d, mode %s, device %s, %d training examples, %d "
      "parameters on %d shards",
      rank, num_workers, monsoon::common::ModeName(config->mode()),
      (*backend)->Name(), train->size, layout.num_params(), servers->size());

  WorkerContext context;
  context.registered = absl::Now();
  context.config = *config;
  context.rank = rank;
  context.num_workers = num_workers;
  context.train = &*train;
  context.model = model->get();
  context.client = client->get();
  if (absl::Status set = SetLoopFlags(*termination, &context); !set.ok()) {
    return Fail(kExitConfigError, set);
  }
  // An all-reduce worker never resumes (worker/allreduce_loop.cc): the
  // loop refuses shards that hold published weights.
  context.rendezvous = client->get();
  monsoon::worker::PlaceWorker(
      **client, *config,
      absl::GetFlag(FLAGS_resume) && config->mode() != monsoon::ALLREDUCE,
      &context);
  if (context.resume_steps > 0) {
    if (std::optional<int> code =
            ExitIfNothingLeft(**client, context, train->size)) {
      return *code;
    }
  }
  monsoon::worker::WorkerResult progress;
  context.progress = &progress;
  monsoon::worker::WorkerCounters counters;
  context.counters = &counters;
  // After the client and the counters: stops serving before they go.
  auto metrics = StartMetrics(context);
  if (!metrics.ok()) return Fail(kExitConfigError, metrics.status());
  auto result = monsoon::worker::MakeTrainingLoop(config->mode())->Run(context);
  return Finish(result, *termination, **client, context, *metrics != nullptr);
}
