// compare_modes: trains the same model on the same data in several modes,
// one local cluster after another, and writes results.json, summary.md and
// plots into --out_dir; the summary table is printed at the end.
#include <signal.h>
#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/daemon.h"
#include "common/log.h"
#include "common/model_config.h"
#include "tools/chaos.h"
#include "tools/comparison.h"
#include "tools/config_flags.h"
#include "tools/emulated_network.h"
#include "tools/local_cluster.h"
#include "tools/process_supervisor.h"
#include "worker/dataset.h"

constexpr char kDefaultModes[] = "sync,downpour,easgd,hogwild,onebit,allreduce";
ABSL_FLAG(std::string, modes, kDefaultModes,
          "Comma-separated modes to compare, run in this order (with "
          "--worker_cmd, allreduce is left out: scripts do not join the "
          "ring).");
ABSL_FLAG(std::string, variants, "",
          "Instead of --modes: configurations to compare, separated by ';', "
          "each a mode and config fields set on top, e.g. "
          "'sync;sync+backup_workers=1;downpour;downpour+max_staleness=4'. "
          "Runs and plot legends are named by them.");
ABSL_FLAG(std::string, model, "",
          "Comma-separated model presets to compare the modes on, e.g. "
          "mlp,lenet, or sparse_lr on libsvm data (README \"Sparse "
          "models\"): every configuration runs once per model, named after "
          "it (lenet-downpour-s2-w2). Empty: the config's model (the MLP by "
          "default).");
ABSL_FLAG(std::string, seeds, "",
          "Comma-separated seeds: every configuration runs once per seed "
          "(named ...-seedN), and the summary adds each one's medians over "
          "seeds with their spread. Empty: the config's seed, once.");
ABSL_FLAG(std::string, straggler, "",
          "Stragglers in every run: RANK:FACTOR[,RANK:FACTOR], worker RANK's "
          "steps taking FACTOR times as long (it waits FACTOR-1 times its "
          "measured compute time after each step; ps_worker --slowdown).");
ABSL_FLAG(std::string, link_worker, "",
          "With --link: RANK:RATE[,RANK:RATE], worker RANK's link shaped to "
          "RATE instead (e.g. 1:20mbit; the delay stays --link's).");
ABSL_FLAG(std::string, servers, "2",
          "Shard counts: one value, or a "
          "comma-separated sweep such as 1,2.");
ABSL_FLAG(std::string, workers, "2",
          "Worker counts: one value, or a "
          "comma-separated sweep such as 1,2,4 (adds a samples/s plot). With "
          "--elastic also one MIN:MAX: start MIN, every daemon's "
          "--num_workers MAX (room for MAX - MIN to join).");
ABSL_FLAG(double, time_limit_s, 0,
          "Wall-clock budget per run in seconds "
          "(0: train the config's epochs).");
ABSL_FLAG(double, target, 0.85,
          "Test accuracy for the time-to-target "
          "column.");
ABSL_FLAG(std::string, out_dir, "/tmp/monsoon-compare",
          "Where results.json, "
          "summary.md, the plots, runs/ and logs/ go (created).");
ABSL_FLAG(std::string, link, "",
          "Emulated network: RATE[,DELAY], e.g. "
          "100mbit,2ms. Every server and worker then runs on its own network "
          "namespace with a shaped link (needs root or CAP_NET_ADMIN). The "
          "delay needs the kernel's netem qdisc; without it only the rate is "
          "shaped, and the results say so.");
ABSL_FLAG(double, eval_interval_s, 0.5,
          "Seconds between evaluations: the resolution of time to target "
          "(a 3-epoch run of the default model takes a few seconds here).");
ABSL_FLAG(bool, restart_failed, true,
          "Start a server or worker that dies during a run again (a worker's "
          "first restart after 0.1 s; then, and a server's, after 1 s, "
          "doubling per restart); the servers then checkpoint every 2 s. "
          "--norestart_failed: the first death ends the comparison.");
ABSL_FLAG(int, max_restarts, 3,
          "With --restart_failed, how often each process of a run may be "
          "restarted before the run fails.");
ABSL_FLAG(int, replicas, 0,
          "1: every server's range gets a live backup in the next server "
          "(ps_server --replicas), which takes the range over when the server "
          "dies: a killed server loses no acknowledged update; restarted, it "
          "copies its ranges back and is their backup. Every mode but "
          "allreduce, every option but elastic runs (sparse tables too); 0: "
          "none, a dead server restarts from its checkpoint. "
          "With --link the updates forwarded to a backup cross the shaped "
          "links as pushes do (a delay then needs the kernel's netem).");
