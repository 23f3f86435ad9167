#include "tools/comparison.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "common/model_config.h"
#include "tools/local_cluster.h"

namespace monsoon::tools {
namespace {

// One status line for a run, from the figures RunLocalCluster reads from
// its daemons (RunProgressSample): rewritten in place on a terminal, a
// plain line every 10 s otherwise. The rate is the examples the shards
// applied between the last two Stats answers, about a second apart, so
// that it moves from the first seconds on and at the same pace whatever
// --eval_interval_s is. The daemons' log lines only go to the run's log.
class RunProgress {
 public:
  RunProgress(std::string name, int epochs, std::FILE* log)
      : name_(std::move(name)),
        epochs_(epochs),
        log_(log),
        terminal_(isatty(STDOUT_FILENO) != 0),
        start_(absl::Now()),
        last_print_(start_) {}

  void Line(const std::string& role, const std::string& line) {
    std::fprintf(log_, "[%s] %s\n", role.c_str(), line.c_str());
  }

  void Sample(const RunProgressSample& sample) {
    epoch_ = sample.epoch;
    rate_ = sample.samples_per_s;
    if (sample.evaluated) {
      accuracy_ = absl::StrFormat("%.4f%s (at %.1f s)", sample.test_accuracy,
                                  Auc(sample.test_auc), sample.eval_time_s);
    }
    Show(false);
  }

  void Show(bool final_line) {
    const absl::Time now = absl::Now();
    if (!final_line) {
      if (terminal_ && now - last_print_ < absl::Milliseconds(250)) return;
      if (!terminal_ && now - last_print_ < absl::Seconds(10)) return;
    }
    last_print_ = now;
    const std::string text = absl::StrFormat(
        "%-22s epoch %s/%d  %6.0f samples/s  test accuracy %-6s  %5.1f s",
        name_, epoch_ > 0 ? absl::StrCat(epoch_) : "-", epochs_, rate_,
        accuracy_, absl::ToDoubleSeconds(now - start_));
    if (terminal_) {
      std::printf("\r\033[K%s%s", text.c_str(), final_line ? "\n" : "");
    } else {
      std::printf("%s\n", text.c_str());
    }
    std::fflush(stdout);
  }

  // The final line: the run's own samples/s (RunMetrics). A run stopped by
  // the time limit keeps the epoch it was in.
  void Done(double accuracy, double auc, double samples_per_s,
            bool stopped_early) {
    accuracy_ = absl::StrFormat("%.4f%s", accuracy, Auc(auc));
    rate_ = samples_per_s;
    if (!stopped_early) epoch_ = epochs_;
    Show(true);
  }

 private:
  // ", AUC 0.7512" for a click model's curve, else nothing.
  static std::string Auc(double auc) {
    return auc > 0 ? absl::StrFormat(", AUC %.4f", auc) : "";
  }

  const std::string name_;
  const int epochs_;
  std::FILE* const log_;
  const bool terminal_;
  const absl::Time start_;
  absl::Time last_print_;
  int epoch_ = 0;  // 0: not known (yet)
  std::string accuracy_ = "-";
  double rate_ = 0;
};

}  // namespace

absl::StatusOr<std::vector<Variant>> ParseVariants(absl::string_view text) {
  std::vector<Variant> variants;
  for (absl::string_view spec :
       absl::StrSplit(text, ';', absl::SkipWhitespace())) {
    spec = absl::StripAsciiWhitespace(spec);
    std::vector<absl::string_view> parts = absl::StrSplit(spec, '+');
    Variant variant;
    variant.name = std::string(spec);
    absl::StatusOr<Mode> mode = common::ParseMode(parts[0]);
    if (!mode.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("variant '", spec, "': ", mode.status().message()));
    }
    variant.mode = *mode;
    for (size_t i = 1; i < parts.size(); ++i) {
      const size_t eq = parts[i].find('=');
      if (eq == absl::string_view::npos || eq == 0 ||
          eq + 1 == parts[i].size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "variant '", spec, "': '", parts[i],
            "' is not FIELD=VALUE (e.g. downpour+max_staleness=4)"));
      }
      absl::StrAppend(&variant.overrides, parts[i].substr(0, eq), ": ",
                      parts[i].substr(eq + 1), "\n");
    }
    for (const Variant& seen : variants) {
      if (seen.name == variant.name) {
        return absl::InvalidArgumentError(
            absl::StrCat("variant '", spec, "' is given twice"));
      }
    }
    variants.push_back(std::move(variant));
  }
  if (variants.empty()) {
    return absl::InvalidArgumentError("no variant given");
  }
  return variants;
}

