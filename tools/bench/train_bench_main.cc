// train_bench: end-to-end training throughput of Monsoon's modes against
// PyTorch on the same model, data, batch, epochs and cores, measured in the
// same sitting, run after run in turn.
//
// Each Monsoon run is a local cluster (the launcher's code: S shards, W
// workers, the evaluator idle until the end); its samples/s counts the
// examples trained from the first step to the last. Each reference is
// tools/bench/torch_reference.py with Debian's python3-torch, one thread
// per process:
//   sync with 1 worker   PyTorch in one process (the same single core);
//   sync and allreduce with W workers
//                        DistributedDataParallel (gloo), W processes;
//   the other modes      a torch.distributed.rpc parameter server with W
//                        trainers, one push-and-pull RPC per step.
// Where torch is missing, the references are skipped, and the table says so.
//
// --worker=torch runs each case with PyTorch workers instead of ps_worker:
// torch_reference.py --mode=monsoon (the reference's own model and loop,
// through the monsoon package) as every worker, so that a PyTorch model
// through Monsoon is held against DDP and the RPC parameter server on the
// same model, data, batch and cores. Each row also gives a step's compute
// and exchange (push, pull) in ms, from the workers' reports: the torch
// worker's exchange less ps_worker's is the Python side's cost.
//
//   bazel build //tools/bench:train_bench
//   bazel-bin/tools/bench/train_bench                     # the table
//   bazel-bin/tools/bench/train_bench --modes=sync --workers=1,2 --json
//   bazel-bin/tools/bench/train_bench --worker=cpp,torch --modes=sync,downpour
//
// Exit codes: 0 after a report, 2 for a bad flag, 1 for any other failure,
// 130 on Ctrl-C.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/log.h"
#include "common/model_config.h"
#include "common/temp_dir.h"
#include "tools/bench/bench_util.h"
#include "tools/local_cluster.h"
#include "tools/process_supervisor.h"

ABSL_FLAG(std::string, modes, "sync,downpour,hogwild",
          "Monsoon modes to run, comma-separated.");
ABSL_FLAG(std::string, model, "mlp",
          "Model presets, comma-separated (mlp, lenet); every case runs on "
          "each, and so does its PyTorch reference.");
ABSL_FLAG(std::string, workers, "2",
          "Worker counts, comma-separated; each mode runs with each (sync "
          "with 1 worker compares with PyTorch in one process).");
ABSL_FLAG(int, servers, 1, "Parameter-server shards.");
ABSL_FLAG(int, epochs, 3, "Passes over each worker's partition.");
ABSL_FLAG(int, batch_size, 64, "Examples per worker step.");
ABSL_FLAG(int, repeats, 3, "Runs of each case and of each reference.");
ABSL_FLAG(std::string, python, "/usr/bin/python3",
          "Python with PyTorch, for the reference.");
ABSL_FLAG(std::string, torch_script, "",
          "tools/bench/torch_reference.py (default: found beside this "
          "binary, or under the current folder).");
ABSL_FLAG(bool, reference, true,
          "Run the PyTorch references (--noreference: Monsoon only).");
ABSL_FLAG(std::string, bin_dir, "",
          "Folder holding server/ps_server and worker/ps_{worker,evaluator} "
          "(default: found beside this binary).");
ABSL_FLAG(bool, json, false, "Print one JSON object per case.");
ABSL_FLAG(bool, unix_sockets, false,
          "Monsoon's workers reach the shards over Unix domain sockets "
          "(launch_local --unix_sockets) rather than TCP on loopback. The "
          "references are as they are: DDP's gloo over TCP, the RPC parameter "
          "server over the transport and channel TensorPipe chooses.");
ABSL_FLAG(std::string, config_text, "",
          "Text-format TrainingConfig fields for every Monsoon run, set before "
          "the flags above (which win) and resolution, e.g. "
          "'push_after_backward: true' to measure a setting against its "
          "default in one sitting. The PyTorch references do not see them.");
