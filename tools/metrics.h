// Metrics of one run, as DESIGN.md specifies them: assembled from the
// shards' statistics and the evaluator's curve, and written as one JSON
// object. Stateless functions; thread-safe.
#ifndef MONSOON_TOOLS_METRICS_H_
#define MONSOON_TOOLS_METRICS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "google/protobuf/message.h"
#include "proto/config.pb.h"
#include "proto/metrics.pb.h"
#include "proto/service.pb.h"

namespace monsoon::tools {

struct StalenessSummary {
  double mean = 0;
  int64_t p50 = 0;
  int64_t p99 = 0;
  int64_t max = 0;
  int64_t pushes = 0;
};

// The shards' staleness histograms summed per staleness: entry k counts
// the pushes of staleness k, summed over shards (every push reaches every
// shard, so the entries add up to about pushes x shards); the last entry
// counts every push at least that stale, as each shard's own last bucket
// does (StatsResponse.staleness_counts). Empty when no shard has counts.
std::vector<int64_t> MergeStalenessCounts(
    const std::vector<StatsResponse>& shards);

// Merges the shards' staleness histograms. Percentiles are nearest-rank: the
// smallest staleness s such that at least q of the pushes have staleness <= s.
StalenessSummary SummarizeStaleness(const std::vector<StatsResponse>& shards);

// Something that happened to a run's processes: a fault injected, a
// process that died, one restarted.
struct RunEvent {
  double time_s = 0;  // from the start of training
  std::string what;   // "kill server 1", "restart worker 0 (exit 137)"
};

// Where the workers' steps spent their time in one phase ("compute",
// "pull", "push", "push_pull"), summed over workers.
struct PhaseTotal {
  int64_t count = 0;
  double seconds = 0;
};

struct RunMetrics {
  TrainingConfig config;  // resolved
  int servers = 0;
  int workers = 0;
  double wall_time_s = 0;  // first worker start to last worker exit
  // From the workers' reports: the examples trained in this run (not those
  // a restarted worker found already applied), and the time from the first
  // worker's first step to the last worker's last.
  int64_t trained_samples = 0;
  double train_time_s = 0;
  // WorkerReport.phases summed over the workers' reports, by phase name
  // (AddWorkerPhases); empty when no report has phases.
  std::map<std::string, PhaseTotal> step_phases;
  // WorkerReport.ring_bytes_sent and _received summed (allreduce).
  int64_t ring_bytes_sent = 0;
  int64_t ring_bytes_received = 0;
  // WorkerReport.shard_pushes_during_backward summed (sync).
  int64_t shard_pushes_during_backward = 0;
  // Replication's count, from the workers' reports (WorkerReport's
  // updates_acknowledged, updates_answered_as_duplicate, updates_lost,
  // examples_lost summed; the longest max_step_gap_s), and the --replicas
  // the shards ran with.
  int replicas = 0;
  int64_t updates_acknowledged = 0;
  int64_t updates_answered_as_duplicate = 0;
  int64_t updates_lost = 0;
  int64_t examples_lost = 0;
  double max_step_gap_s = 0;
  // Elastic runs, over the workers an add fault started: the longest time
  // from a joiner's registration with every shard to the end of its first
  // step (its first pull, data shard, gradient and push answered), and from
  // the add that started its process (loading the data included); 0
  // without one.
  double join_to_first_push_s = 0;
  double add_to_first_push_s = 0;
  bool stopped_by_time_limit = false;
  std::vector<StatsResponse> shard_stats;
  EvalCurve curve;
  // Faults injected (--chaos) and the launcher's restarts, in time order.
  std::vector<RunEvent> events;
  int restarts = 0;
};

// Adds `report`'s phases to run->step_phases, its ring bytes and its
// replication ledger.
void AddWorkerPhases(const WorkerReport& report, RunMetrics* run);

// `text` as a JSON string, quotes included (protobuf's JSON printer escapes
// it).
std::string JsonQuoted(const std::string& text);

// `message` as one JSON object, by protobuf's JSON printer: field names as
// in the .proto, every field present (zeros and empty lists too), enums by
// name; 64-bit integers are strings, as protobuf's JSON mapping writes them.
std::string MessageJson(const google::protobuf::Message& message);

// The resolved config as MessageJson writes it, with every field of
// proto/config.proto: one left at its default is written with its default
// (the JSON says what the run used, not only what was given).
std::string ConfigJson(const TrainingConfig& config);

// The JSON object: mode, servers, workers, wall_time_s, train_time_s,
// samples (trained in this run), samples_per_s (samples / train_time_s),
// final_test_accuracy, final_test_loss (a SPARSE_LR run also
// final_test_auc and final_test_logloss, the same as final_test_loss),
// bytes_pushed (sparse rows' pushes included),
// bytes_pulled, ring_bytes_sent and ring_bytes_received (allreduce: the
// ring's payload, summed over the workers' reports), bytes_total (pushed,
// pulled and the ring's sent), pushes, rejected_pushes,
// duplicate_pushes,
// samples_skipped (sync steps that closed without a worker),
// backup_dropped_pushes (sync with backup_workers: late pushes dropped,
// summed over shards),
// stopped_by_time_limit, restarts, replicas (the shards' --replicas),
// failovers (ranges taken over by their backups: the shards' take_overs
// summed), updates_acknowledged, updates_answered_as_duplicate,
// updates_lost and examples_lost (the workers' ledgers summed: pushes a
// shard acknowledged as applied, pushes sent again that a shard answered as
// a duplicate, and of the applied ones those, and their examples, that no
// surviving copy had when the worker came back), max_step_gap_s (the longest time between two steps of
// any worker), elastic, membership_changes, examples_trained_twice,
// data_shards_requeued and examples_trained [per epoch] (an elastic run's
// shard 0: joins and leaves, its data queue's counts; 0 and [] otherwise),
// join_to_first_push_s and add_to_first_push_s (RunMetrics'),
// events [{time_s, what}, ...],
// staleness {mean, p50, p99, max},
// staleness_histogram [count of staleness 0, of 1, ...] (MergeStalenessCounts:
// summed over shards, the last entry counting every push at least that
// stale), step_phases {PHASE: {seconds, count, mean_ms}, ...} (summed over
// the workers' reports, mean_ms = 1000 * seconds / count; {} when no report
// has phases), with sparse tables sparse_tables {TABLE: {rows, row_updates}}
// (summed over the shards) and row_pushes [per shard], network {layers (ModelLayout::Describe), input_shape,
// parameters, forward_flops_per_example}, config {the whole resolved config:
// ConfigJson}, curve [{time_s, samples, test_accuracy, test_loss,
// (SPARSE_LR: test_auc,) bytes_pushed, bytes_pulled}, ...].
std::string MetricsJson(const RunMetrics& run);

}  // namespace monsoon::tools

#endif  // MONSOON_TOOLS_METRICS_H_
