#include "tools/metrics.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace monsoon::tools {
namespace {

using ::testing::HasSubstr;

StatsResponse Shard(std::vector<int64_t> counts, int64_t max) {
  StatsResponse stats;
  for (int64_t c : counts) stats.add_staleness_counts(c);
  stats.set_staleness_max(max);
  return stats;
}

TEST(MetricsTest, StalenessMergesShardsWithNearestRankPercentiles) {
  // Shard 0: 60 pushes of staleness 0, 30 of 1. Shard 1: 9 of 1, 1 of 5.
  // Merged 100 pushes: 60 x 0, 39 x 1, 1 x 5.
  const StalenessSummary s =
      SummarizeStaleness({Shard({60, 30}, 1), Shard({0, 9, 0, 0, 0, 1}, 5)});
  EXPECT_EQ(s.pushes, 100);
  EXPECT_DOUBLE_EQ(s.mean, (39 * 1 + 5) / 100.0);
  EXPECT_EQ(s.p50, 0);  // the 50th smallest is 0
  EXPECT_EQ(s.p99, 1);  // the 99th smallest is 1
  EXPECT_EQ(s.max, 5);
}

TEST(MetricsTest, StalenessOfNoPushesIsZero) {
  const StalenessSummary s = SummarizeStaleness({Shard({}, 0)});
  EXPECT_EQ(s.pushes, 0);
  EXPECT_EQ(s.mean, 0);
  EXPECT_EQ(s.p99, 0);
}

TEST(MetricsTest, StalenessCountsAreSummedPerStalenessOverShards) {
  // Shards of different bucket counts: the shorter one adds zeros.
  EXPECT_EQ(MergeStalenessCounts({Shard({60, 30}, 1),
                                  Shard({0, 9, 0, 0, 0, 1}, 5), Shard({}, 0)}),
            (std::vector<int64_t>{60, 39, 0, 0, 0, 1}));
  EXPECT_TRUE(MergeStalenessCounts({Shard({}, 0)}).empty());
  EXPECT_TRUE(MergeStalenessCounts({}).empty());
}

TEST(MetricsTest, JsonHasTheMergedStalenessHistogram) {
  RunMetrics run;
  run.shard_stats = {Shard({5, 3, 1}, 4), Shard({7, 0, 2}, 9)};
  EXPECT_THAT(MetricsJson(run),
              HasSubstr("\"staleness_histogram\": [12, 3, 3],\n"));
  run.shard_stats.clear();
  EXPECT_THAT(MetricsJson(run), HasSubstr("\"staleness_histogram\": [],\n"));
}

PhaseTime* AddPhase(WorkerReport* report, const std::string& name,
                    int64_t count, double seconds) {
  PhaseTime* phase = report->add_phases();
  phase->set_phase(name);
  phase->set_count(count);
  phase->set_seconds(seconds);
  return phase;
}

TEST(MetricsTest, StepPhasesAreSummedOverWorkersWithTheirMeans) {
  WorkerReport a, b, none;
  AddPhase(&a, "compute", 100, 1.5);
  AddPhase(&a, "push", 100, 0.25);
  AddPhase(&b, "compute", 60, 0.5);
  AddPhase(&b, "push", 60, 0.75);
  AddPhase(&b, "pull", 8, 0.1);
  RunMetrics run;
  for (const WorkerReport* report : {&a, &b, &none}) {
    AddWorkerPhases(*report, &run);
  }
  ASSERT_EQ(run.step_phases.size(), 3u);
  EXPECT_EQ(run.step_phases["compute"].count, 160);
  EXPECT_DOUBLE_EQ(run.step_phases["compute"].seconds, 2.0);
  // compute: 2 s / 160 = 12.5 ms; pull: 0.1 s / 8 = 12.5 ms; push: 1 s / 160
  // = 6.25 ms. Phases in name order.
  EXPECT_THAT(MetricsJson(run),
              HasSubstr("\"step_phases\": {"
                        "\"compute\": {\"seconds\": 2, \"count\": 160, "
                        "\"mean_ms\": 12.5}, "
                        "\"pull\": {\"seconds\": 0.1, \"count\": 8, "
                        "\"mean_ms\": 12.5}, "
                        "\"push\": {\"seconds\": 1, \"count\": 160, "
                        "\"mean_ms\": 6.25}},\n"));
}

// The workers' ledgers are summed: what the shards acknowledged as applied,
// what they answered as a duplicate, and what was lost.
TEST(MetricsTest, LedgersAreSummedOverTheWorkers) {
  WorkerReport a;
  a.set_updates_acknowledged(934);
  a.set_updates_answered_as_duplicate(2);
  a.set_max_step_gap_s(0.25);
  WorkerReport b;
  b.set_updates_acknowledged(935);
  b.set_updates_answered_as_duplicate(1);
  b.set_updates_lost(3);
  b.set_examples_lost(192);
  b.set_max_step_gap_s(0.5);
  RunMetrics run;
  AddWorkerPhases(a, &run);
  AddWorkerPhases(b, &run);
  const std::string json = MetricsJson(run);
  EXPECT_THAT(json, HasSubstr("\"updates_acknowledged\": 1869,\n"
                              "  \"updates_answered_as_duplicate\": 3,\n"
                              "  \"updates_lost\": 3,\n"
                              "  \"examples_lost\": 192,\n"
                              "  \"max_step_gap_s\": 0.5,\n"));
}

TEST(MetricsTest, StepPhasesAreAnEmptyObjectWithoutPhasesOrCounts) {
  RunMetrics run;
  AddWorkerPhases(WorkerReport(), &run);
  EXPECT_THAT(MetricsJson(run), HasSubstr("\"step_phases\": {},\n"));
  // A phase that never ran has no mean rather than a division by zero.
  WorkerReport report;
  AddPhase(&report, "pull", 0, 0);
  AddWorkerPhases(report, &run);
  EXPECT_THAT(MetricsJson(run),
              HasSubstr("\"step_phases\": {\"pull\": {\"seconds\": 0, "
                        "\"count\": 0, \"mean_ms\": 0}},\n"));
}

// The config in metrics.json and results.json is the whole resolved config:
// what was given (backup_workers: 1 was once missing) and every default.
TEST(MetricsTest, ConfigJsonIsTheWholeConfigWithItsDefaults) {
  TrainingConfig config;
  config.set_mode(SYNC);
  config.set_backup_workers(1);
  config.add_layer_sizes(4);
  config.add_layer_sizes(2);
  const std::string json = ConfigJson(config);
  EXPECT_THAT(json, HasSubstr("\"backup_workers\":1"));
  EXPECT_THAT(json, HasSubstr("\"mode\":\"SYNC\""));
  EXPECT_THAT(json, HasSubstr("\"layer_sizes\":[4,2]"));
  EXPECT_THAT(json, HasSubstr("\"seed\":\"1\""));  // a uint64: a string

  // Read back, it is the config with every field present at its value.
  TrainingConfig read;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &read).ok())
      << json;
  const google::protobuf::Descriptor* descriptor = read.GetDescriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    if (field->is_repeated() ||
        field->cpp_type() ==
            google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      continue;
    }
    EXPECT_TRUE(read.GetReflection()->HasField(read, field)) << field->name();
  }
  EXPECT_EQ(read.backup_workers(), 1);
  EXPECT_EQ(read.seed(), config.seed());
  EXPECT_EQ(read.learning_rate(), config.learning_rate());
  EXPECT_EQ(read.max_staleness(), config.max_staleness());
  EXPECT_EQ(read.mode(), SYNC);
}

