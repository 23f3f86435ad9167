// A worker's ride over a shard that went back: a shard restored from an older
// checkpoint before the worker noticed refuses a push computed from weights
// it no longer has (ABORTED), and the worker pulls again and carries on
// (worker/training_loop.h: ShardLost, RidingOut) instead of exiting.
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/config.h"
#include "common/model_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/local_shards.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"
#include "worker/ps_client.h"
#include "worker/training_loop.h"

namespace monsoon::worker {
namespace {

using ::monsoon::testutil::ResolvedConfig;
using ::monsoon::testutil::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(RidingOutTest, AbortedAndUnavailableAreALostShardOtherErrorsAreNot) {
  WorkerContext context;
  EXPECT_TRUE(ShardLost(context, absl::UnavailableError("gone")));
  EXPECT_TRUE(ShardLost(context, absl::AbortedError("went back")));
  EXPECT_TRUE(ShardLost(context, absl::CancelledError("shard shut down")));
  EXPECT_FALSE(ShardLost(context, absl::InvalidArgumentError("nan")));
  EXPECT_FALSE(ShardLost(context, absl::DeadlineExceededError("barrier")));
}

TEST(RidingOutTest, APushFromWeightsTheShardNoLongerHasIsPulledAgainAndPushed) {
  const TrainingConfig config =
      ResolvedConfig("layer_sizes: [3, 2] mode: DOWNPOUR optimizer: SGD "
                     "learning_rate: 0.5 momentum: 0");
  testutil::LocalCluster cluster(config, 1, 1);
  ASSERT_NE(cluster.client, nullptr);
  const size_t p = common::ModelLayout::FromConfig(config).num_params();
  const std::vector<float> initial = cluster.Weights(0);
  const std::vector<float> grad(p, 1.0f);

  // The worker holds version 3's weights; the shard is at version 0, as
  // after a restore from an older checkpoint.
  EXPECT_THAT(cluster.client->Push(grad, {3}, 8),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("only at version 0: the shard went back")));
  EXPECT_EQ(cluster.Weights(0), initial);

  WorkerContext context;
  context.client = cluster.client.get();
  context.shard_lost_timeout = absl::Seconds(30);
  std::vector<int64_t> versions = {3};
  std::vector<float> pulled(p);
  int pushes = 0;
  int pulls = 0;
  ASSERT_OK(RidingOut(
      context,
      [&] {
        ++pushes;
        return cluster.client->Push(grad, versions, 8);
      },
      [&] {
        ++pulls;
        return cluster.client->Pull(0, absl::Seconds(10),
                                    absl::MakeSpan(pulled), &versions);
      }));
  EXPECT_EQ(pushes, 2);
  EXPECT_EQ(pulls, 1);
  EXPECT_THAT(versions, ElementsAre(0));
  EXPECT_EQ(pulled, initial);
  // The second push, from version 0, applied once: w - 0.5 * g.
  std::vector<float> expected = initial;
  for (float& w : expected) w -= 0.5f;
  EXPECT_EQ(cluster.Weights(1), expected);
}

}  // namespace
}  // namespace monsoon::worker