ABSL_FLAG(std::string, worker, "cpp",
          "Comma-separated kinds of Monsoon worker: cpp (ps_worker), torch "
          "(tools/bench/torch_reference.py --mode=monsoon, PyTorch's model "
          "through the monsoon package, which ./tools/setup.sh installs for "
          "--python).");

namespace monsoon::tools {
namespace {

constexpr int kUsageError = 2;

// The PyTorch run that a Monsoon case is held against.
struct Reference {
  std::string mode;  // torch_reference.py --mode
  int workers = 1;
  std::string model;  // torch_reference.py --model
  std::string name() const {
    return absl::StrCat(model, "-", mode, "-w", workers);
  }
};

Reference ReferenceFor(Mode mode, int workers, Model model) {
  const std::string name = common::ModelName(model);
  if (mode == SYNC || mode == ALLREDUCE) {
    return {workers == 1 ? "single" : "ddp", workers, name};
  }
  return {"rpc_ps", workers, name};
}

// bazel-bin/tools/bench/train_bench -> bazel-bin.
std::string BinDirBesideThis() {
  const std::string exe = ExecutablePath();
  const std::string suffix = "/tools/bench/train_bench";
  if (exe.size() > suffix.size() &&
      exe.compare(exe.size() - suffix.size(), suffix.size(), suffix) == 0) {
    return exe.substr(0, exe.size() - suffix.size());
  }
  return ".";
}

std::string FindTorchScript() {
  const std::string flag = absl::GetFlag(FLAGS_torch_script);
  if (!flag.empty()) return flag;
  for (const std::string& path :
       {ExecutablePath() + ".runfiles/monsoon/tools/bench/torch_reference.py",
        std::string("tools/bench/torch_reference.py")}) {
    if (access(path.c_str(), R_OK) == 0) return path;
  }
  return "";
}

// The number after "key": in a one-line JSON object.
absl::StatusOr<double> JsonNumber(const std::string& json,
                                  const std::string& key) {
  const std::string needle = absl::StrCat("\"", key, "\":");
  const size_t at = json.find(needle);
  double value = 0;
  if (at == std::string::npos) {
    return absl::NotFoundError(absl::StrCat("no ", key));
  }
  size_t end = json.find_first_of(",}", at);
  std::string text = json.substr(at + needle.size(), end - at - needle.size());
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(text), &value)) {
    return absl::InvalidArgumentError(absl::StrCat("bad ", key));
  }
  return value;
}

// One reference run's samples/s; UNAVAILABLE when torch is not installed.
absl::StatusOr<double> RunReference(const std::string& script,
                                    const Reference& reference) {
  const std::vector<std::string> argv = {
      absl::GetFlag(FLAGS_python),
      script,
      "--mode=" + reference.mode,
      "--model=" + reference.model,
      absl::StrCat("--workers=", reference.workers),
      absl::StrCat("--epochs=", absl::GetFlag(FLAGS_epochs)),
      absl::StrCat("--batch_size=", absl::GetFlag(FLAGS_batch_size)),
      "--threads=1",
      "--json"};
  std::string output;
  absl::StatusOr<int> code = RunCommand(argv, &output);
  if (!code.ok()) return code.status();
  if (*code == 3) {
    return absl::UnavailableError(
        "PyTorch is not installed (Debian: apt-get install python3-torch)");
  }
  if (*code != 0) {
    return absl::InternalError(absl::StrCat("the PyTorch reference ",
                                            reference.name(), " exited with ",
                                            *code, ": ", output));
  }
  // The JSON object is the last line.
  const size_t line = output.rfind('{');
  if (line == std::string::npos) {
    return absl::InternalError("the PyTorch reference printed no JSON");
  }
  return JsonNumber(output.substr(line), "samples_per_s");
}

// One Monsoon run: samples/s, and a step's compute and exchange.
struct MonsoonRun {
  double samples_per_s = 0;
  double compute_ms = 0;   // per step, averaged over the workers' steps
  double exchange_ms = 0;  // push, pull and push-pull per step
};

// ps_worker, or PyTorch's model through the monsoon package.
enum class WorkerKind { kCpp, kTorch };

const char* WorkerKindName(WorkerKind kind) {
  return kind == WorkerKind::kCpp ? "cpp" : "torch";
}