TEST(MetricsTest, JsonHasTheNetworkAndTheWholeConfig) {
  RunMetrics run;
  run.config.set_mode(DOWNPOUR);
  run.config.set_backup_workers(1);
  run.config.add_layer_sizes(4);
  run.config.add_layer_sizes(2);
  const std::string json = MetricsJson(run);
  EXPECT_THAT(json, HasSubstr("  \"network\": {\"layers\": \"dense 2\", "
                              "\"input_shape\": \"1x1x4\", \"parameters\": 10, "
                              "\"forward_flops_per_example\": "));
  EXPECT_THAT(json,
              HasSubstr("  \"config\": " + ConfigJson(run.config) + ",\n"));
}

TEST(MetricsTest, JsonHoldsTheDesignFieldsFromStatsAndCurve) {
  RunMetrics run;
  run.config.set_mode(DOWNPOUR);
  run.config.add_layer_sizes(4);
  run.config.add_layer_sizes(2);
  run.servers = 2;
  run.workers = 3;
  run.wall_time_s = 10;
  run.train_time_s = 8;
  run.trained_samples = 512;
  StatsResponse a = Shard({2, 2}, 1);
  a.set_samples(640);
  a.set_pushes(4);
  a.set_bytes_pushed(1000);
  a.set_bytes_pulled(300);
  StatsResponse b = Shard({4}, 0);
  b.set_samples(640);
  b.set_pushes(4);
  b.set_bytes_pushed(24);
  b.set_bytes_pulled(5);
  run.shard_stats = {a, b};
  EvalPoint* p = run.curve.add_points();
  p->set_time_s(1.5);
  p->set_samples(64);
  p->set_test_accuracy(0.5);
  p->set_test_loss(1.25);
  p = run.curve.add_points();
  p->set_time_s(9.5);
  p->set_samples(640);
  p->set_test_accuracy(0.875);
  p->set_test_loss(0.25);

  const std::string json = MetricsJson(run);
  EXPECT_THAT(json, HasSubstr("\"mode\": \"downpour\""));
  EXPECT_THAT(json, HasSubstr("\"servers\": 2,"));
  EXPECT_THAT(json, HasSubstr("\"workers\": 3,"));
  // The workers' own count over their training time, not the shards'
  // (640, which would count examples applied before a restart too).
  EXPECT_THAT(json, HasSubstr("\"wall_time_s\": 10,"));
  EXPECT_THAT(json, HasSubstr("\"train_time_s\": 8,"));
  EXPECT_THAT(json, HasSubstr("\"samples\": 512,"));
  EXPECT_THAT(json, HasSubstr("\"samples_per_s\": 64,"));
  EXPECT_THAT(json, HasSubstr("\"final_test_accuracy\": 0.875,"));
  EXPECT_THAT(json, HasSubstr("\"final_test_loss\": 0.25,"));
  EXPECT_THAT(json, HasSubstr("\"bytes_pushed\": 1024,"));
  EXPECT_THAT(json, HasSubstr("\"bytes_pulled\": 305,"));
  EXPECT_THAT(json, HasSubstr("\"bytes_total\": 1329,"));
  EXPECT_THAT(json, HasSubstr("\"pushes\": 4,"));
  // 8 pushes: 6 x 0, 2 x 1.
  EXPECT_THAT(json, HasSubstr("\"staleness\": {\"mean\": 0.25, \"p50\": 0, "
                              "\"p99\": 1, \"max\": 1}"));
  EXPECT_THAT(json, HasSubstr("{\"time_s\": 9.5, \"samples\": 640, "
                              "\"test_accuracy\": 0.875, \"test_loss\": 0.25, "
                              "\"bytes_pushed\": 0, \"bytes_pulled\": 0}"));
  EXPECT_THAT(json, HasSubstr("\"stopped_by_time_limit\": false,"));
  EXPECT_THAT(json, HasSubstr("\"restarts\": 0,"));
  EXPECT_THAT(json, HasSubstr("\"events\": [],"));
}

