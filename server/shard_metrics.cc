#include "server/shard_metrics.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "common/metrics_exporter.h"
#include "proto/service.pb.h"

namespace monsoon::server {
namespace {

using common::Counter;
using common::Gauge;
using common::LabeledCounter;
using prometheus::ClientMetric;
using prometheus::MetricFamily;

// A per-rank map of the stats as a rank-labelled counter.
MetricFamily PerRank(const std::string& name, const std::string& help,
                     const google::protobuf::Map<int32_t, int64_t>& by_rank) {
  std::map<std::string, double> values;
  for (const auto& [rank, value] : by_rank) {
    values[std::to_string(rank)] = static_cast<double>(value);
  }
  return LabeledCounter(name, help, "rank", values);
}

// staleness_counts[k] pushes had staleness k (the last entry: at least k),
// as a cumulative histogram with a bucket per staleness up to the last.
MetricFamily StalenessHistogram(const StatsResponse& stats) {
  MetricFamily family{
      "monsoon_shard_push_staleness",
      "Versions the shard had advanced between a push's base version and its "
      "application.",
      prometheus::MetricType::Histogram,
      {}};
  ClientMetric metric;
  uint64_t cumulative = 0;
  // The last of ShardState's buckets holds every push at least that stale:
  // +Inf's, which the count gives.
  const int buckets = std::min(stats.staleness_counts_size(),
                               ShardState::kStalenessBuckets - 1);
  for (int k = 0; k < buckets; ++k) {
    cumulative += static_cast<uint64_t>(stats.staleness_counts(k));
    metric.histogram.bucket.push_back({cumulative, static_cast<double>(k)});
  }
  metric.histogram.sample_count = static_cast<uint64_t>(stats.pushes());
  metric.histogram.sample_sum = static_cast<double>(stats.staleness_sum());
  family.metric.push_back(std::move(metric));
  return family;
}

// The shard's version and what its pushes and pulls did, from its Stats.
void AddPushFamilies(const StatsResponse& stats,
                     std::vector<MetricFamily>* families) {
  families->push_back(Gauge("monsoon_shard_version",
                            "The version of the shard's weights.",
                            static_cast<double>(stats.version())));
  families->push_back(Counter("monsoon_shard_pushes_total",
                              "Pushes applied (in sync, collected).",
                              static_cast<double>(stats.pushes())));
  std::map<std::string, double> rejected;
  for (const auto& [code, count] : stats.rejected_pushes_by_code()) {
    rejected[code] = static_cast<double>(count);
  }
  families->push_back(LabeledCounter(
      "monsoon_shard_rejected_pushes_total",
      "Pushes refused, by the status code they got: INVALID_ARGUMENT "
      "(malformed, out of bounds, an update that would overflow), "
      "PERMISSION_DENIED (another rank's session), RESOURCE_EXHAUSTED (over "
      "a limit), ABORTED (a closed sync step, or a version the shard went "
      "back from), FAILED_PRECONDITION, ...",
      "code", rejected));
  families->push_back(Counter(
      "monsoon_shard_refused_updates_total",
      "Updates refused because they would have made a weight or an optimizer "
      "value infinite or NaN.",
      static_cast<double>(stats.refused_updates())));
  families->push_back(
      Counter("monsoon_shard_backup_dropped_pushes_total",
              "Sync with backup workers: pushes that came after their step had "
              "closed without them, dropped.",
              static_cast<double>(stats.backup_dropped_pushes())));
  families->push_back(
      Counter("monsoon_shard_duplicate_pushes_total",
              "Pushes acknowledged as repeats of examples already applied.",
              static_cast<double>(stats.duplicate_pushes())));
  families->push_back(Counter("monsoon_shard_pushed_bytes_total",
                              "Serialized bytes received in pushes.",
                              static_cast<double>(stats.bytes_pushed())));
  families->push_back(Counter("monsoon_shard_pulled_bytes_total",
                              "Serialized bytes sent in workers' pulls.",
                              static_cast<double>(stats.bytes_pulled())));
  families->push_back(Counter("monsoon_shard_samples_total",
                              "Training examples the pushes summarize.",
                              static_cast<double>(stats.samples())));
  families->push_back(PerRank("monsoon_shard_samples_applied_total",
                              "Training examples in the weights, per rank.",
                              stats.samples_applied_by_worker()));
  families->push_back(PerRank(
      "monsoon_shard_samples_skipped_total",
      "Training examples passed over, per rank (a sync step closed without "
      "the rank, or refused).",
      stats.samples_skipped_by_worker()));
  families->push_back(StalenessHistogram(stats));
}

// Calls waiting, and how long applies, barriers and staleness bounds took.
void AddTimingFamilies(const ShardState& state, const StatsResponse& stats,
                       std::vector<MetricFamily>* families) {
  families->push_back(Gauge("monsoon_shard_waiting_calls",
                            "Pulls and sync push-pulls waiting for a version.",
                            static_cast<double>(state.NumWaiting())));
  families->push_back(
      Gauge("monsoon_shard_max_concurrent_applies",
            "The most pushes seen writing the weights at once.",
            static_cast<double>(stats.max_concurrent_applies())));
  families->push_back(common::HistogramFamily(
      "monsoon_shard_apply_seconds",
      "Time each update took to write the weights (in sync, each step's).", "",
      {{"", state.apply_seconds().Read()}}));
  families->push_back(common::HistogramFamily(
      "monsoon_shard_barrier_wait_seconds",
      "Sync only: time from a worker's push to the close of its step (the "
      "barrier), per push-pull.",
      "", {{"", state.barrier_wait_seconds().Read()}}));
  families->push_back(common::HistogramFamily(
      "monsoon_shard_staleness_wait_seconds",
      "Bounded staleness (max_staleness) only: time a worker's pull waited "
      "for the slowest live worker.",
      "", {{"", state.staleness_wait_seconds().Read()}}));
}

// The registered workers and when each last called.
void AddWorkerFamilies(const ShardState& state,
                       std::vector<MetricFamily>* families) {
  families->push_back(
      Gauge("monsoon_shard_registered_workers",
            "Worker ranks registered with this shard that have not left.",
            static_cast<double>(state.NumRegistered())));
  std::map<std::string, double> contacts;
  for (const auto& [rank, when] : state.LastContacts()) {
    contacts[std::to_string(rank)] =
        absl::ToDoubleSeconds(when - absl::UnixEpoch());
  }
  families->push_back(common::LabeledGauge(
      "monsoon_shard_worker_last_contact_timestamp_seconds",
      "When each worker rank last called this shard, in seconds since the "
      "Unix epoch (a rank that left is not listed).",
      "rank", contacts));
}

// When checkpoints were written, how long they took, how many failed.
void AddCheckpointFamilies(const ShardState& state,
                           std::vector<MetricFamily>* families) {
  const ShardState::CheckpointStats checkpoints = state.checkpoint_stats();
  families->push_back(Gauge(
      "monsoon_shard_last_checkpoint_timestamp_seconds",
      "When the last checkpoint write that succeeded ended, in seconds since "
      "the Unix epoch (0: none in this process).",
      checkpoints.last_written == absl::InfinitePast()
          ? 0.0
          : absl::ToDoubleSeconds(checkpoints.last_written -
                                  absl::UnixEpoch())));
  families->push_back(common::HistogramFamily(
      "monsoon_shard_checkpoint_seconds",
      "Time each checkpoint write took, failed ones included.", "",
      {{"", state.checkpoint_seconds().Read()}}));
  families->push_back(Counter("monsoon_shard_checkpoint_failures_total",
                              "Checkpoint writes that failed.",
                              static_cast<double>(checkpoints.failures)));
}

}  // namespace

// Each sparse table's rows, memory and what its pushes did, by table.
void AddSparseFamilies(const ShardSparseTables& sparse,
                       std::vector<MetricFamily>* families) {
  if (sparse.empty()) return;
  std::map<std::string, double> rows, bytes, created, evicted, updates,
      not_admitted, refused;
  for (const auto& table : sparse.tables()) {
    const SparseTableStats s = table->stats();
    const std::string& name = table->config().name();
    rows[name] = static_cast<double>(s.rows);
    bytes[name] = static_cast<double>(s.bytes);
    created[name] = static_cast<double>(s.created);
    evicted[name] = static_cast<double>(s.evicted);
    updates[name] = static_cast<double>(s.row_updates);
    not_admitted[name] = static_cast<double>(s.not_admitted);
    refused[name] = static_cast<double>(s.refused_pushes);
  }
  families->push_back(common::LabeledGauge(
      "monsoon_shard_sparse_rows", "Rows a sparse table holds on this shard.",
      "table", rows));
  families->push_back(common::LabeledGauge(
      "monsoon_shard_sparse_bytes",
      "Memory of a sparse table's rows, state and index on this shard, about.",
      "table", bytes));
  families->push_back(LabeledCounter("monsoon_shard_sparse_rows_created_total",
                                     "Rows made (an admitted id's first push).",
                                     "table", created));
  families->push_back(LabeledCounter(
      "monsoon_shard_sparse_rows_evicted_total",
      "Rows evicted (at max_rows, or unseen for evict_unseen_steps).", "table",
      evicted));
  families->push_back(LabeledCounter("monsoon_shard_sparse_row_updates_total",
                                     "Row gradients applied.", "table",
                                     updates));
  families->push_back(LabeledCounter(
      "monsoon_shard_sparse_not_admitted_total",
      "Row gradients dropped: their id not admitted yet.", "table",
      not_admitted));
  families->push_back(LabeledCounter(
      "monsoon_shard_sparse_refused_pushes_total",
      "Sparse pushes refused whole (sizes, repeats, non-finite values, "
      "max_rows).",
      "table", refused));
}

// Elastic runs: who is in the run, and (shard 0) what its data queue did.
void AddElasticFamilies(const StatsResponse& stats,
                        std::vector<MetricFamily>* families) {
  families->push_back(Gauge(
      "monsoon_shard_membership_epoch",
      "Elastic runs: joins and leaves this shard has seen (its membership "
      "epoch).",
      static_cast<double>(stats.membership_epoch())));
  families->push_back(Counter(
      "monsoon_shard_joins_total",
      "Elastic runs: ranks that registered, or called again after their "
      "lease ran out.",
      static_cast<double>(stats.joins())));
  families->push_back(Counter(
      "monsoon_shard_leaves_total",
      "Elastic runs: ranks that left, finished, or whose lease ran out.",
      static_cast<double>(stats.leaves())));
  families->push_back(Gauge("monsoon_shard_live_ranks",
                            "Elastic runs: the ranks in the run now.",
                            static_cast<double>(stats.live_ranks_size())));
  if (!stats.has_data_queue()) return;
  const DataQueueState& queue = stats.data_queue();
  families->push_back(Counter(
      "monsoon_data_shards_done_total",
      "Elastic runs, shard 0: data shards whose examples the ledger holds.",
      static_cast<double>(queue.done_size())));
  families->push_back(Counter(
      "monsoon_data_shards_requeued_total",
      "Elastic runs, shard 0: data shards put back in the queue (their "
      "worker left or went silent).",
      static_cast<double>(queue.shards_requeued())));
  families->push_back(Counter(
      "monsoon_examples_trained_twice_total",
      "Elastic runs, shard 0: examples applied of data shards that were put "
      "back, or trained again after they were done.",
      static_cast<double>(queue.examples_trained_twice())));
}

std::vector<MetricFamily> ShardMetrics::Collect() const {
  const StatsResponse stats = state_->Stats();
  std::vector<MetricFamily> families;
  AddPushFamilies(stats, &families);
  if (state_->elastic()) AddElasticFamilies(stats, &families);
  AddTimingFamilies(*state_, stats, &families);
  AddWorkerFamilies(*state_, &families);
  AddCheckpointFamilies(*state_, &families);
  if (sparse_ != nullptr) AddSparseFamilies(*sparse_, &families);
  return families;
}

std::vector<MetricFamily> ReplicaMetrics::Collect() const {
  std::map<std::string, double> role, epoch, updates, take_overs, repairs, lag,
      forward_calls;
  std::map<std::string, common::Histogram::Snapshot> forward_seconds;
  for (const Range& range : ranges_) {
    const std::string label = std::to_string(range.state->shard());
    role[label] = static_cast<double>(range.replication->role_for_stats());
    epoch[label] = static_cast<double>(range.replication->epoch());
    updates[label] =
        static_cast<double>(range.replication->replicated_updates());
    take_overs[label] = static_cast<double>(range.replication->take_overs());
    repairs[label] = static_cast<double>(range.replication->repairs());
    forward_calls[label] =
        static_cast<double>(range.replication->forward_calls());
    forward_seconds[label] = range.replication->forward_seconds();
    lag[label] = static_cast<double>(
        range.replication->Lag(range.state->version()));
  }
  std::vector<MetricFamily> families;
  families.push_back(common::LabeledGauge(
      "monsoon_replica_role",
      "What this process is for the range: 1 primary, 2 backup, 3 degraded "
      "(serves it without a backup), 4 fenced (StatsResponse.ReplicaRole).",
      "range", role));
  families.push_back(common::LabeledGauge(
      "monsoon_replica_epoch",
      "The range's epoch: 1, and one more at every take-over.", "range",
      epoch));
  families.push_back(LabeledCounter(
      "monsoon_replica_updates_total",
      "Updates forwarded to the range's backup (as primary) or applied "
      "from its primary (as backup).",
      "range", updates));
  families.push_back(LabeledCounter(
      "monsoon_replica_take_overs_total",
      "Take-overs of the range by this process.", "range", take_overs));
  families.push_back(LabeledCounter(
      "monsoon_replica_repairs_total",
      "Copies of the range this process made from the process serving it "
      "(after a restart), and then followed.",
      "range", repairs));
  families.push_back(LabeledCounter(
      "monsoon_replica_forward_calls_total",
      "Calls this process opened to forward the range's updates to its "
      "backup (ParameterService.Replicate): one for a run whose backup "
      "stays, one more each time the call ended.",
      "range", forward_calls));
  families.push_back(common::HistogramFamily(
      "monsoon_replica_forward_seconds",
      "As primary: time from sending an update to the range's backup to "
      "its acknowledgement that it applied it (a worker's push, in sync "
      "the step's weights, waits that long).",
      "range", forward_seconds));
  families.push_back(common::LabeledGauge(
      "monsoon_replica_lag_updates",
      "How far the copies are apart, in updates: as primary, those applied "
      "that the backup has not confirmed; as backup, those held for their "
      "turn.",
      "range", lag));
  return families;
}

}  // namespace monsoon::server