absl::StatusOr<MonsoonRun> RunMonsoon(Mode mode, Model model, int workers,
                                      WorkerKind kind,
                                      const std::string& script,
                                      ProcessSupervisor* supervisor) {
  absl::StatusOr<TrainingConfig> extra =
      common::ParseConfigText(absl::GetFlag(FLAGS_config_text));
  if (!extra.ok()) return extra.status();
  TrainingConfig config = *std::move(extra);
  config.set_mode(mode);
  config.set_model(model);
  config.set_epochs(absl::GetFlag(FLAGS_epochs));
  config.set_batch_size(absl::GetFlag(FLAGS_batch_size));
  absl::StatusOr<TrainingConfig> resolved =
      common::ResolveConfigWithData(config);
  if (!resolved.ok()) return resolved.status();
  absl::StatusOr<std::string> made = common::MakeTempDir("monsoon-bench");
  if (!made.ok()) return made.status();
  const std::string dir = *made;
  LocalClusterOptions options;
  options.config = *resolved;
  options.servers = absl::GetFlag(FLAGS_servers);
  options.workers = workers;
  options.bin_dir = absl::GetFlag(FLAGS_bin_dir).empty()
                        ? BinDirBesideThis()
                        : absl::GetFlag(FLAGS_bin_dir);
  options.work_dir = dir;
  options.unix_sockets = absl::GetFlag(FLAGS_unix_sockets);
  // Idle until training ends, then one evaluation.
  options.eval_interval_s = 1e6;
  if (kind == WorkerKind::kTorch) {
    options.worker_cmd = absl::StrCat(
        absl::GetFlag(FLAGS_python), " ", script,
        " --mode=monsoon --threads=1 --model=", common::ModelName(model));
  }
  // The daemons' lines are kept, not printed: the last of them follow a
  // failure's error, which names the process, so that what they said
  // about it is there to read.
  constexpr size_t kLinesKept = 40;
  std::deque<std::string> last_lines;
  supervisor->set_line_sink([&](int id, const std::string& line) {
    last_lines.push_back(absl::StrCat("[", supervisor->role(id), "] ", line));
    if (last_lines.size() > kLinesKept) last_lines.pop_front();
  });
  absl::StatusOr<RunMetrics> metrics = RunLocalCluster(options, supervisor);
  supervisor->StopAll(absl::Seconds(5));
  supervisor->set_line_sink(nullptr);
  if (!metrics.ok()) {
    std::fprintf(stderr, "train_bench: the run's last %zu output lines:\n",
                 last_lines.size());
    for (const std::string& line : last_lines) {
      std::fprintf(stderr, "  %s\n", line.c_str());
    }
    std::fprintf(stderr, "train_bench: the run's files are kept in %s\n",
                 dir.c_str());
    return metrics.status();
  }
  // Its checkpoints and reports (tens of MB with the PyTorch worker's
  // layout) are of no use once read.
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  if (metrics->train_time_s <= 0) {
    return absl::InternalError("the run trained no steps");
  }
  MonsoonRun run;
  run.samples_per_s = metrics->trained_samples / metrics->train_time_s;
  const double steps = static_cast<double>(metrics->trained_samples) /
                       absl::GetFlag(FLAGS_batch_size);
  for (const auto& [phase, total] : metrics->step_phases) {
    double& into = phase == "compute" ? run.compute_ms : run.exchange_ms;
    into += 1e3 * total.seconds / steps;
  }
  return run;
}

int Fail(int code, const absl::Status& status) {
  std::fprintf(stderr, "train_bench: %s\n", status.ToString().c_str());
  return code;
}

