// ShardMetrics: a shard's metrics for Prometheus (common/metrics_exporter.h),
// read from ShardState at each scrape, so that they count exactly what the
// Stats RPC counts (and continue across a restart from a checkpoint, as its
// counters do). Names follow Prometheus' conventions: a monsoon_shard_
// prefix, _total counters, base units; the labels are a worker's rank and a
// sparse table's name.
// Thread-safe.
#ifndef MONSOON_SERVER_SHARD_METRICS_H_
#define MONSOON_SERVER_SHARD_METRICS_H_

#include <utility>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/shard_sparse_tables.h"
#include "server/replication.h"
#include "server/shard_state.h"

namespace monsoon::server {

class ShardMetrics : public prometheus::Collectable {
 public:
  // `state` and `sparse` (the shard's sparse tables; null: none) are not
  // owned and must outlive this.
  explicit ShardMetrics(const ShardState* state,
                        const ShardSparseTables* sparse = nullptr)
      : state_(state), sparse_(sparse) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const ShardState* const state_;
  const ShardSparseTables* const sparse_;
};

// ReplicaMetrics: with --replicas, what the process is for each of its two
// ranges (its own and the previous shard's backup), labelled by range:
// role, epoch, updates replicated, take-overs, repairs and the lag between
// the copies (server/replication.h).
class ReplicaMetrics : public prometheus::Collectable {
 public:
  struct Range {
    const ShardState* state = nullptr;
    const Replication* replication = nullptr;
  };
  // Not owned; each must outlive this.
  explicit ReplicaMetrics(std::vector<Range> ranges)
      : ranges_(std::move(ranges)) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const std::vector<Range> ranges_;
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_SHARD_METRICS_H_
