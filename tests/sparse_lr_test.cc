// Sparse logistic regression trained through two shards in the test
// process on generated click data (tools/click_data): the model must learn
// what the planted one knows.
#include "worker/sparse_lr.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "tests/local_shards.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"
#include "tools/click_data.h"

namespace monsoon::worker {
namespace {

using ::monsoon::testutil::IsOk;
using ::monsoon::testutil::ResolvedConfig;
using ::monsoon::testutil::StatusIs;
using ::testing::HasSubstr;

TEST(SparseLrTest, LearnsTheClickModelThroughTwoShards) {
  const std::string dir = testutil::FreshDir("click");
  tools::ClickDataOptions data;
  data.train_examples = 20000;
  data.test_examples = 4000;
  data.id_scale = 1e-3;
  absl::StatusOr<tools::PlantedResult> planted =
      tools::WriteClickData(data, dir);
  ASSERT_THAT(planted, IsOk());

  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [4, 2] mode: DOWNPOUR learning_rate: 0.1 "
      "sparse_tables { name: 'weights' dim: 1 init_scale: 0 "
      "max_rows: 100000 }");
  testutil::LocalCluster cluster(config, /*num_shards=*/2, /*num_workers=*/1);
  ASSERT_NE(cluster.client, nullptr);
  SparseLrOptions options;
  options.epochs = 3;
  // Before training every row is 0: p = 0.5 everywhere, AUC 0.5.
  absl::StatusOr<ClickMetrics> untrained =
      EvaluateSparseLr(cluster.client.get(), dir + "/test.libsvm", options);
  ASSERT_THAT(untrained, IsOk());
  EXPECT_EQ(untrained->examples, 4000);
  EXPECT_DOUBLE_EQ(untrained->auc, 0.5);
  EXPECT_NEAR(untrained->logloss, std::log(2.0), 1e-6);

  absl::StatusOr<SparseLrProgress> trained =
      TrainSparseLr(cluster.client.get(), dir + "/train.libsvm", options);
  ASSERT_THAT(trained, IsOk());
  EXPECT_EQ(trained->examples, 3 * 20000);
  EXPECT_EQ(trained->steps, 3 * ((20000 + 255) / 256));
  absl::StatusOr<ClickMetrics> metrics =
      EvaluateSparseLr(cluster.client.get(), dir + "/test.libsvm", options);
  ASSERT_THAT(metrics, IsOk());
  // The planted model is a logistic regression on these very features:
  // the trained one gets most of its AUC (0.70 of 0.75 here), and beats
  // the click rate alone (the log loss of predicting it everywhere).
  std::printf("trained: AUC %.4f, log loss %.4f; planted: %.4f, %.4f\n",
              metrics->auc, metrics->logloss, planted->test_auc,
              planted->test_logloss);
  const double ctr = planted->test_ctr;
  const double base_logloss =
      -(ctr * std::log(ctr) + (1 - ctr) * std::log(1 - ctr));
  EXPECT_GT(metrics->auc, planted->test_auc - 0.08)
      << "planted " << planted->test_auc;
  EXPECT_LT(metrics->logloss, base_logloss - 0.03);
  EXPECT_GE(metrics->logloss, planted->test_logloss - 0.02);
}

TEST(SparseLrTest, AMalformedLineStopsTrainingNamingIt) {
  const std::string path = testutil::TempPath("bad.libsvm");
  {
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("1 1:1\n0 2:x\n", f);
    std::fclose(f);
  }
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [4, 2] mode: DOWNPOUR sparse_tables { name: 'weights' "
      "dim: 1 max_rows: 10 }");
  testutil::LocalCluster cluster(config, 1, 1);
  ASSERT_NE(cluster.client, nullptr);
  EXPECT_THAT(TrainSparseLr(cluster.client.get(), path, SparseLrOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(path + ":2: a feature's value")));
}

}  // namespace
}  // namespace monsoon::worker