ABSL_FLAG(bool, unix_sockets, false,
          "The servers listen on Unix domain sockets (ps_server "
          "--listen=unix:PATH) in a fresh folder under $TMPDIR, and every "
          "process reaches them there: messages between processes of this "
          "machine skip the TCP stack (a push-pull of 4 MiB in 0.7x the "
          "time; socket buffers up to net.core.wmem_max). Not with --link; "
          "allreduce's ring stays on TCP.");
ABSL_FLAG(std::string, chaos, "",
          "Faults injected into every run, their times from the start of its "
          "training (a shard's first push; in mode allreduce, the workers' "
          "start): "
          "comma-separated kill:TARGET@TIME (SIGKILL) or "
          "stop:TARGET@TIME+DURATION (SIGSTOP, then SIGCONT), TARGET serverN "
          "or workerN, e.g. kill:server1@3s,stop:server0@1s+2s; with "
          "--elastic also add:worker@TIME and remove:workerN@TIME. The table "
          "then counts the faults and restarts of each run, and the "
          "accuracy plot marks them.");
ABSL_FLAG(std::string, tls_dir, "",
          "Mutual TLS for every connection of every run, with the "
          "certificates in this folder (tools/make_certs.sh DIR). Not with "
          "--link (the certificates name 127.0.0.1).");
ABSL_FLAG(bool, tls, false,
          "Mutual TLS for every connection of every run, with a throwaway CA "
          "and certificates made in OUT_DIR/tls (openssl, through "
          "tools/make_certs.sh); --tls_dir uses certificates of your own. "
          "Not with --link.");
ABSL_FLAG(std::string, device, "cpu",
          "The workers' and evaluator's compute backend: cpu (OpenBLAS), "
          "cuda (GPU 0), cuda:N, or auto (GPU 0 where there is a usable one, "
          "else the CPU). A GPU needs binaries built with "
          "bazel build --config=cuda; several workers share one GPU.");
ABSL_FLAG(std::string, worker_cmd, "",
          "Run this command (by /bin/sh) as each worker, and as the "
          "evaluator, instead of the C++ daemons: a PyTorch script using "
          "monsoon.torch ('python3 train.py'); every mode then trains the "
          "script's model (launch_local --help says more).");
ABSL_FLAG(std::string, evaluator_cmd, "",
          "With --worker_cmd: the evaluator's command (default the same).");
ABSL_FLAG(std::string, bin_dir, "",
          "Folder holding server/ps_server and "
          "worker/ps_{worker,evaluator} (default: beside this binary).");
ABSL_FLAG(std::string, report_script, "",
          "compare_report.py (default: "
          "found in this binary's runfiles).");
ABSL_FLAG(std::string, python, "/usr/bin/python3",
          "Python with matplotlib "
          "(Debian's python3-matplotlib) for the report.");

namespace {

using monsoon::common::kExitConfigError;
using monsoon::common::kExitFailure;
using monsoon::common::kExitOk;
using monsoon::tools::ComparisonOptions;

int Fail(int code, const absl::Status& status) {
  return monsoon::common::Fail("compare", code, status);
}

bool Exists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0;
}

// Exit status of argv, run with this process's output (127 if it cannot
// be started).
int RunAndWait(const std::vector<std::string>& argv) {
  absl::StatusOr<int> code = monsoon::tools::RunCommand(argv);
  return code.ok() ? *code : 127;
}

absl::StatusOr<std::vector<int>> Counts(const char* flag,
                                        const std::string& value) {
  auto counts = monsoon::common::ParseIntList(value);
  if (!counts.ok() || counts->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, "='", value, "': give positive counts such as 2 or 1,2,4"));
  }
  return counts;
}

// --modes, --variants, --model and --seeds into `options`.
absl::Status SetConfigurationsFromFlags(ComparisonOptions* options) {
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_modes), ',', absl::SkipEmpty())) {
    auto mode = monsoon::common::ParseMode(name);
    if (!mode.ok()) return mode.status();
    options->modes.push_back(*mode);
  }
  if (options->modes.empty()) {
    return absl::InvalidArgumentError("--modes is empty");
  }
  if (const std::string variants = absl::GetFlag(FLAGS_variants);
      !variants.empty()) {
    auto parsed = monsoon::tools::ParseVariants(variants);
    if (!parsed.ok()) return parsed.status();
    options->variants = *std::move(parsed);
    options->modes.clear();
    for (const auto& variant : options->variants) {
      options->modes.push_back(variant.mode);
    }
  }
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_model), ',', absl::SkipEmpty())) {
    auto model = monsoon::common::ParseModel(name);
    if (!model.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model: ", model.status().message()));
    }
    options->models.push_back(*model);
  }
  for (absl::string_view text :
       absl::StrSplit(absl::GetFlag(FLAGS_seeds), ',', absl::SkipEmpty())) {
    uint64_t seed = 0;
    if (!absl::SimpleAtoi(text, &seed)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--seeds: '", text, "' is not a non-negative integer"));
    }
    options->seeds.push_back(seed);
  }
  return absl::OkStatus();
}

