#include "worker/worker_metrics.h"

#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "common/metrics_exporter.h"

namespace monsoon::worker {

std::vector<prometheus::MetricFamily> WorkerMetrics::Collect() const {
  using common::Counter;
  using common::Gauge;
  std::map<std::string, common::Histogram::Snapshot> phases;
  for (int p = 0; p < kNumPhases; ++p) {
    common::Histogram::Snapshot snapshot = counters_->phases[p].Read();
    // Only the phases this mode has.
    if (snapshot.count > 0) {
      phases[PhaseName(static_cast<Phase>(p))] = std::move(snapshot);
    }
  }
  std::vector<prometheus::MetricFamily> families = {
      Counter("monsoon_worker_steps_total", "Training steps taken.",
              static_cast<double>(counters_->steps.load())),
      Counter("monsoon_worker_samples_total", "Training examples trained.",
              static_cast<double>(counters_->samples.load())),
      Gauge("monsoon_worker_loss", "The training loss of the last step.",
            counters_->last_loss.load()),
      Gauge("monsoon_worker_last_step_timestamp_seconds",
            "When the last step ended, in seconds since the Unix epoch (0: "
            "none yet).",
            counters_->last_step_time.load()),
      Counter("monsoon_worker_pushed_bytes_total",
              "Serialized bytes sent in pushes.",
              static_cast<double>(client_->bytes_pushed())),
      Counter("monsoon_worker_pulled_bytes_total",
              "Serialized bytes received in pulls.",
              static_cast<double>(client_->bytes_pulled())),
      common::HistogramFamily(
          "monsoon_worker_step_phase_seconds",
          "Time in each phase of the steps: compute, pull, push, or "
          "push_pull (one round trip; in sync it includes the barrier).",
          "phase", phases),
  };
  if (const double norm = counters_->residual_norm.load(); !std::isnan(norm)) {
    families.push_back(
        Gauge("monsoon_worker_onebit_residual_norm",
              "L2 norm of the 1-bit residual (the quantization error carried "
              "to the next push), measured at most once a second.",
              norm));
  }
  return families;
}

void EvaluatorMetrics::Record(const EvalPoint& point, absl::Time now) {
  accuracy_.store(point.test_accuracy());
  loss_.store(point.test_loss());
  samples_.store(static_cast<double>(point.samples()));
  version_.store(static_cast<double>(point.version()));
  last_time_.store(absl::ToDoubleSeconds(now - absl::UnixEpoch()));
  evaluations_.fetch_add(1);
}

std::vector<prometheus::MetricFamily> EvaluatorMetrics::Collect() const {
  using common::Counter;
  using common::Gauge;
  return {
      Counter("monsoon_evaluator_evaluations_total",
              "Evaluations of the servers' weights on the test set.",
              static_cast<double>(evaluations_.load())),
      Gauge("monsoon_evaluator_test_accuracy",
            "Test accuracy of the last evaluation (0 to 1).", accuracy_.load()),
      Gauge("monsoon_evaluator_test_loss",
            "Mean test loss of the last evaluation.", loss_.load()),
      Gauge("monsoon_evaluator_trained_samples",
            "Training examples pushed when the last evaluation ran (shard 0's "
            "count).",
            samples_.load()),
      Gauge("monsoon_evaluator_version",
            "Shard 0's version of the weights the last evaluation saw.",
            version_.load()),
      Gauge("monsoon_evaluator_last_timestamp_seconds",
            "When the last evaluation ended, in seconds since the Unix epoch "
            "(0: none yet).",
            last_time_.load()),
  };
}

}  // namespace monsoon::worker
