// ScriptWorker (worker/script_worker.h): each mode's step on gradients a
// script computed, against FakeParameterClient (SGD at once: weights -=
// learning_rate * push), with exact expectations.
#include "worker/script_worker.h"

#include <memory>
#include <vector>

#include <thread>

#include "absl/strings/str_cat.h"
#include "common/float_bytes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard_server.h"
#include "tests/fake_parameter_client.h"
#include "tests/local_shards.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"
#include "worker/ps_client.h"

namespace monsoon::worker {
namespace {

using ::monsoon::testutil::FakeParameterClient;
using ::monsoon::testutil::ResolvedConfig;
using ::monsoon::testutil::StatusIs;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

// 4 parameters in two tensors, over 2 shards, starting at 1, 2, 3, 4.
constexpr char kTensors[] =
    "tensors { name: 'w' dims: 3 } tensors { name: 'b' dims: 1 } ";

struct Fixture {
  explicit Fixture(const std::string& text)
      : config(ResolvedConfig(absl::StrCat(kTensors, text))),
        client(config, 2, {1, 2, 3, 4}) {
    worker = *ScriptWorker::Create(&client, config, 0, 2);
  }
  TrainingConfig config;
  FakeParameterClient client;
  std::unique_ptr<ScriptWorker> worker;
  std::vector<float> params = std::vector<float>(4, 0.0f);
};

TEST(ScriptWorkerTest, RefusesAConfigWithoutTensorsAndBadBuffers) {
  const TrainingConfig mlp = ResolvedConfig("layer_sizes: [2, 2]");
  FakeParameterClient client(mlp, 1, std::vector<float>(6, 0.0f));
  EXPECT_THAT(ScriptWorker::Create(&client, mlp, 0, 1),
              StatusIs(absl::StatusCode::kInvalidArgument));

  Fixture f("mode: SYNC learning_rate: 0.5 momentum: 0");
  std::vector<float> grads(4, 1.0f);
  // No pull yet: the step has no versions to push from.
  EXPECT_THAT(f.worker->Step(grads, 8, absl::MakeSpan(f.params)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  std::vector<float> short_params(3);
  EXPECT_THAT(f.worker->Pull(absl::MakeSpan(short_params)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK(f.worker->Pull(absl::MakeSpan(f.params)));
  EXPECT_THAT(f.worker->Step(grads, 0, absl::MakeSpan(f.params)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(f.client.pushes().empty());
}

TEST(ScriptWorkerTest, SyncPushesAndTakesTheNextWeightsInOneRoundTrip) {
  Fixture f("mode: SYNC learning_rate: 0.5 momentum: 0");
  EXPECT_TRUE(f.worker->StepReplacesParams());
  ASSERT_OK(f.worker->Pull(absl::MakeSpan(f.params)));
  EXPECT_THAT(f.params, ElementsAre(1, 2, 3, 4));
  const std::vector<float> grads = {2, 0, -2, 4};
  ASSERT_OK_AND_ASSIGN(bool replaced,
                       f.worker->Step(grads, 8, absl::MakeSpan(f.params)));
  EXPECT_TRUE(replaced);
  EXPECT_THAT(f.params, ElementsAre(0, 2, 4, 2));
  ASSERT_OK(f.worker->Step(grads, 8, absl::MakeSpan(f.params)).status());
  EXPECT_THAT(f.params, ElementsAre(-1, 2, 5, 0));
  const auto pushes = f.client.pushes();
  ASSERT_EQ(pushes.size(), 2u);
  EXPECT_EQ(pushes[0].sample_offset, 0);
  EXPECT_EQ(pushes[1].sample_offset, 8);
  EXPECT_EQ(pushes[1].samples, 8);
}

TEST(ScriptWorkerTest, SyncRepeatsTheStepAfterALostShard) {
  Fixture f("mode: SYNC learning_rate: 0.5 momentum: 0");
  ASSERT_OK(f.worker->Pull(absl::MakeSpan(f.params)));
  f.client.FailNextPushes({absl::UnavailableError("shard 1 restarted")});
  const std::vector<float> grads = {2, 2, 2, 2};
  ASSERT_OK(f.worker->Step(grads, 8, absl::MakeSpan(f.params)).status());
  EXPECT_THAT(f.params, ElementsAre(0, 1, 2, 3));
  const auto pushes = f.client.pushes();
  ASSERT_EQ(pushes.size(), 2u);
  EXPECT_FALSE(pushes[0].applied);
  EXPECT_TRUE(pushes[1].applied);
  EXPECT_TRUE(pushes[1].repeat);
  EXPECT_EQ(pushes[1].sample_offset, 0);
  EXPECT_EQ(f.client.reconnects(), 1);
}

TEST(ScriptWorkerTest, ARideOutSettlesTheCallersOtherCallsBeforeReconnecting) {
  Fixture f("mode: SYNC learning_rate: 0.5 momentum: 0");
  ASSERT_OK(f.worker->Pull(absl::MakeSpan(f.params)));
  // The reconnections each settle saw: all before the ride-out's own.
  std::vector<int> reconnects_when_settled;
  f.worker->SetBeforeRideOut([&] {
    reconnects_when_settled.push_back(f.client.reconnects());
  });
  f.client.FailNextPushes({absl::UnavailableError("shard 1 restarted")});
  const std::vector<float> grads = {2, 2, 2, 2};
  ASSERT_OK(f.worker->Step(grads, 8, absl::MakeSpan(f.params)).status());
  EXPECT_THAT(reconnects_when_settled, ElementsAre(0));
  ASSERT_OK(f.worker->RideOut(absl::UnavailableError("a row call's shard")));
  EXPECT_THAT(reconnects_when_settled, ElementsAre(0, 1));
  EXPECT_EQ(f.client.reconnects(), 2);
  // An error that is not a lost shard is no ride-out.
  EXPECT_THAT(f.worker->RideOut(absl::InvalidArgumentError("bad ids")),
              StatusIs(absl::StatusCode::kInvalidArgument));
  f.worker->SetBeforeRideOut(nullptr);
  ASSERT_OK(f.worker->RideOut(absl::UnavailableError("again")));
  EXPECT_THAT(reconnects_when_settled, ElementsAre(0, 1));
  EXPECT_EQ(f.client.reconnects(), 3);
}

TEST(ScriptWorkerTest, DownpourSumsNPushStepsAndPullsEveryNFetch) {
  Fixture f("mode: DOWNPOUR optimizer: SGD learning_rate: 0.5 n_push: 3 "
            "n_fetch: 2");
  EXPECT_FALSE(f.worker->StepReplacesParams());
  ASSERT_OK(f.worker->Pull(absl::MakeSpan(f.params)));
  const std::vector<float> ones(4, 1.0f);
  std::vector<std::vector<float>> after_local_step;
  for (int step = 1; step <= 6; ++step) {
    ASSERT_OK_AND_ASSIGN(bool replaced,
                         f.worker->Step(ones, 4, absl::MakeSpan(f.params)));
    EXPECT_FALSE(replaced);
    f.params[0] += 100;  // the script's local step, which a pull replaces
    ASSERT_OK(f.worker->AfterLocalStep(absl::MakeSpan(f.params)));
    after_local_step.push_back(f.params);
  }
  ASSERT_OK(f.worker->Finish(absl::MakeSpan(f.params)));
  // Pulled after steps 2, 4 and 6. The fake applies a push when it is
  // waited for: the first (steps 1-3, -1.5 each) when the second starts,
  // after step 6, and the second (steps 4-6) at Finish.
  EXPECT_THAT(after_local_step[1], ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(after_local_step[2], ElementsAre(101, 2, 3, 4));
  EXPECT_THAT(after_local_step[3], ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(after_local_step[4], ElementsAre(101, 2, 3, 4));
  EXPECT_THAT(after_local_step[5], ElementsAre(-0.5, 0.5, 1.5, 2.5));
  EXPECT_THAT(f.client.weights(), ElementsAre(-2, -1, 0, 1));
  const auto pushes = f.client.pushes();
  ASSERT_EQ(pushes.size(), 2u);
  EXPECT_EQ(pushes[0].samples, 12);
  EXPECT_EQ(pushes[0].sample_offset, 0);
  EXPECT_EQ(pushes[1].sample_offset, 12);
}

TEST(ScriptWorkerTest, DownpourFinishPushesWhatIsStillSummed) {
  Fixture f("mode: DOWNPOUR optimizer: SGD learning_rate: 1 n_push: 4");
  ASSERT_OK(f.worker->Pull(absl::MakeSpan(f.params)));
  const std::vector<float> ones(4, 1.0f);
  for (int step = 0; step < 2; ++step) {
    ASSERT_OK(f.worker->Step(ones, 4, absl::MakeSpan(f.params)).status());
  }
  EXPECT_TRUE(f.client.pushes().empty());
  ASSERT_OK(f.worker->Finish(absl::MakeSpan(f.params)));
  ASSERT_EQ(f.client.pushes().size(), 1u);
  EXPECT_EQ(f.client.pushes()[0].samples, 8);
  EXPECT_THAT(f.client.weights(), ElementsAre(-1, 0, 1, 2));
}

TEST(ScriptWorkerTest, HogwildPushesThenPulls) {
  Fixture f("mode: HOGWILD learning_rate: 0.5");
  ASSERT_OK(f.worker->Pull(absl::MakeSpan(f.params)));
  const std::vector<float> grads = {2, 2, 2, 2};
  ASSERT_OK_AND_ASSIGN(bool replaced,
                       f.worker->Step(grads, 8, absl::MakeSpan(f.params)));
  EXPECT_TRUE(replaced);
  // Pulled while the push is in flight (the fake applies it when it is
  // waited for: at Finish).
  EXPECT_THAT(f.params, ElementsAre(1, 2, 3, 4));
  ASSERT_EQ(f.client.pushes().size(), 0u);
  ASSERT_OK(f.worker->Finish(absl::MakeSpan(f.params)));
  EXPECT_THAT(f.client.weights(), ElementsAre(0, 1, 2, 3));
  ASSERT_EQ(f.client.pushes().size(), 1u);
}

TEST(ScriptWorkerTest, EasgdExchangesEveryTauSteps) {
  Fixture f("mode: EASGD optimizer: SGD learning_rate: 1 tau: 2 alpha: 0.5");
  ASSERT_OK(f.worker->Pull(absl::MakeSpan(f.params)));
  const std::vector<float> zeros(4, 0.0f);
  for (int step = 0; step < 2; ++step) {
    ASSERT_OK_AND_ASSIGN(bool replaced,
                         f.worker->Step(zeros, 4, absl::MakeSpan(f.params)));
    EXPECT_FALSE(replaced);
    for (float& x : f.params) x += 2;  // the script's local steps
    ASSERT_OK(f.worker->AfterLocalStep(absl::MakeSpan(f.params)));
  }
  // x - centre = 4 everywhere: d = 2, x -= d; the fake's SGD applies the
  // push d as centre -= 1 * d.
  EXPECT_THAT(f.params, ElementsAre(3, 4, 5, 6));
  ASSERT_EQ(f.client.pushes().size(), 1u);
  EXPECT_EQ(f.client.pushes()[0].samples, 8);
  EXPECT_THAT(f.client.weights(), ElementsAre(-1, 0, 1, 2));
}

// Against real shards over gRPC (and under ThreadSanitizer: tsan_tests):
// two ranks' sync steps from an initial-weights file.
TEST(ScriptWorkerClusterTest, TwoRanksSyncFromTheInitialWeightsFile) {
  std::vector<float> initial(1000);
  for (size_t i = 0; i < initial.size(); ++i) initial[i] = 0.001f * i;
  const std::string path = testutil::TempDir() + "/initial.weights";
  std::string bytes;
  common::AppendFloatBytes(initial, &bytes);
  testutil::WriteFile(path, bytes);
  const TrainingConfig config = ResolvedConfig(absl::StrCat(
      "tensors { name: 'w' dims: 10 dims: 100 } initial_weights: '", path,
      "' mode: SYNC learning_rate: 0.5 momentum: 0 call_timeout_s: 60"));
  auto servers = testutil::StartLocalShards(config, 2, 2);
  ASSERT_EQ(servers.size(), 2u);
  std::vector<std::vector<float>> pulled(2), final(2);
  std::vector<absl::Status> statuses(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<PsClient>> client =
          PsClient::Connect(testutil::ClientOptions(servers, config, r));
      if (!client.ok()) {
        statuses[r] = client.status();
        return;
      }
      auto worker = ScriptWorker::Create(client->get(), config, r, 2);
      if (!worker.ok()) {
        statuses[r] = worker.status();
        return;
      }
      std::vector<float> params(1000), grads(1000, r + 1.0f);
      absl::Status status = (*worker)->Pull(absl::MakeSpan(params));
      pulled[r] = params;
      for (int step = 0; step < 4 && status.ok(); ++step) {
        status = (*worker)->Step(grads, 8, absl::MakeSpan(params)).status();
      }
      if (status.ok()) status = (*worker)->Finish(absl::MakeSpan(params));
      if (status.ok()) status = (*client)->Leave(absl::Seconds(5), true);
      statuses[r] = status;
      final[r] = params;
    });
  }
  for (std::thread& t : ranks) t.join();
  ASSERT_OK(statuses[0]);
  ASSERT_OK(statuses[1]);
  EXPECT_EQ(pulled[0], initial);
  EXPECT_EQ(pulled[1], initial);
  EXPECT_EQ(final[0], final[1]);
  // 4 steps of the mean gradient 1.5 at rate 0.5.
  for (size_t i = 0; i < initial.size(); ++i) {
    EXPECT_NEAR(final[0][i], initial[i] - 3.0f, 1e-5) << i;
  }
}

TEST(ScriptWorkerClusterTest, ADamagedInitialWeightsFileStopsTheShard) {
  const std::string path = testutil::TempDir() + "/short.weights";
  testutil::WriteFile(path, std::string(12, '\0'));
  server::ShardServerOptions options;
  options.config = ResolvedConfig(absl::StrCat(
      "tensors { name: 'w' dims: 4 } initial_weights: '", path, "'"));
  options.listen_address = "127.0.0.1:0";
  EXPECT_THAT(
      server::ShardServer::Start(options),
      StatusIs(absl::StatusCode::kInvalidArgument,
               ::testing::HasSubstr("holds 12 bytes, but the model's 4 "
                                    "parameters need 16")));
}

}  // namespace
}  // namespace monsoon::worker