// --straggler, --servers and --workers into `options`.
absl::Status SetSweepFromFlags(ComparisonOptions* options) {
  auto stragglers =
      monsoon::tools::ParseStragglers(absl::GetFlag(FLAGS_straggler));
  if (!stragglers.ok()) return stragglers.status();
  options->stragglers = *std::move(stragglers);
  auto servers = Counts("servers", absl::GetFlag(FLAGS_servers));
  if (!servers.ok()) return servers.status();
  options->servers = *servers;
  const std::string workers_flag = absl::GetFlag(FLAGS_workers);
  if (absl::StrContains(workers_flag, ':')) {
    if (absl::StrContains(workers_flag, ',')) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--workers='", workers_flag,
          "': MIN:MAX is one run's count, not part of a sweep"));
    }
    auto count = monsoon::tools::ParseWorkerCount(
        workers_flag, monsoon::tools::ElasticFromFlags());
    if (!count.ok()) return count.status();
    options->workers = {count->start};
    options->max_workers = count->max;
    return absl::OkStatus();
  }
  auto workers = Counts("workers", workers_flag);
  if (!workers.ok()) return workers.status();
  options->workers = *workers;
  return absl::OkStatus();
}

// The models every configuration runs on (the config's, when --model
// names none).
std::vector<monsoon::Model> ModelsToRun(const ComparisonOptions& options) {
  std::vector<monsoon::Model> models = options.models;
  if (models.empty()) models.push_back(monsoon::MODEL_AUTO);
  return models;
}

// Every mode's and variant's config must resolve, on every model, and the
// stragglers and the data must be there, before anything starts.
absl::Status CheckEveryRun(const ComparisonOptions& options) {
  for (monsoon::Model model : ModelsToRun(options)) {
    for (monsoon::Mode mode : options.modes) {
      auto config = options.config_for(mode, model);
      if (!config.ok()) return config.status();
      if (auto s = monsoon::worker::CheckDataFilesFor(*config); !s.ok()) {
        return s;
      }
    }
    for (const auto& variant : options.variants) {
      auto base = options.config_for(variant.mode, model);
      if (!base.ok()) return base.status();
      auto config = monsoon::tools::ApplyVariant(variant, *base);
      if (!config.ok()) return config.status();
    }
  }
  for (int w : options.workers) {
    for (const auto& [rank, factor] : options.stragglers) {
      if (rank >= w) {
        return absl::InvalidArgumentError(
            absl::StrCat("--straggler rank ", rank, " but a run of ", w,
                         " workers has ranks 0 to ", w - 1));
      }
    }
  }
  return absl::OkStatus();
}

// --link and --link_worker into `options`; FAILED_PRECONDITION (from
// CheckNetworkPrivileges) without the privileges an emulated network needs.
absl::Status SetLinkFromFlags(ComparisonOptions* options) {
  if (absl::GetFlag(FLAGS_link).empty()) {
    if (!absl::GetFlag(FLAGS_link_worker).empty()) {
      return absl::InvalidArgumentError(
          "--link_worker shapes a worker's emulated link: give --link too");
    }
    return absl::OkStatus();
  }
  auto link = monsoon::tools::ParseLink(absl::GetFlag(FLAGS_link));
  if (!link.ok()) return link.status();
  if (absl::GetFlag(FLAGS_unix_sockets)) {
    return absl::InvalidArgumentError(
        "--unix_sockets with --link: the emulated hosts reach each other "
        "over TCP; leave one of them off");
  }
  if (auto s = monsoon::tools::CheckNetworkPrivileges(); !s.ok()) return s;
  options->link = *link;
  auto rates =
      monsoon::tools::ParseWorkerRates(absl::GetFlag(FLAGS_link_worker));
  if (!rates.ok()) return rates.status();
  options->worker_rates = *std::move(rates);
  for (int w : options->workers) {
    for (const auto& [rank, rate] : options->worker_rates) {
      if (rank >= w) {
        return absl::InvalidArgumentError(
            absl::StrCat("--link_worker rank ", rank, " but a run of ", w,
                         " workers has ranks 0 to ", w - 1));
      }
    }
  }
  return absl::OkStatus();
}

