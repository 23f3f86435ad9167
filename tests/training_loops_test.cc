// Each mode's training loop through a fake client (no shards, no sockets):
// the pushes it makes (their examples, their base versions), riding out a
// lost shard, resuming where the shards say, and finishing.
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/model_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fake_parameter_client.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"
#include "worker/compute_backend.h"
#include "worker/cpu_backend.h"
#include "worker/model/model.h"
#include "worker/training_loop.h"

namespace monsoon::worker {
namespace {

using ::monsoon::testutil::FakeParameterClient;
using ::monsoon::testutil::ResolvedConfig;
using ::monsoon::testutil::StatusIs;
using ::testing::ElementsAre;

// 8 examples of 3 features, 2 classes.
Dataset TinyData() {
  Dataset data;
  data.size = 8;
  data.dim = 3;
  for (int i = 0; i < 8; ++i) {
    data.labels.push_back(i % 2);
    for (int f = 0; f < 3; ++f) {
      data.images.push_back(static_cast<float>((i + 1) * (f + 1)) / 24.0f);
    }
  }
  return data;
}

class TrainingLoopTest : public testing::TestWithParam<const char*> {
 protected:
  // One worker with batches of 2: 4 steps an epoch.
  void SetUp() override { SetUpWith(""); }

  void SetUpWith(const std::string& extra) {
    config_ = ResolvedConfig(absl::StrCat(
        "layer_sizes: [3, 2] batch_size: 2 epochs: 1 optimizer: SGD "
        "learning_rate: 0.5 momentum: 0 mode: ",
        GetParam(), " ", extra));
    const common::ModelLayout layout = common::ModelLayout::FromConfig(config_);
    backend_ = MakeCpuBackend(1);
    ASSERT_OK_AND_ASSIGN(
        model_, Model::Create(backend_.get(), layout, config_.batch_size()));
    std::vector<float> initial(layout.num_params());
    ASSERT_OK(model_->GetParams(absl::MakeSpan(initial)));
    client_ = std::make_unique<FakeParameterClient>(config_, 2, initial);
    context_.config = config_;
    context_.rank = 0;
    context_.num_workers = 1;
    context_.train = &data_;
    context_.model = model_.get();
    context_.client = client_.get();
    context_.log_interval = absl::ZeroDuration();
    context_.shard_lost_timeout = absl::Seconds(5);
  }

  absl::StatusOr<WorkerResult> Run() {
    std::unique_ptr<TrainingLoop> loop = MakeTrainingLoop(config_.mode());
    if (loop == nullptr) return absl::InternalError("no loop");
    return loop->Run(context_);
  }

  std::vector<int64_t> Offsets() const {
    std::vector<int64_t> offsets;
    for (const auto& push : client_->pushes()) {
      offsets.push_back(push.sample_offset);
    }
    return offsets;
  }

  const Dataset data_ = TinyData();
  TrainingConfig config_;
  std::unique_ptr<ComputeBackend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<FakeParameterClient> client_;
  WorkerContext context_;
};

TEST_P(TrainingLoopTest, PushesEachBatchOnceInOrderAndFinishes) {
  ASSERT_OK_AND_ASSIGN(WorkerResult result, Run());
  EXPECT_EQ(result.steps, 4);
  EXPECT_EQ(result.samples, 8);
  EXPECT_THAT(Offsets(), ElementsAre(0, 2, 4, 6));
  for (const auto& push : client_->pushes()) {
    EXPECT_EQ(push.samples, 2);
    EXPECT_TRUE(push.applied);
    EXPECT_FALSE(push.repeat);
  }
  EXPECT_THAT(client_->versions(), ElementsAre(4, 4));
  EXPECT_EQ(client_->reconnects(), 0);
}

TEST_P(TrainingLoopTest, ALostShardIsRiddenOutAndTheStepRepeated) {
  client_->FailNextPushes({absl::UnavailableError("shard 1 went away")});
  ASSERT_OK_AND_ASSIGN(WorkerResult result, Run());
  EXPECT_EQ(result.steps, 4);
  EXPECT_EQ(client_->reconnects(), 1);
  const auto pushes = client_->pushes();
  ASSERT_FALSE(pushes.empty());
  EXPECT_FALSE(pushes[0].applied);
  EXPECT_EQ(pushes[0].sample_offset, 0);
  if (config_.mode() == HOGWILD) {
    // A push is waited for during the next step, which runs again from its
    // pull once the shard is back; the lost push is not sent again (Hogwild
    // does not wait, nor repeat).
    EXPECT_THAT(Offsets(), ElementsAre(0, 2, 4, 6));
    ASSERT_EQ(pushes.size(), 4u);
    EXPECT_TRUE(pushes[1].repeat);
    EXPECT_THAT(client_->versions(), ElementsAre(3, 3));
    return;
  }
  // The lost push, then the same examples again, marked as a repeat.
  EXPECT_THAT(Offsets(), ElementsAre(0, 0, 2, 4, 6));
  ASSERT_EQ(pushes.size(), 5u);
  EXPECT_TRUE(pushes[1].applied);
  EXPECT_TRUE(pushes[1].repeat);
  EXPECT_FALSE(pushes[2].repeat);
  EXPECT_THAT(client_->versions(), ElementsAre(4, 4));
}

TEST_P(TrainingLoopTest, AnErrorThatIsNotALostShardEndsTheLoop) {
  client_->FailNextPushes({absl::InvalidArgumentError("value 3 is nan")});
  EXPECT_THAT(Run().status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(client_->reconnects(), 0);
}

TEST_P(TrainingLoopTest, ARestartedWorkerResumesWhereTheShardsSay) {
  client_->SetAppliedSamples(4);
  PlaceWorker(*client_, config_, /*resume=*/true, &context_);
  EXPECT_EQ(context_.resume_steps, 2);
  ASSERT_OK_AND_ASSIGN(WorkerResult result, Run());
  EXPECT_EQ(result.steps, 2);
  EXPECT_THAT(Offsets(), ElementsAre(4, 6));
}

INSTANTIATE_TEST_SUITE_P(Modes, TrainingLoopTest,
                         testing::Values("SYNC", "DOWNPOUR", "HOGWILD"));

}  // namespace
}  // namespace monsoon::worker
