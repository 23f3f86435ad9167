// WorkerMetrics and EvaluatorMetrics: a worker's and an evaluator's metrics for
// Prometheus (common/metrics_exporter.h), read at each scrape from the counters
// its training loop keeps (WorkerCounters) and from its client's byte counts.
// monsoon_worker_last_step_timestamp_seconds lets an alert fire on a stuck
// worker (time() minus it). Thread-safe.
#ifndef MONSOON_WORKER_WORKER_METRICS_H_
#define MONSOON_WORKER_WORKER_METRICS_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "proto/metrics.pb.h"
#include "worker/parameter_client.h"
#include "worker/training_loop.h"
#include "worker/worker_counters.h"

namespace monsoon::worker {

class WorkerMetrics : public prometheus::Collectable {
 public:
  // Neither is owned; both must outlive this.
  WorkerMetrics(const WorkerCounters* counters, const ParameterClient* client)
      : counters_(counters), client_(client) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const WorkerCounters* const counters_;
  const ParameterClient* const client_;
};

// The evaluator's metrics: its last point of the curve (Record), served at
// each scrape; monsoon_evaluator_last_timestamp_seconds lets an alert fire
// on an evaluator that stopped. Thread-safe.
class EvaluatorMetrics : public prometheus::Collectable {
 public:
  // After each evaluation.
  void Record(const EvalPoint& point, absl::Time now);

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::atomic<int64_t> evaluations_{0};
  std::atomic<double> accuracy_{0};
  std::atomic<double> loss_{0};
  std::atomic<double> samples_{0};
  std::atomic<double> version_{0};
  std::atomic<double> last_time_{0};
};

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_WORKER_METRICS_H_