absl::StatusOr<TrainingConfig> ApplyVariant(const Variant& variant,
                                            const TrainingConfig& base) {
  TrainingConfig config = base;
  if (!variant.overrides.empty()) {
    absl::StatusOr<TrainingConfig> overrides =
        common::ParseConfigText(variant.overrides);
    if (!overrides.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "variant '", variant.name, "': ", overrides.status().message()));
    }
    config.MergeFrom(*overrides);
  }
  absl::StatusOr<TrainingConfig> resolved =
      common::ResolveConfigWithData(config);
  if (!resolved.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "variant '", variant.name, "': ", resolved.status().message()));
  }
  return resolved;
}

absl::StatusOr<std::map<int, double>> ParseStragglers(absl::string_view text) {
  std::map<int, double> stragglers;
  for (absl::string_view spec :
       absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const size_t colon = spec.find(':');
    int rank = -1;
    double factor = 0;
    if (colon == absl::string_view::npos ||
        !absl::SimpleAtoi(spec.substr(0, colon), &rank) || rank < 0 ||
        !absl::SimpleAtod(spec.substr(colon + 1), &factor) ||
        !(factor >= 1 && factor <= 100)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "straggler '", spec,
          "' is not RANK:FACTOR with a rank of 0 or more and a factor from 1 "
          "to 100 (e.g. 1:3, worker 1 three times slower)"));
    }
    if (!stragglers.emplace(rank, factor).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("straggler rank ", rank, " is given twice"));
    }
  }
  return stragglers;
}

