// Sparse logistic regression (model SPARSE_LR) trained through shards in the
// test process: one step's exact update, and two sync workers on generated
// click data (tools/click_data) that must learn what the planted model
// knows.
#include "worker/sparse_lr.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/local_shards.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"
#include "tools/click_data.h"
#include "worker/dataset.h"
#include "worker/script_worker.h"

namespace monsoon::worker {
namespace {

using ::monsoon::testutil::IsOk;
using ::monsoon::testutil::IsOkAndHolds;
using ::monsoon::testutil::ResolvedConfig;
using ::monsoon::testutil::StatusIs;
using ::testing::HasSubstr;

// Writes `text` to a new file `name`; its path.
std::string WriteFile(const std::string& name, const char* text) {
  const std::string path = testutil::TempPath(name);
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs(text, f);
  std::fclose(f);
  return path;
}

// Trains rank `rank` of `num_workers` on `path` through `client`.
absl::StatusOr<WorkerResult> Train(PsClient* client,
                                   const TrainingConfig& config,
                                   const std::string& path, int rank,
                                   int num_workers) {
  absl::StatusOr<std::unique_ptr<ScriptWorker>> dense =
      ScriptWorker::Create(client, config, rank, num_workers);
  if (!dense.ok()) return dense.status();
  SparseLrOptions options;
  options.rank = rank;
  options.num_workers = num_workers;
  options.log_interval = absl::ZeroDuration();
  WorkerResult progress;
  return TrainSparseLr(client, dense->get(), config, path, options, &progress,
                       (*dense)->mutable_counters());
}

TEST(SparseLrTest, AStepMovesDenseWeightsAndRowsByTheGradient) {
  // Two examples, every weight 0 before: p = 0.5 for both, so each
  // example's gradient factor is (0.5 - y) / 2: -0.25 for the click,
  // +0.25 for the other. Id 0 is a dense parameter (index 1); 100 and 200
  // are rows; 100 appears in both examples and its gradients cancel.
  const std::string path =
      WriteFile("step.libsvm", "1 0:1 100:1\n0 100:1 200:2\n");
  const TrainingConfig config = ResolvedConfig(
      "model: SPARSE_LR mode: SYNC learning_rate: 0.5 momentum: 0 "
      "batch_size: 2 epochs: 1 sparse_tables { name: 'weights' dim: 1 "
      "init_scale: 0 max_rows: 100 optimizer: SPARSE_SGD }");
  testutil::LocalCluster cluster(config, /*num_shards=*/2, /*num_workers=*/1);
  ASSERT_NE(cluster.client, nullptr);
  absl::StatusOr<WorkerResult> trained =
      Train(cluster.client.get(), config, path, 0, 1);
  ASSERT_THAT(trained, IsOk());
  EXPECT_EQ(trained->steps, 1);
  EXPECT_EQ(trained->samples, 2);
  // The step's end, and the gap up to it (the report's max_step_gap_s).
  EXPECT_EQ(trained->first_step_end, trained->last_step);
  EXPECT_GT(trained->max_step_gap, absl::ZeroDuration());
  EXPECT_LE(trained->max_step_gap, trained->elapsed);
  // Dense: the bias's gradient is -0.25 + 0.25 = 0; id 0's is -0.25, so
  // it moves by 0.5 * 0.25 (sync's SGD without momentum).
  const std::vector<float> dense = cluster.Weights(1);
  ASSERT_EQ(dense.size(), 64u);
  EXPECT_EQ(dense[0], 0.0f);
  EXPECT_EQ(dense[1], 0.125f);
  for (size_t i = 2; i < dense.size(); ++i) EXPECT_EQ(dense[i], 0.0f) << i;
  // Rows: 100's gradients summed to 0; 200's is 0.25 * 2, applied once at
  // the run's rate: -0.25.
  std::vector<float> rows(3, 1.0f);
  ASSERT_THAT(cluster.client->SparsePull("weights", {100, 200, 0},
                                         absl::MakeSpan(rows),
                                         absl::Seconds(10)),
              IsOk());
  EXPECT_EQ(rows[0], 0.0f);
  EXPECT_EQ(rows[1], -0.25f);
  EXPECT_EQ(rows[2], 0.0f);  // id 0 has no row: it never went there
}

// Two workers train 3 epochs of generated click data in `config_text`'s
// mode through two shards; the result must learn what the planted model
// knows.
void TwoWorkersLearnTheClickModel(const std::string& config_text) {
  const std::string dir = testutil::FreshDir("click");
  tools::ClickDataOptions data;
  data.train_examples = 20000;
  data.test_examples = 4000;
  data.id_scale = 1e-3;
  absl::StatusOr<tools::PlantedResult> planted =
      tools::WriteClickData(data, dir);
  ASSERT_THAT(planted, IsOk());

  const TrainingConfig config = ResolvedConfig(config_text);
  testutil::LocalCluster cluster(config, /*num_shards=*/2, /*num_workers=*/2);
  ASSERT_NE(cluster.client, nullptr);
  absl::StatusOr<std::unique_ptr<PsClient>> second = PsClient::Connect(
      testutil::ClientOptions(cluster.servers, config, /*rank=*/1));
  ASSERT_THAT(second, IsOk());
  absl::StatusOr<SparseExamples> test = LoadSparseExamples(dir + "/test.libsvm");
  ASSERT_THAT(test, IsOk());
  const std::vector<float> zeros(64, 0.0f);
  // Before training every weight is 0: p = 0.5 everywhere, AUC 0.5.
  absl::StatusOr<ClickMetrics> untrained = EvaluateSparseLr(
      cluster.client.get(), *test, zeros, 1000, absl::Seconds(30));
  ASSERT_THAT(untrained, IsOk());
  EXPECT_EQ(untrained->examples, 4000);
  EXPECT_DOUBLE_EQ(untrained->auc, 0.5);
  EXPECT_NEAR(untrained->logloss, std::log(2.0), 1e-6);

  absl::StatusOr<WorkerResult> rank1;
  std::thread other([&] {
    rank1 = Train(second->get(), config, dir + "/train.libsvm", 1, 2);
  });
  absl::StatusOr<WorkerResult> rank0 =
      Train(cluster.client.get(), config, dir + "/train.libsvm", 0, 2);
  other.join();
  ASSERT_THAT(rank0, IsOk());
  ASSERT_THAT(rank1, IsOk());
  // Each rank: 10,000 examples an epoch, 39 whole batches of 256.
  EXPECT_EQ(rank0->steps, 3 * 39);
  EXPECT_EQ(rank1->samples, 3 * 39 * 256);
  absl::StatusOr<EvalPoint> point =
      SparseLrEvaluator(cluster.client.get(), *std::move(test), absl::Now())
          .EvaluateNow();
  ASSERT_THAT(point, IsOk());
  // The planted model is a logistic regression on these very features:
  // the trained one gets most of its AUC, and beats the click rate alone
  // (the log loss of predicting it everywhere).
  std::printf("trained: AUC %.4f, log loss %.4f; planted: %.4f, %.4f\n",
              point->test_auc(), point->test_loss(), planted->test_auc,
              planted->test_logloss);
  const double ctr = planted->test_ctr;
  const double base_logloss =
      -(ctr * std::log(ctr) + (1 - ctr) * std::log(1 - ctr));
  EXPECT_GT(point->test_auc(), planted->test_auc - 0.08)
      << "planted " << planted->test_auc;
  EXPECT_LT(point->test_loss(), base_logloss - 0.03);
  EXPECT_GE(point->test_loss(), planted->test_logloss - 0.02);
  EXPECT_GT(point->test_accuracy(), 1 - ctr);
  EXPECT_EQ(point->samples(), 2 * 3 * 39 * 256);
}

TEST(SparseLrTest, TwoSyncWorkersLearnTheClickModelThroughTwoShards) {
  TwoWorkersLearnTheClickModel(
      "model: SPARSE_LR mode: SYNC learning_rate: 0.1 momentum: 0 "
      "batch_size: 256 epochs: 3");
}

// The hybrid: rows sent on their own thread while the dense push waits at
// the barrier.
TEST(SparseLrTest, TheHybridLearnsTooWithRowsAsynchronous) {
  TwoWorkersLearnTheClickModel(
      "model: SPARSE_LR mode: SYNC learning_rate: 0.1 momentum: 0 "
      "batch_size: 256 epochs: 3 sparse_rows_async: true");
}

TEST(SparseLrTest, DownpourWorkersLearnTheClickModelToo) {
  TwoWorkersLearnTheClickModel(
      "model: SPARSE_LR mode: DOWNPOUR batch_size: 256 epochs: 3");
}

TEST(SparseLrTest, AMalformedLineStopsTrainingNamingIt) {
  const std::string path = WriteFile("bad.libsvm", "1 100:1\n0 200:x\n");
  const TrainingConfig config = ResolvedConfig(
      "model: SPARSE_LR mode: DOWNPOUR batch_size: 1 sparse_tables { name: "
      "'weights' dim: 1 max_rows: 10 }");
  testutil::LocalCluster cluster(config, 1, 1);
  ASSERT_NE(cluster.client, nullptr);
  EXPECT_THAT(Train(cluster.client.get(), config, path, 0, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(path + ":2: a feature's value")));
}

TEST(SparseLrTest, TooFewExamplesForABatchPerWorkerIsRefused) {
  const std::string path = WriteFile("few.libsvm", "1 100:1\n0 200:1\n");
  const TrainingConfig config = ResolvedConfig(
      "model: SPARSE_LR mode: DOWNPOUR batch_size: 2");
  testutil::LocalCluster cluster(config, 1, 2);
  ASSERT_NE(cluster.client, nullptr);
  EXPECT_THAT(Train(cluster.client.get(), config, path, 0, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("holds 2 examples: fewer than one batch")));
}

TEST(SparseLrTest, LibsvmFilesAreFoundPlainOrGzippedAndNamedWhenMissing) {
  const std::string dir = testutil::FreshDir("libsvm_files");
  WriteFile("libsvm_files/train.libsvm.gz", "");
  EXPECT_THAT(LibsvmFile(dir, "train"), IsOkAndHolds(dir + "/train.libsvm.gz"));
  WriteFile("libsvm_files/train.libsvm", "");
  EXPECT_THAT(LibsvmFile(dir, "train"), IsOkAndHolds(dir + "/train.libsvm"));
  EXPECT_THAT(LibsvmFile(dir, "test"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr(dir + "/test.libsvm (nor")));
  TrainingConfig config = ResolvedConfig("model: SPARSE_LR");
  config.set_data_dir(dir);
  EXPECT_THAT(CheckDataFilesFor(config),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("test.libsvm")));
  WriteFile("libsvm_files/test.libsvm", "1 5:1\n\n# a comment\n0 6:1\n");
  EXPECT_THAT(CheckDataFilesFor(config), IsOk());
  EXPECT_THAT(CountLibsvmExamples(dir + "/test.libsvm"), IsOkAndHolds(2));
}

}  // namespace
}  // namespace monsoon::worker
