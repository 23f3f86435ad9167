// The end of a run: FinishRun waits for every worker to finish, writes the
// metrics from the shards' counters and the evaluator's curve, and closes
// the run on every shard; FinishedRunMetrics on known numbers. Real shards
// on 127.0.0.1:0 in the test process.
#include "tools/k8s/run_finisher.h"

#include <google/protobuf/text_format.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/local_shards.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"
#include "worker/ps_client.h"

namespace monsoon::tools {
namespace {

using ::monsoon::testutil::StatusIs;
using ::testing::HasSubstr;

constexpr char kConfig[] = "layer_sizes: [6, 5, 3] mode: DOWNPOUR";

std::string CurveFile(const std::string& name, bool run_finished) {
  EvalCurve curve;
  EvalPoint* point = curve.add_points();
  point->set_time_s(3);
  point->set_samples(128);
  point->set_test_accuracy(0.625);
  point->set_test_loss(1.5);
  curve.set_run_finished(run_finished);
  std::string text;
  google::protobuf::TextFormat::PrintToString(curve, &text);
  const std::string path = testutil::TempPath(name);
  testutil::WriteFile(path, text);
  return path;
}

std::unique_ptr<worker::PsClient> Finisher(
    const testutil::LocalCluster& cluster, const TrainingConfig& config) {
  absl::StatusOr<std::unique_ptr<worker::PsClient>> client =
      worker::PsClient::Connect(
          testutil::ClientOptions(cluster.servers, config, /*rank=*/-1));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

TEST(RunFinisherTest, WritesTheMetricsAndClosesTheRunOnceEveryWorkerFinished) {
  const TrainingConfig config = testutil::ResolvedConfig(kConfig);
  testutil::LocalCluster cluster(config, /*num_shards=*/2, /*num_workers=*/1);
  ASSERT_NE(cluster.client, nullptr);
  std::unique_ptr<worker::PsClient> finisher = Finisher(cluster, config);
  ASSERT_NE(finisher, nullptr);
  ASSERT_OK(cluster.client->Leave(absl::Seconds(5), /*finished=*/true));

  FinishOptions options;
  options.config = config;
  options.curve_path = CurveFile("finished_curve.textproto", true);
  options.metrics_out = testutil::TempPath("finished_metrics.json");
  options.poll = absl::Milliseconds(50);
  ASSERT_OK(FinishRun(finisher.get(), options));

  std::string json;
  ASSERT_TRUE(testutil::ReadFile(options.metrics_out, &json));
  EXPECT_THAT(json, HasSubstr("\"servers\": 2,"));
  EXPECT_THAT(json, HasSubstr("\"workers\": 1,"));
  EXPECT_THAT(json, HasSubstr("\"final_test_accuracy\": 0.625,"));
  EXPECT_THAT(json, HasSubstr("\"mode\": \"downpour\""));
  for (const auto& server : cluster.servers) {
    EXPECT_TRUE(server->run_closed().HasBeenNotified());
    EXPECT_TRUE(server->state()->Stats().run_closed());
  }
}

TEST(RunFinisherTest, AWorkerThatStopsEarlyDoesNotFinishTheRun) {
  const TrainingConfig config = testutil::ResolvedConfig(kConfig);
  testutil::LocalCluster cluster(config, /*num_shards=*/2, /*num_workers=*/1);
  ASSERT_NE(cluster.client, nullptr);
  std::unique_ptr<worker::PsClient> finisher = Finisher(cluster, config);
  ASSERT_NE(finisher, nullptr);
  ASSERT_OK(cluster.client->Leave(absl::Seconds(5), /*finished=*/false));

  // The shards refuse to close a run whose worker has not finished...
  EXPECT_THAT(finisher->CloseRun(absl::Seconds(5)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("rank(s) 0 have not")));
  // ... and the finisher keeps waiting until it is stopped.
  absl::Notification stop;
  stop.Notify();
  FinishOptions options;
  options.config = config;
  options.curve_path = CurveFile("unfinished_curve.textproto", false);
  options.metrics_out = testutil::TempPath("unfinished_metrics.json");
  options.poll = absl::Milliseconds(50);
  options.stop = &stop;
  EXPECT_THAT(FinishRun(finisher.get(), options),
              StatusIs(absl::StatusCode::kCancelled));
  std::string json;
  EXPECT_FALSE(testutil::ReadFile(options.metrics_out, &json));
  for (const auto& server : cluster.servers) {
    EXPECT_FALSE(server->run_closed().HasBeenNotified());
  }
}

TEST(RunFinisherTest, AWorkerKnowsWhetherItsRankFinished) {
  const TrainingConfig config = testutil::ResolvedConfig(kConfig);
  testutil::LocalCluster cluster(config, /*num_shards=*/2, /*num_workers=*/2);
  ASSERT_NE(cluster.client, nullptr);
  EXPECT_THAT(cluster.client->RankFinished(absl::Seconds(5)),
              testutil::IsOkAndHolds(false));
  ASSERT_OK(cluster.client->Leave(absl::Seconds(5), /*finished=*/false));
  EXPECT_THAT(cluster.client->RankFinished(absl::Seconds(5)),
              testutil::IsOkAndHolds(false));
  ASSERT_OK(cluster.client->Leave(absl::Seconds(5), /*finished=*/true));
  EXPECT_THAT(cluster.client->RankFinished(absl::Seconds(5)),
              testutil::IsOkAndHolds(true));
}

TEST(RunFinisherTest, OnlyTheFinisherClosesTheRun) {
  const TrainingConfig config = testutil::ResolvedConfig(kConfig);
  testutil::LocalCluster cluster(config, /*num_shards=*/1, /*num_workers=*/1);
  ASSERT_NE(cluster.client, nullptr);
  EXPECT_THAT(
      cluster.client->CloseRun(absl::Seconds(5)),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rank -1")));
}

TEST(FinishedRunMetricsTest, TimesRunFromTheFirstPushToTheLastFinish) {
  std::vector<StatsResponse> shards(2);
  shards[0].set_samples(6000);
  shards[0].add_finished_ranks(0);
  shards[0].add_finished_ranks(1);
  shards[0].set_first_push_unix_s(1000);
  shards[0].set_workers_finished_unix_s(1030);
  shards[1].set_samples(6000);
  shards[1].set_first_push_unix_s(1001);
  shards[1].set_workers_finished_unix_s(1040);
  const RunMetrics run = FinishedRunMetrics(testutil::ResolvedConfig(kConfig),
                                            shards, EvalCurve());
  EXPECT_EQ(run.servers, 2);
  EXPECT_EQ(run.workers, 2);
  EXPECT_EQ(run.trained_samples, 6000);
  EXPECT_DOUBLE_EQ(run.train_time_s, 40);
  EXPECT_DOUBLE_EQ(run.wall_time_s, 40);
  EXPECT_THAT(MetricsJson(run), HasSubstr("\"samples_per_s\": 150,"));
}

}  // namespace
}  // namespace monsoon::tools