absl::StatusOr<ComparisonResult> RunComparison(const ComparisonOptions& options,
                                               ProcessSupervisor* supervisor) {
  ComparisonResult result;
  const std::string logs = options.out_dir + "/logs";
  const std::string runs = options.out_dir + "/runs";
  mkdir(logs.c_str(), 0755);
  mkdir(runs.c_str(), 0755);
  for (int servers : options.servers) {
    for (int workers : options.workers) {
      // One emulated network per size, shared by the modes.
      std::unique_ptr<EmulatedNetwork> network;
      if (options.link.has_value()) {
        absl::StatusOr<std::unique_ptr<EmulatedNetwork>> created =
            EmulatedNetwork::Create(servers, workers, *options.link,
                                    options.worker_rates);
        if (!created.ok()) return created.status();
        network = *std::move(created);
        result.delay_emulated = network->delay_emulated();
        result.delay_method = network->delay_method();
      }
      std::vector<Variant> variants = options.variants;
      if (variants.empty()) {
        for (Mode mode : options.modes) {
          variants.push_back({common::ModeName(mode), mode, ""});
        }
      }
      std::vector<Model> models = options.models;
      if (models.empty()) models.push_back(MODEL_AUTO);  // the config's
      std::vector<int64_t> seeds(options.seeds.begin(), options.seeds.end());
      if (seeds.empty()) seeds.push_back(-1);  // the config's
      for (const auto& [rank, factor] : options.stragglers) {
        if (rank >= workers) {
          return absl::InvalidArgumentError(
              absl::StrCat("straggler rank ", rank, " but a run of ", workers,
                           " workers has ranks 0 to ", workers - 1));
        }
      }
      for (Model model : models)
        for (const Variant& variant : variants)
          for (int64_t seed : seeds) {
            absl::StatusOr<TrainingConfig> base =
                options.config_for(variant.mode, model);
            if (!base.ok()) return base.status();
            if (seed >= 0) base->set_seed(static_cast<uint64_t>(seed));
            absl::StatusOr<TrainingConfig> config =
                ApplyVariant(variant, *base);
            if (!config.ok()) return config.status();
            const std::string model_name =
                model == MODEL_AUTO ? "" : common::ModelName(model);
            const std::string variant_name =
                model_name.empty()
                    ? variant.name
                    : absl::StrCat(model_name, "-", variant.name);
            const std::string name = absl::StrCat(
                variant_name, "-s", servers, "-w", workers,
                seeds.size() > 1 ? absl::StrCat("-seed", seed) : "");
            const std::string work_dir = runs + "/" + name;
            mkdir(work_dir.c_str(), 0755);
            const std::string log_path = logs + "/" + name + ".log";
            std::FILE* log = std::fopen(log_path.c_str(), "w");
            if (log == nullptr) {
              return absl::InternalError("cannot write " + log_path);
            }
            RunProgress progress(name, config->epochs(), log);
            supervisor->set_line_sink([&](int id, const std::string& line) {
              progress.Line(supervisor->role(id), line);
            });
            LocalClusterOptions run;
            run.config = *config;
            run.servers = servers;
            run.workers = workers;
            run.bin_dir = options.bin_dir;
            run.device = options.device;
            run.worker_cmd = options.worker_cmd;
            run.evaluator_cmd = options.evaluator_cmd;
            run.work_dir = work_dir;
            run.eval_interval_s = options.eval_interval_s;
            run.time_limit_s = options.time_limit_s;
            run.placement =
                network != nullptr ? &network->placement() : nullptr;
            run.max_restarts = options.max_restarts;
            run.replicas = options.replicas;
            run.unix_sockets = options.unix_sockets;
            run.tls_dir = options.tls_dir;
            run.slowdown = options.stragglers;
            // Every daemon serves Prometheus metrics, on free loopback ports
            // listed in the run's metrics_targets.json (not on emulated hosts,
            // whose addresses this machine does not share).
            absl::StatusOr<std::vector<Fault>> faults =
                ParseChaos(options.chaos, servers, workers, config->elastic());
            if (!faults.ok()) return faults.status();
            run.faults = *std::move(faults);
            absl::StatusOr<int> ranks =
                RanksFor(run.faults, WorkerCount{workers, options.max_workers});
            if (!ranks.ok()) return ranks.status();
            run.max_workers = *ranks;
            if (network == nullptr) {
              absl::StatusOr<int> port =
                  FreePortRange(servers + RunRanks(run) + 1);
              if (port.ok()) {
                run.metrics_port = *port;
              } else {
                common::LogWarning("compare: %s; this run serves no metrics",
                                   port.status().message());
              }
            }
            run.on_progress = [&](const RunProgressSample& sample) {
              progress.Sample(sample);
            };
            absl::StatusOr<RunMetrics> metrics =
                RunLocalCluster(run, supervisor);
            supervisor->StopAll(absl::Seconds(5));
            supervisor->set_line_sink(nullptr);
            std::fclose(log);
            if (!metrics.ok()) {
              std::printf("\n");
              if (metrics.status().code() == absl::StatusCode::kCancelled) {
                return absl::Status(
                    metrics.status().code(),
                    absl::StrCat(name, ": ", metrics.status().message(),
                                 " (log: ", log_path, ")"));
              }
              common::LogError("compare: %s failed, the comparison goes on: "
                               "%s (log: %s)",
                               name, metrics.status().message(), log_path);
              ComparedRun failed{name, variant_name, model_name,
                                 seeds.size() > 1 ? seed : -1};
              failed.metrics.config = *config;
              failed.metrics.servers = servers;
              failed.metrics.workers = workers;
              failed.failure = std::string(metrics.status().message());
              result.runs.push_back(std::move(failed));
              continue;
            }
            const auto& curve = metrics->curve;
            progress.Done(curve.points(curve.points_size() - 1).test_accuracy(),
                          curve.points(curve.points_size() - 1).test_auc(),
                          metrics->train_time_s > 0
                              ? metrics->trained_samples / metrics->train_time_s
                              : 0.0,
                          metrics->stopped_by_time_limit);
            std::ofstream(work_dir + "/metrics.json") << MetricsJson(*metrics);
            result.runs.push_back({name, variant_name, model_name,
                                   seeds.size() > 1 ? seed : -1,
                                   *std::move(metrics)});
          }
    }
  }
  result.results_path = options.out_dir + "/results.json";
  std::ofstream out(result.results_path);
  out << ResultsJson(options, result);
  if (!out) return absl::InternalError("cannot write " + result.results_path);
  return result;
}

