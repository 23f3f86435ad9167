// ShardMetrics: a shard's metrics for Prometheus (common/metrics_exporter.h),
// read from ShardState at each scrape, so that they count exactly what the
// Stats RPC counts (and continue across a restart from a checkpoint, as its
// counters do). Names follow Prometheus' conventions: a monsoon_shard_
// prefix, _total counters, base units; the only label is a worker's rank.
// Thread-safe.
#ifndef MONSOON_SERVER_SHARD_METRICS_H_
#define MONSOON_SERVER_SHARD_METRICS_H_

#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/shard_state.h"

namespace monsoon::server {

class ShardMetrics : public prometheus::Collectable {
 public:
  // `state` is not owned and must outlive this.
  explicit ShardMetrics(const ShardState* state) : state_(state) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const ShardState* const state_;
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_SHARD_METRICS_H_