TEST(MetricsTest, JsonCountsRepeatsSkipsAndTheRunsEvents) {
  RunMetrics run;
  run.config.set_mode(SYNC);
  StatsResponse a = Shard({4}, 0);
  a.set_duplicate_pushes(3);
  a.set_backup_dropped_pushes(7);
  (*a.mutable_samples_skipped_by_worker())[1] = 128;
  StatsResponse b = Shard({4}, 0);
  b.set_duplicate_pushes(2);
  b.set_backup_dropped_pushes(7);
  (*b.mutable_samples_skipped_by_worker())[1] = 128;
  run.shard_stats = {a, b};
  run.restarts = 1;
  run.events = {{1.5, "kill worker 1 (SIGKILL)"}, {2.25, "say \"hi\"\\\n"}};
  const std::string json = MetricsJson(run);
  // Repeats are counted on every shard; a skipped batch once (shard 0).
  EXPECT_THAT(json, HasSubstr("\"duplicate_pushes\": 5,"));
  EXPECT_THAT(json, HasSubstr("\"samples_skipped\": 128,"));
  // Backup drops happen on every shard too.
  EXPECT_THAT(json, HasSubstr("\"backup_dropped_pushes\": 14,"));
  EXPECT_THAT(json, HasSubstr("\"restarts\": 1,"));
  EXPECT_THAT(
      json,
      HasSubstr("\"events\": [{\"time_s\": 1.5, \"what\": \"kill worker 1 "
                "(SIGKILL)\"}, {\"time_s\": 2.25, \"what\": "
                "\"say \\\"hi\\\"\\\\\\n\"}],"));
}

}  // namespace
}  // namespace monsoon::tools