ComparisonScenario ScenarioOf(const ComparisonOptions& options,
                              const ComparisonResult& result) {
  ComparisonScenario scenario;
  for (const Variant& variant : options.variants) {
    scenario.add_variants(variant.name);
  }
  if (options.variants.empty()) {
    for (Mode mode : options.modes)
      scenario.add_variants(common::ModeName(mode));
  }
  for (Model model : options.models) {
    scenario.add_models(common::ModelName(model));
  }
  for (uint64_t seed : options.seeds) scenario.add_seeds(seed);
  for (int servers : options.servers) scenario.add_servers(servers);
  for (int workers : options.workers) scenario.add_workers(workers);
  for (const auto& [rank, factor] : options.stragglers) {
    (*scenario.mutable_stragglers())[rank] = factor;
  }
  scenario.set_time_limit_s(options.time_limit_s);
  scenario.set_eval_interval_s(options.eval_interval_s);
  scenario.set_target_accuracy(options.target_accuracy);
  scenario.set_link(options.link.has_value() ? options.link->text : "loopback");
  for (const auto& [rank, rate] : options.worker_rates) {
    (*scenario.mutable_worker_rates())[rank] = rate;
  }
  scenario.set_delay_method(result.delay_method);
  scenario.set_delay_emulated(result.delay_emulated);
  scenario.set_chaos(options.chaos);
  scenario.set_max_restarts(options.max_restarts);
  scenario.set_replicas(options.replicas);
  scenario.set_tls(!options.tls_dir.empty());
  return scenario;
}

std::string ResultsJson(const ComparisonOptions& options,
                        const ComparisonResult& result) {
  std::string json = absl::StrFormat(
      "{\n\"target_accuracy\": %g,\n\"link\": \"%s\",\n"
      "\"chaos\": \"%s\",\n\"delay_emulated\": %s,\n"
      "\"delay_method\": \"%s\",\n\"scenario\": %s,\n\"runs\": [\n",
      options.target_accuracy,
      options.link.has_value() ? options.link->text : "loopback",
      absl::StrReplaceAll(options.chaos, {{"\\", ""}, {"\"", ""}}),
      result.delay_emulated ? "true" : "false", result.delay_method,
      MessageJson(ScenarioOf(options, result)));
  for (size_t i = 0; i < result.runs.size(); ++i) {
    const ComparedRun& r = result.runs[i];
    if (!r.failure.empty()) {
      // A failed run: who it was, and why.
      absl::StrAppend(
          &json, "{\n  \"name\": ", JsonQuoted(r.name),
          ",\n  \"variant\": ", JsonQuoted(r.variant),
          r.model.empty() ? ""
                          : absl::StrCat(",\n  \"model\": ", JsonQuoted(r.model)),
          r.seed >= 0 ? absl::StrFormat(",\n  \"seed\": %d", r.seed) : "",
          ",\n  \"mode\": ",
          JsonQuoted(common::ModeName(r.metrics.config.mode())),
          ",\n  \"servers\": ", r.metrics.servers,
          ",\n  \"workers\": ", r.metrics.workers,
          ",\n  \"failed\": ", JsonQuoted(r.failure), "\n}",
          i + 1 < result.runs.size() ? ",\n" : "\n");
      continue;
    }
    std::string run = MetricsJson(result.runs[i].metrics);
    // Name the run in its object: {"name": "...", ...}.
    run.insert(
        1,
        absl::StrFormat(
            "\n  \"name\": %s,\n  \"variant\": %s,%s%s",
            JsonQuoted(result.runs[i].name), JsonQuoted(result.runs[i].variant),
            result.runs[i].model.empty()
                ? ""
                : absl::StrCat(
                      "\n  \"model\": ", JsonQuoted(result.runs[i].model), ","),
            result.runs[i].seed >= 0
                ? absl::StrFormat("\n  \"seed\": %d,", result.runs[i].seed)
                : ""));
    if (!run.empty() && run.back() == '\n') run.pop_back();
    absl::StrAppend(&json, run, i + 1 < result.runs.size() ? ",\n" : "\n");
  }
  json += "]\n}\n";
  return json;
}

}  // namespace monsoon::tools
