// BatchStream: a worker's batches, and skipping the ones a restarted worker
// has already trained on.
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/model_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"
#include "worker/compute_backend.h"
#include "worker/cpu_backend.h"
#include "worker/dataset.h"
#include "worker/model/model.h"
#include "worker/training_loop.h"
#include "worker/worker_counters.h"

namespace monsoon::worker {
namespace {

using ::monsoon::testutil::ResolvedConfig;

// 50 examples of one value each, the value being the example's index: a
// batch's images name the examples in it.
Dataset Indexed() {
  Dataset data;
  data.size = 50;
  data.dim = 1;
  for (int i = 0; i < data.size; ++i) {
    data.images.push_back(static_cast<float>(i));
    data.labels.push_back(i % 10);
  }
  return data;
}

// Rank 1 of 2 gets 25 examples: 3 batches of 8 per epoch, 3 epochs.
constexpr char kConfig[] = "layer_sizes: [1, 10] batch_size: 8 epochs: 3";

std::vector<float> Images(const BatchStream& stream) {
  return std::vector<float>(stream.images(), stream.images() + 8);
}

TEST(BatchStreamTest, SkippingLandsOnTheBatchThatNextWouldGive) {
  const Dataset data = Indexed();
  const TrainingConfig config = ResolvedConfig(kConfig);
  for (int64_t skip = 0; skip < 9; ++skip) {
    SCOPED_TRACE(skip);
    ASSERT_OK_AND_ASSIGN(BatchStream walked,
                         BatchStream::Create(&data, config, 1, 2));
    ASSERT_OK_AND_ASSIGN(BatchStream skipped,
                         BatchStream::Create(&data, config, 1, 2));
    ASSERT_EQ(walked.total_steps(), 9);
    for (int64_t i = 0; i < skip; ++i) ASSERT_TRUE(walked.Next());
    ASSERT_TRUE(skipped.Skip(skip));
    // Every remaining batch is the same, epoch boundaries included.
    while (walked.Next()) {
      ASSERT_TRUE(skipped.Next());
      EXPECT_EQ(Images(skipped), Images(walked));
      EXPECT_EQ(skipped.epoch(), walked.epoch());
      EXPECT_EQ(skipped.step_in_epoch(), walked.step_in_epoch());
    }
    EXPECT_FALSE(skipped.Next());
  }
}

TEST(LearningRateScaleTest, StepsDownByTheFactorEveryDecayEpochs) {
  const TrainingConfig none = ResolvedConfig(kConfig);
  for (int epoch : {0, 1, 5, 100}) EXPECT_EQ(LearningRateScale(none, epoch), 1);
  const TrainingConfig halving = ResolvedConfig(
      "layer_sizes: [1, 10] lr_decay_epochs: 10 lr_decay_factor: 0.5");
  EXPECT_EQ(LearningRateScale(halving, 0), 1);
  EXPECT_EQ(LearningRateScale(halving, 9), 1);
  EXPECT_EQ(LearningRateScale(halving, 10), 0.5f);
  EXPECT_EQ(LearningRateScale(halving, 19), 0.5f);
  EXPECT_EQ(LearningRateScale(halving, 20), 0.25f);
  EXPECT_EQ(LearningRateScale(halving, 35), 0.125f);
  // The factor's default.
  const TrainingConfig tenth =
      ResolvedConfig("layer_sizes: [1, 10] lr_decay_epochs: 3");
  EXPECT_EQ(LearningRateScale(tenth, 2), 1);
  EXPECT_FLOAT_EQ(LearningRateScale(tenth, 3), 0.1f);
  EXPECT_FLOAT_EQ(LearningRateScale(tenth, 6), 0.01f);
}

// Every loop's gradients come from ComputeBatchGradients: each batch's are
// the plain gradients times the schedule's scale for the batch's epoch
// (halving every epoch here, exact in float).
TEST(ComputeBatchGradientsTest, ScalesEachEpochsGradientsByTheSchedule) {
  const Dataset data = Indexed();
  WorkerContext context;
  context.config = ResolvedConfig(
      "layer_sizes: [1, 10] batch_size: 8 epochs: 3 lr_decay_epochs: 1 "
      "lr_decay_factor: 0.5");
  context.rank = 1;
  context.num_workers = 2;
  context.train = &data;
  std::unique_ptr<ComputeBackend> backend = MakeCpuBackend(1);
  const common::ModelLayout layout =
      common::ModelLayout::FromConfig(context.config);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> model,
                       Model::Create(backend.get(), layout, 8));
  std::vector<float> params(layout.num_params());
  common::InitialValues(layout, 1, 0, absl::MakeSpan(params));
  ASSERT_OK(model->SetParams(params));
  context.model = model.get();
  ASSERT_OK_AND_ASSIGN(BatchStream batches, BatchStream::ForWorker(context));
  std::vector<float> plain(layout.num_params()), scaled(layout.num_params());
  int steps = 0;
  while (batches.Next()) {
    SCOPED_TRACE(absl::StrCat("epoch ", batches.epoch(), " step ",
                              batches.step_in_epoch()));
    model->set_gradient_scale(1);
    ASSERT_OK(model
                  ->ComputeGradients(batches.images(), batches.labels(),
                                     batches.batch_size())
                  .status());
    ASSERT_OK(model->GetGradients(absl::MakeSpan(plain)));
    ASSERT_OK(ComputeBatchGradients(context, batches).status());
    ASSERT_OK(model->GetGradients(absl::MakeSpan(scaled)));
    const float scale = 1.0f / static_cast<float>(1 << batches.epoch());
    for (size_t i = 0; i < plain.size(); ++i) {
      ASSERT_EQ(scaled[i], scale * plain[i]) << "parameter " << i;
    }
    ++steps;
  }
  EXPECT_EQ(steps, 9);
}

TEST(BatchStreamTest, SkippingPastTheEndLeavesNothing) {
  const Dataset data = Indexed();
  ASSERT_OK_AND_ASSIGN(
      BatchStream stream,
      BatchStream::Create(&data, ResolvedConfig(kConfig), 1, 2));
  EXPECT_TRUE(stream.Skip(9));
  EXPECT_FALSE(stream.Next());
  ASSERT_OK_AND_ASSIGN(
      BatchStream beyond,
      BatchStream::Create(&data, ResolvedConfig(kConfig), 1, 2));
  EXPECT_FALSE(beyond.Skip(10));
  EXPECT_FALSE(beyond.Next());
}

// A straggler (WorkerContext.slowdown) waits, after each step, slowdown - 1
// times the compute time that step's compute phase recorded.
TEST(ProgressLogTest, ASlowdownWaitsItsFactorLessOneOfEachStepsCompute) {
  const Dataset data = Indexed();
  WorkerContext context;
  context.config = ResolvedConfig(kConfig);
  context.log_interval = absl::ZeroDuration();
  WorkerCounters counters;
  context.counters = &counters;
  context.slowdown = 3;
  std::vector<absl::Duration> waits;
  context.sleep = [&](absl::Duration d) { waits.push_back(d); };
  ASSERT_OK_AND_ASSIGN(BatchStream batches,
                       BatchStream::Create(&data, context.config, 0, 1));
  ProgressLog progress(context, batches);
  auto& compute = counters.phases[static_cast<int>(Phase::kCompute)];
  compute.Observe(0.25);
  progress.Step(1.0, 8);
  compute.Observe(0.125);
  compute.Observe(0.5);  // two computations in one step (a local step)
  progress.Step(1.0, 8);
  progress.Step(1.0, 8);  // nothing computed: no wait
  EXPECT_THAT(waits, ::testing::ElementsAre(absl::Milliseconds(500),
                                            absl::Milliseconds(1250)));
  // Without a slowdown, nothing waits.
  context.slowdown = 1;
  ProgressLog plain(context, batches);
  compute.Observe(0.25);
  plain.Step(1.0, 8);
  EXPECT_EQ(waits.size(), 2u);
}

}  // namespace
}  // namespace monsoon::worker