int Main(ProcessSupervisor* supervisor) {
  if (absl::StatusOr<TrainingConfig> extra =
          common::ParseConfigText(absl::GetFlag(FLAGS_config_text));
      !extra.ok()) {
    return Fail(kUsageError,
                absl::InvalidArgumentError(absl::StrCat(
                    "--config_text: ", extra.status().message())));
  }
  std::vector<Mode> modes;
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_modes), ',', absl::SkipEmpty())) {
    absl::StatusOr<Mode> mode = common::ParseMode(name);
    if (!mode.ok()) return Fail(kUsageError, mode.status());
    modes.push_back(*mode);
  }
  std::vector<Model> models;
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_model), ',', absl::SkipEmpty())) {
    absl::StatusOr<Model> model = common::ParseModel(name);
    if (!model.ok()) return Fail(kUsageError, model.status());
    if (*model == SPARSE_LR) {
      return Fail(kUsageError,
                  absl::InvalidArgumentError(
                      "--models: train_bench measures the layer models, mlp "
                      "and lenet; compare sparse_lr with compare_modes"));
    }
    models.push_back(*model);
  }
  std::vector<int> worker_counts;
  for (absl::string_view text :
       absl::StrSplit(absl::GetFlag(FLAGS_workers), ',', absl::SkipEmpty())) {
    int workers = 0;
    if (!absl::SimpleAtoi(text, &workers) || workers < 1 || workers > 64) {
      return Fail(kUsageError, absl::InvalidArgumentError(
                                   "--workers takes counts from 1 to 64"));
    }
    worker_counts.push_back(workers);
  }
  const int repeats = absl::GetFlag(FLAGS_repeats);
  if (modes.empty() || models.empty() || worker_counts.empty() || repeats < 1 ||
      absl::GetFlag(FLAGS_servers) < 1 || absl::GetFlag(FLAGS_epochs) < 1) {
    return Fail(kUsageError,
                absl::InvalidArgumentError(
                    "give at least one mode and worker count, and positive "
                    "--repeats, --servers and --epochs"));
  }
  std::vector<WorkerKind> kinds;
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_worker), ',', absl::SkipEmpty())) {
    if (name != "cpp" && name != "torch") {
      return Fail(kUsageError,
                  absl::InvalidArgumentError(absl::StrCat(
                      "--worker takes cpp and torch, not '", name, "'")));
    }
    kinds.push_back(name == "cpp" ? WorkerKind::kCpp : WorkerKind::kTorch);
  }
  if (kinds.empty()) {
    return Fail(kUsageError,
                absl::InvalidArgumentError("--worker: give cpp, torch or both"));
  }
  const std::string script = FindTorchScript();
  const bool torch_workers =
      std::find(kinds.begin(), kinds.end(), WorkerKind::kTorch) != kinds.end();
  if (torch_workers && script.empty()) {
    return Fail(kUsageError,
                absl::NotFoundError("--worker=torch needs "
                                    "tools/bench/torch_reference.py (run from "
                                    "the repository, or --torch_script=PATH)"));
  }
  std::string no_reference;
  if (!absl::GetFlag(FLAGS_reference)) {
    no_reference = "--noreference";
  } else if (script.empty()) {
    no_reference =
        "tools/bench/torch_reference.py not found (--torch_script=PATH)";
  }

  // Runs in turn, repetition by repetition, so that drift hits every case.
  std::map<std::string, std::vector<double>> rates, compute_ms, exchange_ms,
      torch;
  auto case_name = [](Model model, Mode mode, int workers, WorkerKind kind) {
    return absl::StrCat(common::ModelName(model), "-", common::ModeName(mode),
                        "-s", absl::GetFlag(FLAGS_servers), "-w", workers,
                        kind == WorkerKind::kTorch ? "-torch" : "");
  };
  for (int rep = 0; rep < repeats; ++rep) {
    for (Model model : models)
      for (int workers : worker_counts) {
        std::map<std::string, bool> references_done;
        for (Mode mode : modes) {
          for (WorkerKind kind : kinds) {
            const std::string name = case_name(model, mode, workers, kind);
            common::Log("train_bench: run %d/%d: %s", rep + 1, repeats, name);
            absl::StatusOr<MonsoonRun> run =
                RunMonsoon(mode, model, workers, kind, script, supervisor);
            if (!run.ok()) {
              return Fail(
                  run.status().code() == absl::StatusCode::kCancelled ? 130 : 1,
                  absl::Status(run.status().code(),
                               absl::StrCat(name, ": ", run.status().message())));
            }
            rates[name].push_back(run->samples_per_s);
            compute_ms[name].push_back(run->compute_ms);
            exchange_ms[name].push_back(run->exchange_ms);
          }
          const Reference reference = ReferenceFor(mode, workers, model);
          if (!no_reference.empty() || references_done[reference.name()]) {
            continue;
          }
          references_done[reference.name()] = true;
          common::Log("train_bench: run %d/%d: torch %s", rep + 1, repeats,
                      reference.name());
          absl::StatusOr<double> ref = RunReference(script, reference);
          if (ref.status().code() == absl::StatusCode::kUnavailable) {
            no_reference = std::string(ref.status().message());
            continue;
          }
          if (!ref.ok()) return Fail(1, ref.status());
          torch[reference.name()].push_back(*ref);
        }
      }
  }

  const bool json = absl::GetFlag(FLAGS_json);
  if (!json) {
    std::printf(
        "\n%d epochs, batch %d per worker, %d shard(s); medians of %d; a "
        "step's compute and exchange (push, pull) in ms, from the workers' "
        "reports\n",
        absl::GetFlag(FLAGS_epochs), absl::GetFlag(FLAGS_batch_size),
        absl::GetFlag(FLAGS_servers), repeats);
    if (!no_reference.empty()) {
      std::printf("no PyTorch reference: %s\n", no_reference.c_str());
    }
    std::printf("%-30s %10s %8s %9s  %-18s %10s %7s\n", "monsoon run",
                "samples/s", "compute", "exchange", "pytorch", "samples/s",
                "ratio");
  }
  for (Model model : models)
    for (int workers : worker_counts) {
      for (Mode mode : modes) {
        for (WorkerKind kind : kinds) {
          const std::string name = case_name(model, mode, workers, kind);
          const Reference reference = ReferenceFor(mode, workers, model);
          const Summary ours = Summarize(rates[name]);
          const double compute = Summarize(compute_ms[name]).p50;
          const double exchange = Summarize(exchange_ms[name]).p50;
          const Summary ref = Summarize(torch[reference.name()]);
          const bool have_ref = ref.count > 0;
          if (json) {
            JsonLine line;
            line.Add("case", name)
                .Add("mode", common::ModeName(mode))
                .Add("model", common::ModelName(model))
                .Add("worker", WorkerKindName(kind))
                .Add("servers", absl::GetFlag(FLAGS_servers))
                .Add("workers", workers)
                .Add("repeats", repeats)
                .Add("samples_per_s", ours.p50)
                .Add("compute_ms_per_step", compute)
                .Add("exchange_ms_per_step", exchange)
                .Add("reference", reference.name())
                .Add("reference_samples_per_s", have_ref ? ref.p50 : 0.0)
                .Add("ratio", have_ref ? ours.p50 / ref.p50 : 0.0)
                .Add("runs", absl::StrJoin(rates[name], " "))
                .Add("reference_runs",
                     absl::StrJoin(torch[reference.name()], " "));
            std::printf("%s\n", line.str().c_str());
          } else {
            std::printf(
                "%-30s %10.0f %8.2f %9.2f  %-18s %10s %7s\n", name.c_str(),
                ours.p50, compute, exchange, reference.name().c_str(),
                have_ref ? absl::StrFormat("%.0f", ref.p50).c_str() : "-",
                have_ref ? absl::StrFormat("%.2fx", ours.p50 / ref.p50).c_str()
                         : "-");
          }
        }
      }
    }
  return 0;
}

}  // namespace
}  // namespace monsoon::tools

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times Monsoon's modes end to end against PyTorch on the same model, "
      "data, batch, epochs and cores (medians of runs in turn).\n\n"
      "  train_bench\n  train_bench --modes=sync --workers=1,2 --repeats=5\n"
      "  train_bench --model=mlp,lenet\n"
      "  train_bench --worker=cpp,torch   # PyTorch workers through Monsoon "
      "too");
  // Before any thread: the supervisor takes over SIGINT, SIGTERM, SIGCHLD.
  monsoon::tools::ProcessSupervisor supervisor;
  absl::ParseCommandLine(argc, argv);
  return monsoon::tools::Main(&supervisor);
}
