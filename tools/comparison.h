// RunComparison: the same model, data and seed trained in each of several
// modes (and, for sweeps, at several server and worker counts), one run after
// another, each as a local cluster (RunLocalCluster), optionally on emulated
// hosts. Writes every run's log and metrics and one results.json into the
// output folder, and shows one progress line per run. Not thread-safe.
#ifndef MONSOON_TOOLS_COMPARISON_H_
#define MONSOON_TOOLS_COMPARISON_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/config.pb.h"
#include "proto/metrics.pb.h"
#include "tools/emulated_network.h"
#include "tools/metrics.h"
#include "tools/process_supervisor.h"

namespace monsoon::tools {

// One configuration to compare: a mode and config fields set on top of the
// mode's config ("downpour+max_staleness=4").
struct Variant {
  std::string name;  // as given: "downpour+max_staleness=4"
  Mode mode = MODE_UNSPECIFIED;
  std::string overrides;  // text format: "max_staleness: 4\n"
};

// Parses "VARIANT;VARIANT;...", each "MODE[+FIELD=VALUE]..." (any
// TrainingConfig field, its value as text format writes it).
// INVALID_ARGUMENT naming the variant for an unknown mode or an empty
// field; the fields themselves are checked when applied (ApplyVariant).
absl::StatusOr<std::vector<Variant>> ParseVariants(absl::string_view text);

// The resolved config of `variant`: `base` (the mode's config) with the
// overrides set, resolved again. INVALID_ARGUMENT naming the variant for a
// field that does not exist, a bad value, or an option the mode refuses.
absl::StatusOr<TrainingConfig> ApplyVariant(const Variant& variant,
                                            const TrainingConfig& base);

// Parses "RANK:FACTOR[,RANK:FACTOR]..." (--straggler): rank -> slowdown,
// each factor from 1 to 100, each rank once.
absl::StatusOr<std::map<int, double>> ParseStragglers(absl::string_view text);

struct ComparisonOptions {
  // Each mode's config as it is (no variants given), or the variants.
  std::vector<Mode> modes;
  std::vector<Variant> variants;
  // Each configuration once per model preset, the runs and variants named
  // after it ("lenet-downpour-s2-w2"); empty: the config's model, once.
  std::vector<Model> models;
  // Each run once per seed (the config's seed when empty).
  std::vector<uint64_t> seeds;
  // Stragglers in every run (LocalClusterOptions.slowdown).
  std::map<int, double> stragglers;
  std::vector<int> servers;  // one sweep point per count
  std::vector<int> workers;
  // Elastic runs: every daemon's --num_workers (--workers=MIN:MAX; 0: the
  // workers started plus one per add fault).
  int max_workers = 0;
  // The resolved config for a mode and model preset (MODEL_AUTO: the
  // config's model); mode-dependent defaults differ.
  std::function<absl::StatusOr<TrainingConfig>(Mode, Model)> config_for;
  std::string out_dir;  // must exist
  std::string bin_dir;
  double time_limit_s = 0;  // per run; 0: the config's epochs
  double eval_interval_s = 0.5;
  double target_accuracy = 0.85;
  std::optional<LinkSpec> link;
  // With link: worker rank -> its link's rate (--link_worker).
  std::map<int, int64_t> worker_rates;
  // LocalClusterOptions.max_restarts and replicas for every run.
  int max_restarts = 3;
  int replicas = 0;
  // LocalClusterOptions.unix_sockets for every run.
  bool unix_sockets = false;
  // --chaos, injected into every run (ParseChaos against its counts).
  std::string chaos;
  // LocalClusterOptions.tls_dir for every run.
  std::string tls_dir;
  // LocalClusterOptions.device, worker_cmd and evaluator_cmd for every run.
  std::string device = "cpu";
  std::string worker_cmd;
  std::string evaluator_cmd;
};

struct ComparedRun {
  std::string name;  // "downpour-s2-w2", "downpour+max_staleness=4-s2-w2-seed3"
  // "downpour+max_staleness=4" (the mode without one), after the model's
  // name with several models ("lenet-downpour").
  std::string variant;
  std::string model;  // "lenet", with models given; else empty
  int64_t seed = -1;  // with several seeds, else -1
  // Only config, servers and workers where the run failed.
  RunMetrics metrics;
  // Why the run failed (its error); empty when it ran to the end.
  std::string failure;
};

struct ComparisonResult {
  std::vector<ComparedRun> runs;
  std::string results_path;
  bool delay_emulated = true;
  // How the link's delay was made: "netem", "proxy" (user-space delay
  // proxies, where the kernel has no netem) or "none".
  std::string delay_method = "none";
};

// Runs everything. A run that fails is recorded with its error (its log
// kept) and the comparison goes on, so that the others' results are
// written (allreduce under --chaos fails by design: a ring cannot take a
// killed worker back). CANCELLED on Ctrl-C after stopping every process and
// removing the emulated network.
absl::StatusOr<ComparisonResult> RunComparison(const ComparisonOptions& options,
                                               ProcessSupervisor* supervisor);

// What results.json's "scenario" says of `options` and `result`.
ComparisonScenario ScenarioOf(const ComparisonOptions& options,
                              const ComparisonResult& result);

// results.json: {"target_accuracy", "link", "chaos", "delay_emulated",
// "delay_method", "scenario" (ScenarioOf, by MessageJson), "runs": [each
// run's MetricsJson plus "name", "variant", and with several models or
// seeds "model" and "seed"]}.
std::string ResultsJson(const ComparisonOptions& options,
                        const ComparisonResult& result);

}  // namespace monsoon::tools

#endif  // MONSOON_TOOLS_COMPARISON_H_
