// A worker's ride over a shard that went back: a shard restored from an older
// checkpoint before the worker noticed refuses a push computed from weights
// it no longer has (ABORTED), and the worker pulls again and carries on
// (worker/training_loop.h: ShardLost, RidingOut) instead of exiting.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/config.h"
#include "common/model_layout.h"
#include "common/wire.h"
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

// `mode` with plain SGD at rate 0.5 on the shards, so that a step's weights
// are known exactly.
TrainingConfig PlainSgd(const std::string& mode) {
  return ResolvedConfig(absl::StrCat("layer_sizes: [3, 2] mode: ", mode,
                                     " optimizer: SGD learning_rate: 0.5 "
                                     "momentum: 0"));
}

TEST(RidingOutTest, AbortedAndUnavailableAreALostShardOtherErrorsAreNot) {
  WorkerContext context;
  EXPECT_TRUE(ShardLost(context, absl::UnavailableError("gone")));
  EXPECT_TRUE(ShardLost(context, absl::AbortedError("went back")));
  EXPECT_TRUE(ShardLost(context, absl::CancelledError("shard shut down")));
  EXPECT_FALSE(ShardLost(context, absl::InvalidArgumentError("nan")));
  EXPECT_FALSE(ShardLost(context, absl::DeadlineExceededError("barrier")));
}

TEST(RidingOutTest, APushFromWeightsTheShardNoLongerHasIsPulledAgainAndPushed) {
  const TrainingConfig config = PlainSgd("DOWNPOUR");
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

// A step refused again and again although each retry follows a pull is not
// a shard that went back but a loop that pushes from stale versions: it
// ends, rather than riding out forever.
TEST(RidingOutTest, AStepAbortedAgainAfterEveryPullEndsInternal) {
  const TrainingConfig config = PlainSgd("DOWNPOUR");
  testutil::LocalCluster cluster(config, 1, 1);
  ASSERT_NE(cluster.client, nullptr);
  WorkerContext context;
  context.client = cluster.client.get();
  context.shard_lost_timeout = absl::Seconds(30);
  int steps = 0;
  int resyncs = 0;
  EXPECT_THAT(
      RidingOut(
          context,
          [&] {
            ++steps;
            return absl::AbortedError("shard 0 is only at version 0");
          },
          [&] {
            ++resyncs;
            return absl::OkStatus();
          }),
      StatusIs(absl::StatusCode::kInternal,
               HasSubstr("refused this worker's step 4 times in a row")));
  EXPECT_EQ(steps, kMaxAbortedInARow + 1);
  EXPECT_EQ(resyncs, kMaxAbortedInARow);
}

// Float32 `value` in every parameter, pushed by `client` to its one shard as
// step 0 with examples 0+8 (StartPush: an explicit offset, which
// PsClient::Push does not take).
absl::Status PushStepZero(PsClient* client, size_t params, float value) {
  const std::vector<float> grad(params, value);
  common::BufferLease lease;
  absl::Status status;
  {
    std::unique_ptr<ShardedPush> push =
        client->StartPush({0}, 8, /*sample_offset=*/0, &lease, nullptr);
    ShardPayload payload;
    payload.values = params;
    payload.data = absl::MakeConstSpan(
        reinterpret_cast<const uint8_t*>(grad.data()), params * sizeof(float));
    push->Send(0, payload);
    status = push->Wait();
  }
  if (!lease.AwaitReleased(absl::Seconds(60))) {
    return absl::InternalError("gRPC kept the pushed values");
  }
  return status;
}

// A sync worker that lost a shard repeats its step on the weights the shards
// have now, so its push to a shard that already has the step's examples may
// carry other values: after Reconnect the push says it is a repeat
// (PushHeader.repeat) and the shard keeps the first; without it, other
// values for the same examples are a mistake.
TEST(RidingOutTest, ASyncStepRepeatedAfterAReconnectKeepsTheFirstPush) {
  const TrainingConfig config = PlainSgd("SYNC");
  testutil::LocalCluster cluster(config, 1, 2);
  ASSERT_NE(cluster.client, nullptr);
  const size_t p = common::ModelLayout::FromConfig(config).num_params();
  const std::vector<float> initial = cluster.Weights(0);

  ASSERT_OK(PushStepZero(cluster.client.get(), p, 2.0f));
  EXPECT_THAT(PushStepZero(cluster.client.get(), p, 100.0f),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("twice with different values")));
  ASSERT_OK(cluster.client->Reconnect(absl::Seconds(10), absl::ZeroDuration()));
  EXPECT_THAT(PushStepZero(cluster.client.get(), p, 100.0f),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       HasSubstr("worker 0 already pushed step 0")));
  // Only the push right after Reconnect is a repeat.
  EXPECT_THAT(PushStepZero(cluster.client.get(), p, 50.0f),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("twice with different values")));

  absl::StatusOr<std::unique_ptr<PsClient>> other =
      PsClient::Connect(testutil::ClientOptions(cluster.servers, config, 1));
  ASSERT_OK(other.status());
  ASSERT_OK(PushStepZero(other->get(), p, 4.0f));
  // Step 0 is the mean of the first pushes, 2 and 4: w - 0.5 * 3.
  std::vector<float> expected = initial;
  for (float& w : expected) w -= 1.5f;
  EXPECT_EQ(cluster.Weights(1), expected);
}

}  // namespace
}  // namespace monsoon::worker
