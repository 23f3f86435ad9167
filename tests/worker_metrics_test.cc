#include "worker/worker_metrics.h"

#include <string>
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
