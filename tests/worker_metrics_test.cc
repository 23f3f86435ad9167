#include "worker/worker_metrics.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/local_shards.h"
#include "tests/test_util.h"
#include "worker/training_loop.h"

namespace monsoon::worker {
namespace {

// The value of the one metric of family `name`.
double ValueOf(const std::vector<prometheus::MetricFamily>& families,
               const std::string& name) {
  for (const auto& family : families) {
    if (family.name != name) continue;
    EXPECT_EQ(family.metric.size(), 1u) << name;
    return family.type == prometheus::MetricType::Counter
               ? family.metric.at(0).counter.value
               : family.metric.at(0).gauge.value;
  }
  ADD_FAILURE() << "no family " << name;
  return -1;
}

TEST(WorkerMetricsTest, EachFamilyHoldsWhatTheWorkerCounted) {
  const TrainingConfig config =
      testutil::ResolvedConfig("layer_sizes: [6, 5, 3] mode: DOWNPOUR");
  testutil::LocalCluster cluster(config, 1, 1);
  ASSERT_NE(cluster.client, nullptr);
  WorkerCounters counters;
  counters.steps = 3;
  counters.samples = 96;
  counters.last_loss = 0.5;
  counters.last_step_time = 1795000000.25;
  const WorkerMetrics metrics(&counters, cluster.client.get());
  std::vector<prometheus::MetricFamily> families = metrics.Collect();
  EXPECT_EQ(ValueOf(families, "monsoon_worker_steps_total"), 3);
  EXPECT_EQ(ValueOf(families, "monsoon_worker_samples_total"), 96);
  EXPECT_EQ(ValueOf(families, "monsoon_worker_loss"), 0.5);
  EXPECT_EQ(ValueOf(families, "monsoon_worker_last_step_timestamp_seconds"),
            1795000000.25);
  EXPECT_EQ(ValueOf(families, "monsoon_worker_pushed_bytes_total"), 0);
  // A pull moves the pulled bytes by what the client counted.
  cluster.Weights(0);
  families = metrics.Collect();
  EXPECT_EQ(ValueOf(families, "monsoon_worker_pulled_bytes_total"),
            static_cast<double>(cluster.client->bytes_pulled()));
  EXPECT_GT(cluster.client->bytes_pulled(), 0);
}

const prometheus::MetricFamily* Find(
    const std::vector<prometheus::MetricFamily>& families,
    const std::string& name) {
  for (const auto& family : families) {
    if (family.name == name) return &family;
  }
  return nullptr;
}

TEST(WorkerMetricsTest, PhasesRunAndTheResidualAreServed) {
  const TrainingConfig config =
      testutil::ResolvedConfig("layer_sizes: [6, 5, 3] mode: ONEBIT");
  testutil::LocalCluster cluster(config, 1, 1);
  ASSERT_NE(cluster.client, nullptr);
  WorkerCounters counters;
  const WorkerMetrics metrics(&counters, cluster.client.get());
  // No 1-bit residual measured yet: no gauge.
  EXPECT_EQ(Find(metrics.Collect(), "monsoon_worker_onebit_residual_norm"),
            nullptr);
  counters.phases[static_cast<int>(Phase::kCompute)].Observe(0.002);
  counters.phases[static_cast<int>(Phase::kCompute)].Observe(0.004);
  counters.phases[static_cast<int>(Phase::kPushPull)].Observe(0.5);
  counters.residual_norm = 2.5;
  const std::vector<prometheus::MetricFamily> families = metrics.Collect();
  const prometheus::MetricFamily* phases =
      Find(families, "monsoon_worker_step_phase_seconds");
  ASSERT_NE(phases, nullptr);
  EXPECT_EQ(phases->type, prometheus::MetricType::Histogram);
  // Only the phases that ran, by label.
  ASSERT_EQ(phases->metric.size(), 2u);
  std::map<std::string, std::pair<uint64_t, double>> by_phase;
  for (const auto& metric : phases->metric) {
    ASSERT_EQ(metric.label.size(), 1u);
    EXPECT_EQ(metric.label[0].name, "phase");
    by_phase[metric.label[0].value] = {metric.histogram.sample_count,
                                       metric.histogram.sample_sum};
  }
  EXPECT_EQ(by_phase["compute"], std::make_pair(uint64_t{2}, 0.006));
  EXPECT_EQ(by_phase["push_pull"], std::make_pair(uint64_t{1}, 0.5));
  const prometheus::MetricFamily* residual =
      Find(families, "monsoon_worker_onebit_residual_norm");
  ASSERT_NE(residual, nullptr);
  EXPECT_EQ(residual->metric.at(0).gauge.value, 2.5);
}

TEST(EvaluatorMetricsTest, TheLastPointIsServed) {
  EvaluatorMetrics metrics;
  EXPECT_EQ(ValueOf(metrics.Collect(), "monsoon_evaluator_evaluations_total"),
            0);
  EvalPoint point;
  point.set_test_accuracy(0.75);
  point.set_test_loss(0.5);
  point.set_samples(640);
  point.set_version(10);
  metrics.Record(point, absl::FromUnixSeconds(1795000000));
  point.set_test_accuracy(0.875);
  metrics.Record(point, absl::FromUnixSeconds(1795000005));
  const std::vector<prometheus::MetricFamily> families = metrics.Collect();
  EXPECT_EQ(ValueOf(families, "monsoon_evaluator_evaluations_total"), 2);
  EXPECT_EQ(ValueOf(families, "monsoon_evaluator_test_accuracy"), 0.875);
  EXPECT_EQ(ValueOf(families, "monsoon_evaluator_test_loss"), 0.5);
  EXPECT_EQ(ValueOf(families, "monsoon_evaluator_trained_samples"), 640);
  EXPECT_EQ(ValueOf(families, "monsoon_evaluator_version"), 10);
  EXPECT_EQ(ValueOf(families, "monsoon_evaluator_last_timestamp_seconds"),
            1795000005);
}

}  // namespace
}  // namespace monsoon::worker