// --restart_failed, --max_restarts, --chaos, --tls and --tls_dir into
// `options` (--tls: its certificates are made once --out_dir exists).
absl::Status SetFaultsAndTlsFromFlags(ComparisonOptions* options) {
  const int max_restarts = absl::GetFlag(FLAGS_max_restarts);
  if (max_restarts < 0 || max_restarts > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_restarts must be in [0, 100], got ", max_restarts));
  }
  options->max_restarts =
      absl::GetFlag(FLAGS_restart_failed) ? max_restarts : 0;
  options->chaos = absl::GetFlag(FLAGS_chaos);
  options->replicas = absl::GetFlag(FLAGS_replicas);
  options->unix_sockets = absl::GetFlag(FLAGS_unix_sockets);
  if (options->replicas < 0 || options->replicas > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--replicas must be 0 or 1, got ", options->replicas));
  }
  options->tls_dir = absl::GetFlag(FLAGS_tls_dir);
  const bool make_tls = absl::GetFlag(FLAGS_tls);
  if (make_tls && !options->tls_dir.empty()) {
    return absl::InvalidArgumentError(
        "--tls makes certificates, --tls_dir takes yours: give one of them");
  }
  if ((make_tls || !options->tls_dir.empty()) && options->link.has_value()) {
    return absl::InvalidArgumentError(
        "--tls_dir with --link: the emulated hosts' addresses are not in the "
        "certificates; use one or the other");
  }
  for (int s : options->servers) {
    for (int w : options->workers) {
      auto faults = monsoon::tools::ParseChaos(
          options->chaos, s, w, monsoon::tools::ElasticFromFlags());
      if (!faults.ok()) return faults.status();
      auto ranks = monsoon::tools::RanksFor(
          *faults, monsoon::tools::WorkerCount{w, options->max_workers});
      if (!ranks.ok()) return ranks.status();
    }
  }
  return absl::OkStatus();
}

// --report_script, or the one in this binary's runfiles; NOT_FOUND when it
// is not there.
absl::StatusOr<std::string> ReportScript() {
  std::string script = absl::GetFlag(FLAGS_report_script);
  if (script.empty())
    script = monsoon::tools::ExecutablePath() +
             ".runfiles/monsoon/tools/compare_report.py";
  if (!Exists(script)) {
    return absl::NotFoundError(absl::StrCat(
        "report script '", script, "' not found: pass --report_script"));
  }
  return script;
}

// Scripts (--worker_cmd) train in every mode but allreduce: the default
// --modes leaves it out, saying so; a mode named on the command line that
// scripts cannot run is refused before anything starts.
absl::Status LeaveOutModesScriptsCannotRun(ComparisonOptions* options) {
  if (options->worker_cmd.empty()) return absl::OkStatus();
  const bool default_modes = options->variants.empty() &&
                             absl::GetFlag(FLAGS_modes) == kDefaultModes;
  std::vector<monsoon::Mode> kept;
  for (monsoon::Mode mode : options->modes) {
    absl::Status open = monsoon::common::CheckScriptMode(mode);
    if (open.ok()) {
      kept.push_back(mode);
    } else if (default_modes) {
      monsoon::common::Log("compare: %s left out: %s",
                           monsoon::common::ModeName(mode), open.message());
    } else {
      return absl::Status(
          open.code(),
          absl::StrCat("--worker_cmd: ", open.message(), "; leave ",
                       monsoon::common::ModeName(mode), " out of --",
                       options->variants.empty() ? "modes" : "variants"));
    }
  }
  options->modes = std::move(kept);
  return absl::OkStatus();
}

