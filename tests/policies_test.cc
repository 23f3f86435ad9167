// The shard's policies (server/policies/) on known numbers.
#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "common/onebit.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/policies/compressed_pulls.h"
#include "server/policies/delay_compensation.h"
#include "server/policies/policy_factory.h"
#include "server/policies/staleness_bound.h"
#include "server/policies/staleness_rate.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace monsoon::server {
namespace {

using ::monsoon::testutil::ResolvedConfig;
using ::monsoon::testutil::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

WeightsPtr MakeWeights(const std::vector<float>& values, int64_t version) {
  // The buffer keeps its pool's shared part alive.
  FloatBufferPool pool(values.size());
  auto weights = std::make_shared<Weights>(version, pool.Take(), values.size());
  std::copy(values.begin(), values.end(), weights->mutable_data());
  return weights;
}

TEST(StalenessBoundTest, HoldsAWorkerTooFarAheadOfTheSlowestLiveOne) {
  const StalenessBound bound(/*max_staleness=*/1, /*num_workers=*/3,
                             /*batch_size=*/4);
  // Clocks: 12 / 4 = 3, 4 / 4 = 1, 30 / 4 = 7 (rank 2 is not live).
  const StalenessBound::Clocks clocks =
      bound.Read({{0, 12}, {1, 4}, {2, 30}}, {true, true, false});
  EXPECT_THAT(clocks.of_rank, ElementsAre(3, 1, 7));
  EXPECT_EQ(clocks.slowest, 1);
  EXPECT_EQ(clocks.slowest_rank, 1);
  EXPECT_FALSE(bound.Allows(clocks, 0));  // 3 - 1 > 1
  EXPECT_TRUE(bound.Allows(clocks, 1));
  EXPECT_TRUE(bound.Allows(clocks, -1));  // an evaluator
  EXPECT_EQ(bound.DescribeWait(clocks, 0),
            "rank 0 at step 3 waits for rank 1 at step 1");
  // Without a live worker nothing waits.
  EXPECT_TRUE(bound.Allows(bound.Read({{0, 12}}, {false, false, false}), 0));
}

TEST(StalenessAwareRateTest, DividesTheRateByTheStaleness) {
  const StalenessAwareRate on(true), off(false);
  EXPECT_EQ(on.Scale(4), 0.25f);
  EXPECT_EQ(on.Scale(0), 1.0f);  // max(1, s)
  EXPECT_EQ(off.Scale(4), 1.0f);
  EXPECT_EQ(on.Rate(0.3f, 3), 0.3f / 3.0f);
  EXPECT_EQ(off.Rate(0.3f, 3), 0.3f);
}

TEST(DelayCompensationTest, AddsLambdaGSquaredTimesTheWeightsMove) {
  DelayCompensation compensation(/*lambda=*/0.5f);
  const std::vector<float> g = {1.0f, -2.0f};
  const std::vector<float> now = {3.0f, 5.0f};
  std::vector<float> out;
  // No pull of rank 0 seen: nothing to compensate against.
  compensation.Compensate(0, g, now.data(), &out);
  EXPECT_THAT(out, ElementsAre(1.0f, -2.0f));
  compensation.Pulled(0, MakeWeights({1.0f, 6.0f}, 3));
  compensation.Compensate(0, g, now.data(), &out);
  // 1 + 0.5 * 1 * (3 - 1) = 2; -2 + 0.5 * 4 * (5 - 6) = -4.
  EXPECT_THAT(out, ElementsAre(2.0f, -4.0f));
}

// A worker that left is forgotten: its push, unless it pulls again first,
// is applied as it came.
TEST(DelayCompensationTest, ALeaversLastPullIsDropped) {
  DelayCompensation compensation(/*lambda=*/0.5f);
  compensation.Pulled(0, MakeWeights({1.0f, 6.0f}, 3));
  compensation.Pulled(1, MakeWeights({1.0f, 6.0f}, 3));
  EXPECT_EQ(compensation.workers(), 2);
  compensation.Drop(0);
  compensation.Drop(0);  // a second drop changes nothing
  EXPECT_EQ(compensation.workers(), 1);
  const std::vector<float> g = {1.0f, -2.0f};
  const std::vector<float> now = {3.0f, 5.0f};
  std::vector<float> out;
  compensation.Compensate(0, g, now.data(), &out);
  EXPECT_THAT(out, ElementsAre(1.0f, -2.0f));
  compensation.Compensate(1, g, now.data(), &out);
  EXPECT_THAT(out, ElementsAre(2.0f, -4.0f));
}

// What a worker holding its copy does with a delta: adds the decoding.
std::vector<float> Apply(const EncodedDelta& delta, std::vector<float> copy,
                         int bucket_size) {
  std::vector<float> decoded(copy.size());
  EXPECT_OK(common::OneBitDecode(delta.bits, delta.scales, bucket_size,
                                 absl::MakeSpan(decoded)));
  for (size_t i = 0; i < copy.size(); ++i) copy[i] = copy[i] + decoded[i];
  return copy;
}

TEST(WorkerPullCopiesTest, ADeltaTakesTheWorkersCopyToTheShardsBitForBit) {
  WorkerPullCopies copies(/*bucket_size=*/2);
  const WeightsPtr first = MakeWeights({1.0f, 2.0f, 3.0f, 4.0f}, 5);
  // A first pull is a full one.
  EXPECT_EQ(copies.DeltaFor(0, std::nullopt, first), nullptr);
  const WeightsPtr second = MakeWeights({1.5f, 1.0f, 3.25f, 4.0f}, 9);
  std::shared_ptr<const EncodedDelta> delta =
      copies.DeltaFor(0, /*have_version=*/5, second);
  ASSERT_NE(delta, nullptr);
  EXPECT_EQ(delta->base_version, 5);
  EXPECT_EQ(delta->version, 9);
  const std::vector<float> worker = Apply(*delta, {1.0f, 2.0f, 3.0f, 4.0f}, 2);
  // The next delta starts from that copy: a worker that says it holds
  // version 9 gets a delta from it; one that names another, a full pull.
  EXPECT_EQ(copies.DeltaFor(0, /*have_version=*/7, second), nullptr);
  ASSERT_NE(copies.DeltaFor(0, /*have_version=*/9, second), nullptr);
  EXPECT_THAT(worker, testing::SizeIs(4));
}

// A worker that left has its copy and residual dropped; if the rank comes
// back, even naming the version it held, its first pull is a full one.
TEST(WorkerPullCopiesTest, ALeaversCopyIsDroppedAndItsNextPullIsFull) {
  WorkerPullCopies copies(/*bucket_size=*/2);
  const WeightsPtr first = MakeWeights({1.0f, 2.0f, 3.0f, 4.0f}, 5);
  EXPECT_EQ(copies.DeltaFor(0, std::nullopt, first), nullptr);
  EXPECT_EQ(copies.DeltaFor(1, std::nullopt, first), nullptr);
  EXPECT_EQ(copies.workers(), 2);
  copies.Drop(1);
  EXPECT_EQ(copies.workers(), 1);
  const WeightsPtr second = MakeWeights({1.5f, 1.0f, 3.25f, 4.0f}, 9);
  EXPECT_EQ(copies.DeltaFor(1, /*have_version=*/5, second), nullptr);
  EXPECT_EQ(copies.workers(), 2);
  // The one that stayed still gets a difference.
  EXPECT_NE(copies.DeltaFor(0, /*have_version=*/5, second), nullptr);
}

TEST(StepPullEncoderTest, TheShardsStepIsWhatAWorkerGetsFromTheDelta) {
  StepPullEncoder encoder(/*bucket_size=*/2, /*size=*/4);
  const std::vector<float> previous = {1.0f, 2.0f, 3.0f, 4.0f};
  std::vector<float> step = {1.5f, 1.0f, 3.25f, 4.0f};
  encoder.EncodeStep(previous, step.data(), /*version=*/8);
  std::shared_ptr<const EncodedDelta> delta = encoder.DeltaFor(7, 8);
  ASSERT_NE(delta, nullptr);
  EXPECT_EQ(Apply(*delta, previous, 2), step);
  // Only a worker at the step before, while the shard is at this step.
  EXPECT_EQ(encoder.DeltaFor(6, 8), nullptr);
  EXPECT_EQ(encoder.DeltaFor(7, 9), nullptr);
  EXPECT_EQ(encoder.DeltaFor(std::nullopt, 8), nullptr);
  encoder.Reset();
  EXPECT_EQ(encoder.DeltaFor(7, 8), nullptr);
}

TEST(PolicyFactoryTest, BuildsWhatTheConfigTurnsOn) {
  const ShardPolicies sync =
      MakePolicies(ResolvedConfig("layer_sizes: [3, 2] mode: SYNC "
                                  "pull_compression: COMPRESSION_ONEBIT"),
                   2, 8);
  EXPECT_NE(sync.step_pulls, nullptr);
  EXPECT_EQ(sync.worker_pulls, nullptr);
  EXPECT_EQ(sync.delay_compensation, nullptr);
  EXPECT_FALSE(sync.staleness_bound.has_value());
  const ShardPolicies downpour = MakePolicies(
      ResolvedConfig("layer_sizes: [3, 2] mode: DOWNPOUR staleness_lr: true "
                     "delay_compensation: 0.1 max_staleness: 2"),
      2, 8);
  EXPECT_EQ(downpour.step_pulls, nullptr);
  EXPECT_EQ(downpour.worker_pulls, nullptr);
  EXPECT_NE(downpour.delay_compensation, nullptr);
  EXPECT_TRUE(downpour.staleness_rate.on());
  ASSERT_TRUE(downpour.staleness_bound.has_value());
  EXPECT_EQ(downpour.staleness_bound->max_staleness(), 2);
}

TEST(PolicyFactoryTest, RefusesPerWorkerCopiesThatDoNotFitSayingWhatToDo) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [3, 2] mode: DOWNPOUR "
      "pull_compression: COMPRESSION_ONEBIT");
  // 2 arrays x 4 workers x 1 Mi parameters x 4 bytes = 32 MiB.
  EXPECT_THAT(CheckPolicyMemory(config, 4, 1 << 20, 0, /*needed=*/16 << 20,
                                /*memory=*/40 << 20),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("2 x 4 x 1048576 parameters = 32 MiB on "
                                 "shard 0, which with its 16 MiB does not fit "
                                 "the 40 MiB of memory this process may "
                                 "use")));
  EXPECT_OK(CheckPolicyMemory(config, 4, 1 << 20, 0, 16 << 20, 48 << 20));
  EXPECT_OK(CheckPolicyMemory(config, 4, 1 << 20, 0, 16 << 20, 0));
}

}  // namespace
}  // namespace monsoon::server