// Every check and setting from the flags, in the order the checks run.
absl::Status SetOptionsFromFlags(ComparisonOptions* options) {
  if (auto s = SetConfigurationsFromFlags(options); !s.ok()) return s;
  if (auto s = SetSweepFromFlags(options); !s.ok()) return s;
  options->config_for = [](monsoon::Mode mode, monsoon::Model model) {
    return monsoon::tools::ConfigFromFlags(mode, model);
  };
  if (auto s = CheckEveryRun(*options); !s.ok()) return s;
  if (auto s = SetLinkFromFlags(options); !s.ok()) return s;
  if (auto s = SetFaultsAndTlsFromFlags(options); !s.ok()) return s;
  options->time_limit_s = absl::GetFlag(FLAGS_time_limit_s);
  options->target_accuracy = absl::GetFlag(FLAGS_target);
  options->eval_interval_s = absl::GetFlag(FLAGS_eval_interval_s);
  if (auto s = monsoon::tools::CheckRunSeconds(options->eval_interval_s,
                                               options->time_limit_s);
      !s.ok()) {
    return s;
  }
  options->bin_dir = absl::GetFlag(FLAGS_bin_dir).empty()
                         ? monsoon::tools::DefaultBinDir()
                         : absl::GetFlag(FLAGS_bin_dir);
  options->device = absl::GetFlag(FLAGS_device);
  options->worker_cmd = absl::GetFlag(FLAGS_worker_cmd);
  options->evaluator_cmd = absl::GetFlag(FLAGS_evaluator_cmd);
  if (options->worker_cmd.empty() && !options->evaluator_cmd.empty()) {
    return absl::InvalidArgumentError(
        "--evaluator_cmd is for a comparison of --worker_cmd scripts; give "
        "--worker_cmd too");
  }
  if (auto s = LeaveOutModesScriptsCannotRun(options); !s.ok()) return s;
  return monsoon::tools::CheckDeviceName(options->device);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Compares Monsoon's update modes on the same model, data and hardware.\n"
      "\n  compare_modes --modes=downpour,onebit --workers=1,2,4 "
      "--out_dir=/tmp/cmp\n  compare_modes --model=mlp,lenet "
      "--out_dir=/tmp/cmp\n  compare_modes --modes=downpour,onebit "
      "--link=100mbit,2ms --out_dir=/tmp/cmp\n\n"
      "Writes results.json (every run's metrics and config), summary.md (the "
      "table printed at the end), accuracy_vs_time.png, "
      "accuracy_vs_bytes_pushed.png, loss_vs_samples.png, "
      "staleness_distribution.png, step_time_by_phase.png and, for worker "
      "sweeps, samples_per_s_vs_workers.png. Exit codes: 0 done, 2 bad flags "
      "or missing privileges, 130 interrupted, 1 a run failed.");
  // Before any thread: the supervisor takes over SIGINT, SIGTERM, SIGCHLD.
  monsoon::tools::ProcessSupervisor supervisor;
  monsoon::tools::ShowConfigFlagsInHelp("tools/compare_modes_main.cc");
  absl::ParseCommandLine(argc, argv);

  ComparisonOptions options;
  if (absl::Status set = SetOptionsFromFlags(&options); !set.ok()) {
    return Fail(kExitConfigError, set);
  }
  const absl::StatusOr<std::string> script = ReportScript();
  if (!script.ok()) return Fail(kExitConfigError, script.status());
  options.out_dir = absl::GetFlag(FLAGS_out_dir);
  if (RunAndWait({"/bin/mkdir", "-p", options.out_dir}) != 0) {
    return Fail(kExitConfigError,
                absl::InvalidArgumentError("cannot create --out_dir " +
                                           options.out_dir));
  }
  if (absl::GetFlag(FLAGS_tls)) {
    options.tls_dir = options.out_dir + "/tls";
    if (absl::Status made = monsoon::tools::MakeThrowawayCerts(options.tls_dir);
        !made.ok()) {
      return Fail(kExitFailure, made);
    }
  }
  monsoon::common::Log(
      "compare: %d models x %d modes x %d server counts x %d worker "
      "counts%s; results in %s",
      ModelsToRun(options).size(), options.modes.size(), options.servers.size(),
      options.workers.size(),
      options.link.has_value() ? ", link " + options.link->text : "",
      options.out_dir);

  auto result = monsoon::tools::RunComparison(options, &supervisor);
  if (!result.ok()) {
    const bool interrupted =
        result.status().code() == absl::StatusCode::kCancelled;
    supervisor.StopAll(absl::Seconds(5));
    return Fail(
        interrupted ? monsoon::common::ExitCodeForSignal(SIGINT) : kExitFailure,
        result.status());
  }
  const int report =
      RunAndWait({absl::GetFlag(FLAGS_python), *script, "--results",
                  result->results_path, "--out_dir", options.out_dir});
  if (report != 0) {
    return Fail(kExitFailure, absl::InternalError(absl::StrCat(
                                  "the report script failed (exit ", report,
                                  "); results are in ", result->results_path)));
  }
  std::vector<std::string> failed;
  for (const monsoon::tools::ComparedRun& run : result->runs) {
    if (!run.failure.empty()) failed.push_back(run.name);
  }
  if (!failed.empty()) {
    return Fail(kExitFailure,
                absl::InternalError(absl::StrCat(
                    failed.size(), " of ", result->runs.size(),
                    " runs failed (", absl::StrJoin(failed, ", "),
                    "); the others' results are in ", result->results_path,
                    ", each failure in summary.md and its log")));
  }
  return kExitOk;
}
