// GradientPusher on the CPU backend against real ShardServers on 127.0.0.1.
#include "worker/gradient_pusher.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/model_layout.h"
#include "common/onebit.h"
#include "common/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard_server.h"
#include "server/shard_state.h"
#include "tests/local_shards.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"
#include "worker/compute_backend.h"
#include "worker/cpu_backend.h"
#include "worker/ps_client.h"
#include "worker/worker_counters.h"

namespace monsoon::worker {
namespace {

using ::monsoon::testutil::ResolvedConfig;
using ::monsoon::testutil::StatusIs;
using ::testing::HasSubstr;

// 53 parameters on two shards ([0, 26) and [26, 53)); one worker, so each
// sync push is applied at once; learning rate 1.
constexpr char kFloat32[] =
    "layer_sizes: [6, 5, 3] mode: SYNC optimizer: SGD learning_rate: 1 "
    "momentum: 0 chunk_bytes: 262144";
constexpr char kOneBit[] =
    "layer_sizes: [6, 5, 3] mode: SYNC optimizer: SGD learning_rate: 1 "
    "momentum: 0 chunk_bytes: 262144 compression: COMPRESSION_ONEBIT "
    "onebit_bucket_size: 8";

// Values that change sign within buckets and from step to step.
std::vector<float> Gradient(int step) {
  std::vector<float> g(53);
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = 0.25f * static_cast<float>((i * 7 + step * 3) % 11) - 1.2f;
  }
  return g;
}

// Two shards (or `shards`), one worker.
struct Cluster : testutil::LocalCluster {
  explicit Cluster(const TrainingConfig& config, int shards = 2)
      : LocalCluster(config, shards, 1) {}
};

// The bytes of a float32 push message of `values` values at `offset`, with
// `header` or none.
int64_t MessageBytes(const PushHeader* header, uint64_t offset,
                     size_t values) {
  const std::vector<char> data(values * sizeof(float));
  return static_cast<int64_t>(
      common::PushChunkMessage(header, offset,
                               grpc::Slice(data.data(), data.size()),
                               grpc::Slice())
          .Length());
}

// A float32 or 1-bit payload borrowed from host bytes.
ShardPayload Payload(PushEncoding encoding, uint64_t n, const void* data,
                     size_t data_bytes, const void* scales = nullptr,
                     size_t scales_bytes = 0) {
  ShardPayload payload;
  payload.encoding = encoding;
  payload.values = n;
  payload.data =
      absl::MakeConstSpan(static_cast<const uint8_t*>(data), data_bytes);
  payload.scales =
      absl::MakeConstSpan(static_cast<const uint8_t*>(scales), scales_bytes);
  return payload;
}

// The backend every test pushes from, and the device buffers of 53 values
// it hands out, freed with the test however it ends.
class GradientPusherTest : public testing::Test {
 protected:
  ~GradientPusherTest() override {
    for (float* device : devices_) cpu_->Free(device);
  }

  // A pusher on `cluster`'s client.
  absl::StatusOr<std::unique_ptr<GradientPusher>> Pusher(
      const Cluster& cluster, const TrainingConfig& config,
      WorkerCounters* counters = nullptr) {
    if (cluster.client == nullptr) {
      return absl::UnavailableError("the cluster's client did not connect");
    }
    return GradientPusher::Create(cpu_.get(), cluster.client.get(), config,
                                  counters);
  }

  absl::StatusOr<float*> Device() {
    absl::StatusOr<float*> device = cpu_->AllocateFloats(53);
    if (device.ok()) devices_.push_back(*device);
    return device;
  }

  std::unique_ptr<ComputeBackend> cpu_ = MakeCpuBackend(1);
  std::vector<float*> devices_;
};

TEST_F(GradientPusherTest, Float32PushMatchesThePlainPush) {
  const TrainingConfig config = ResolvedConfig(kFloat32);
  Cluster plain(config), pushed(config);
  ASSERT_NE(plain.client, nullptr);
  ASSERT_NE(pushed.client, nullptr);
  WorkerCounters counters;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GradientPusher> pusher,
                       Pusher(pushed, config, &counters));
  ASSERT_OK_AND_ASSIGN(float* device, Device());
  constexpr int kSteps = 5;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<float> g = Gradient(step);
    ASSERT_OK(plain.client->Push(g, {step, step}, 8));
    ASSERT_OK(cpu_->CopyToDevice(g.data(), device, 53 * sizeof(float)));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingCall> push,
                         pusher->Push(device, {step, step}, 8, 8 * step));
    // The pusher copied the gradient: the device buffer may change now.
    cpu_->Fill(53, 1e9f, device);
    ASSERT_OK(push->Wait());
  }
  EXPECT_TRUE(std::isnan(counters.residual_norm.load()));  // no residual
  EXPECT_EQ(pushed.client->bytes_pushed(), plain.client->bytes_pushed());
  EXPECT_EQ(pushed.Weights(kSteps), plain.Weights(kSteps));
}

TEST_F(GradientPusherTest, OneBitPushesCarryTheHostCodecsBytesWithOneResidual) {
  // The backend's codec with the pusher's residual against the host codec
  // with one of the test's, pushed shard by shard through PsClient.
  const TrainingConfig config = ResolvedConfig(kOneBit);
  Cluster by_hand(config), pushed(config);
  ASSERT_NE(by_hand.client, nullptr);
  ASSERT_NE(pushed.client, nullptr);
  WorkerCounters counters;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GradientPusher> pusher,
                       Pusher(pushed, config, &counters));
  ASSERT_OK_AND_ASSIGN(float* device, Device());
  const std::vector<float> initial = pushed.Weights(0);
  std::vector<float> residual(53, 0.0f);
  constexpr int kSteps = 5;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<float> g = Gradient(step);
    std::vector<common::OneBitEncoded> encoded(2);
    common::BufferLease lease;
    std::unique_ptr<ShardedPush> push =
        by_hand.client->StartPush({step, step}, 8, 8 * step, &lease, nullptr);
    for (int s = 0; s < 2; ++s) {
      const common::ShardRange r = by_hand.client->ranges()[s];
      common::OneBitEncode(absl::MakeConstSpan(g).subspan(r.begin, r.size()),
                           absl::MakeSpan(residual).subspan(r.begin, r.size()),
                           8, &encoded[s]);
      push->Send(s, Payload(ENCODING_ONEBIT, r.size(), encoded[s].bits.data(),
                            encoded[s].bits.size(), encoded[s].scales.data(),
                            encoded[s].scales.size()));
    }
    ASSERT_OK(push->Wait());
    ASSERT_OK(cpu_->CopyToDevice(g.data(), device, 53 * sizeof(float)));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingCall> pushing,
                         pusher->Push(device, {step, step}, 8, 8 * step));
    ASSERT_OK(pushing->Wait());
    if (step == 0) {
      // The first push measures the residual's norm (later ones within a
      // second do not): the host codec's residual's.
      double sum = 0;
      for (float r : residual) sum += static_cast<double>(r) * r;
      EXPECT_GT(sum, 0);
      EXPECT_DOUBLE_EQ(counters.residual_norm.load(), std::sqrt(sum));
    }
  }
  EXPECT_EQ(pushed.client->bytes_pushed(), by_hand.client->bytes_pushed());
  const std::vector<float> weights = pushed.Weights(kSteps);
  EXPECT_EQ(weights, by_hand.Weights(kSteps));
  EXPECT_NE(weights, initial);
}

// A step sent again (after a lost shard) goes as it was encoded: the
// shard that has it answers it as a duplicate, and the residual counts the
// step once, so the next steps' bits, and the weights they make, are those
// of a run that sent each step once. Encoded a second time (Push), the
// residual would have taken the step's error twice.
TEST_F(GradientPusherTest, AOneBitPushSentAgainIsTheSameBitsAndResidual) {
  const TrainingConfig config = ResolvedConfig(kOneBit);
  Cluster once(config), twice(config);
  ASSERT_NE(once.client, nullptr);
  ASSERT_NE(twice.client, nullptr);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GradientPusher> single,
                       Pusher(once, config));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GradientPusher> repeating,
                       Pusher(twice, config));
  ASSERT_OK_AND_ASSIGN(float* device, Device());
  constexpr int kSteps = 4;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<float> g = Gradient(step);
    ASSERT_OK(cpu_->CopyToDevice(g.data(), device, 53 * sizeof(float)));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingCall> first,
                         single->Push(device, {step, step}, 8, 8 * step));
    ASSERT_OK(first->Wait());
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingCall> pushed,
                         repeating->Push(device, {step, step}, 8, 8 * step));
    ASSERT_OK(pushed->Wait());
    ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<PendingCall> again,
        repeating->PushAgain(device, {step, step}, 8, 8 * step));
    ASSERT_OK(again->Wait());
    EXPECT_EQ(twice.Weights(step + 1), once.Weights(step + 1));
  }
}

TEST_F(GradientPusherTest, AccumulatedStepsArePushedAsTheirSumThenCleared) {
  const TrainingConfig config = ResolvedConfig(kFloat32);
  Cluster cluster(config);
  ASSERT_NE(cluster.client, nullptr);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GradientPusher> pusher,
                       Pusher(cluster, config));
  ASSERT_OK_AND_ASSIGN(float* device, Device());
  auto upload = [&](const std::vector<float>& g) {
    ASSERT_OK(cpu_->CopyToDevice(g.data(), device, 53 * sizeof(float)));
  };
  // Nothing given and nothing accumulated.
  EXPECT_THAT(pusher->Push(nullptr, {0, 0}, 8, /*sample_offset=*/0).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("none accumulated")));
  const std::vector<float> initial = cluster.Weights(0);
  const std::vector<float> g0 = Gradient(0), g1 = Gradient(1), g2 = Gradient(2);
  upload(g0);
  ASSERT_OK(pusher->Accumulate(device));
  upload(g1);
  ASSERT_OK(pusher->Accumulate(device));
  EXPECT_EQ(pusher->accumulated_steps(), 2);
  // The sum so far plus this step's gradient.
  upload(g2);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingCall> push,
                       pusher->Push(device, {0, 0}, 24, /*sample_offset=*/0));
  ASSERT_OK(push->Wait());
  EXPECT_EQ(pusher->accumulated_steps(), 0);
  std::vector<float> expected = initial;
  for (size_t i = 0; i < expected.size(); ++i) {
    expected[i] -= ((0.0f + g0[i]) + g1[i]) + g2[i];
  }
  EXPECT_EQ(cluster.Weights(1), expected);

  // The sum starts again from zero; null pushes just the sum.
  upload(g1);
  ASSERT_OK(pusher->Accumulate(device));
  ASSERT_OK_AND_ASSIGN(push, pusher->Push(nullptr, {1, 1}, 8, 24));
  ASSERT_OK(push->Wait());
  for (size_t i = 0; i < expected.size(); ++i) expected[i] -= 0.0f + g1[i];
  EXPECT_EQ(cluster.Weights(2), expected);
}

TEST_F(GradientPusherTest, PushWithAPullTargetGetsTheWeightsThatIncludeIt) {
  for (const char* text : {kFloat32, kOneBit}) {
    SCOPED_TRACE(text);
    const TrainingConfig config = ResolvedConfig(text);
    Cluster cluster(config);
    ASSERT_NE(cluster.client, nullptr);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<GradientPusher> pusher,
                         Pusher(cluster, config));
    ASSERT_OK_AND_ASSIGN(float* device, Device());
    const std::vector<float> initial = cluster.Weights(0);
    const std::vector<float> g = Gradient(4);
    ASSERT_OK(cpu_->CopyToDevice(g.data(), device, 53 * sizeof(float)));
    std::vector<float> params(53, -7.0f);
    std::vector<int64_t> versions;
    const PullTarget pull{absl::MakeSpan(params), &versions, absl::Seconds(30)};
    ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<PendingCall> push,
        pusher->Push(device, {0, 0}, 8, /*sample_offset=*/0, &pull));
    ASSERT_OK(push->Wait());
    EXPECT_THAT(versions, testing::ElementsAre(1, 1));
    EXPECT_EQ(params, cluster.Weights(1));
    EXPECT_NE(params, initial);
  }
}

// A staged push sends shard 1's part as soon as Ready says its range is
// final: shard 1 closes its step (one worker) while shard 0 has nothing
// yet, and Finish sends shard 0's. The weights come out as a plain push's.
TEST_F(GradientPusherTest, AStagedPushSendsEachShardOnceItsRangeIsFinal) {
  for (const char* text : {kFloat32, kOneBit}) {
    SCOPED_TRACE(text);
    const TrainingConfig config = ResolvedConfig(text);
    Cluster plain(config), staged(config);
    ASSERT_NE(plain.client, nullptr);
    ASSERT_NE(staged.client, nullptr);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<GradientPusher> plain_pusher,
                         Pusher(plain, config));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<GradientPusher> pusher,
                         Pusher(staged, config));
    ASSERT_OK_AND_ASSIGN(float* device, Device());
    const std::vector<float> g = Gradient(2);
    ASSERT_OK(cpu_->CopyToDevice(g.data(), device, 53 * sizeof(float)));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingCall> plain_push,
                         plain_pusher->Push(device, {0, 0}, 8, 0));
    ASSERT_OK(plain_push->Wait());

    std::vector<float> params(53, -7.0f);
    std::vector<int64_t> versions;
    const PullTarget pull{absl::MakeSpan(params), &versions, absl::Seconds(30)};
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<StagedPush> push,
                         pusher->Start(device, {0, 0}, 8, 0, &pull));
    push->Ready(30);  // shard 1 holds [26, 53): not all final yet
    EXPECT_EQ(push->sent_early(), 0);
    push->Ready(26);
    EXPECT_EQ(push->sent_early(), 1);
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (staged.servers[1]->state()->version() < 1 &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    EXPECT_EQ(staged.servers[1]->state()->version(), 1);
    EXPECT_EQ(staged.servers[0]->state()->version(), 0);
    push->Ready(0);  // backward has ended: shard 0 goes, and not early
    EXPECT_EQ(push->sent_early(), 1);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingCall> call, push->Finish());
    ASSERT_OK(call->Wait());
    EXPECT_THAT(versions, testing::ElementsAre(1, 1));
    EXPECT_EQ(params, plain.Weights(1));
    EXPECT_EQ(staged.Weights(1), plain.Weights(1));
    // Within a range values go in whole chunks: shard 1's 27 are less than
    // one, so it went whole, as after backward.
    EXPECT_EQ(staged.client->bytes_pushed(), plain.client->bytes_pushed());
  }
}

// 164,410 parameters: 2.5 chunks of 65,536 values on one shard.
constexpr char kLarge[] =
    "layer_sizes: [400, 400, 10] mode: SYNC optimizer: SGD learning_rate: 1 "
    "momentum: 0 chunk_bytes: 262144";
constexpr uint64_t kLargeSize = 164410;
constexpr uint64_t kChunk = 65536;

std::vector<float> LargeGradient() {
  std::vector<float> g(kLargeSize);
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = 0.001f * static_cast<float>((i * 7) % 11) - 0.005f;
  }
  return g;
}

TEST_F(GradientPusherTest, OnOneShardAPushPullSendsFinalChunksDuringBackward) {
  const TrainingConfig config = ResolvedConfig(kLarge);
  Cluster plain(config, 1), staged(config, 1);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GradientPusher> plain_pusher,
                       Pusher(plain, config));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GradientPusher> pusher,
                       Pusher(staged, config));
  const std::vector<float> g = LargeGradient();
  std::vector<float> plain_params(kLargeSize);
  std::vector<int64_t> plain_versions;
  const PullTarget plain_pull{absl::MakeSpan(plain_params), &plain_versions,
                              absl::Seconds(30)};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingCall> plain_push,
                       plain_pusher->Push(g.data(), {0}, 8, 0, &plain_pull));
  ASSERT_OK(plain_push->Wait());

  // Backward ends layer by layer; the values not final yet hold NaN until
  // then, and the shard must take only final ones.
  std::vector<float> grads(kLargeSize, std::nanf(""));
  std::vector<float> params(kLargeSize, -7.0f);
  std::vector<int64_t> versions;
  const PullTarget pull{absl::MakeSpan(params), &versions, absl::Seconds(30)};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<StagedPush> push,
                       pusher->Start(grads.data(), {0}, 8, 0, &pull));
  // Only the values that become final are written: those final before
  // may be on their way, read by the client's threads (as backward leaves
  // a finished layer's gradient alone).
  uint64_t final_end = kLargeSize;
  const auto final_from = [&](uint64_t from) {
    std::copy(g.begin() + from, g.begin() + final_end, grads.begin() + from);
    final_end = from;
    push->Ready(from);
  };
  final_from(160400);  // the last layer: less than a chunk, nothing goes
  EXPECT_EQ(push->sent_early(), 0);
  EXPECT_EQ(staged.client->bytes_pushed(), 0);
  final_from(90000);  // one whole chunk final: [98874, 164410) goes
  EXPECT_EQ(push->sent_early(), 1);
  final_from(20000);  // one more: [33338, 98874)
  // Both chunks are on the shard; it has not taken the push.
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(staged.servers[0]->state()->version(), 0);
  final_from(0);  // backward has ended: the rest, [0, 33338)
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingCall> call, push->Finish());
  ASSERT_OK(call->Wait());
  EXPECT_EQ(push->sent_early(), 1);
  EXPECT_THAT(versions, testing::ElementsAre(1));
  EXPECT_EQ(params, plain_params);
  EXPECT_EQ(staged.Weights(1), plain.Weights(1));
  // Three messages, back to front, where the plain push sent [0, 65536),
  // [65536, 131072) and [131072, 164410).
  PushHeader header;  // the same bytes in both: only the framing differs
  header.set_length(kLargeSize);
  const uint64_t first = kLargeSize - kChunk, second = first - kChunk;
  EXPECT_EQ(staged.client->bytes_pushed() - plain.client->bytes_pushed(),
            MessageBytes(&header, first, kChunk) +
                MessageBytes(nullptr, second, kChunk) +
                MessageBytes(nullptr, 0, second) -
                MessageBytes(&header, 0, kChunk) -
                MessageBytes(nullptr, kChunk, kChunk) -
                MessageBytes(nullptr, 2 * kChunk, kLargeSize - 2 * kChunk));
}

// Holding its ends, a staged push sends every shard's values but the first
// during backward, and no shard takes any of it before Finish: until then
// it can be given up (a script's step that turned out to differ).
TEST_F(GradientPusherTest, AStagedPushHoldingItsEndsIsTakenOnlyAtFinish) {
  const TrainingConfig config = ResolvedConfig(kFloat32);
  Cluster plain(config), staged(config);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GradientPusher> plain_pusher,
                       Pusher(plain, config));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GradientPusher> pusher,
                       Pusher(staged, config));
  const std::vector<float> g = Gradient(5);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingCall> plain_push,
                       plain_pusher->Push(g.data(), {0, 0}, 8, 0));
  ASSERT_OK(plain_push->Wait());

  std::vector<float> params(53, 0.0f);
  std::vector<int64_t> versions;
  const PullTarget pull{absl::MakeSpan(params), &versions, absl::Seconds(30)};
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<StagedPush> push,
      pusher->Start(g.data(), {0, 0}, 8, 0, &pull, /*hold_ends=*/true));
  push->Ready(26);  // shard 1's [27, 53)
  EXPECT_EQ(push->sent_early(), 1);
  push->Ready(0);  // backward has ended: shard 0 goes whole at Finish
  EXPECT_EQ(push->sent_early(), 1);
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(staged.servers[0]->state()->version(), 0);
  EXPECT_EQ(staged.servers[1]->state()->version(), 0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingCall> call, push->Finish());
  ASSERT_OK(call->Wait());
  EXPECT_THAT(versions, testing::ElementsAre(1, 1));
  EXPECT_EQ(params, plain.Weights(1));
  EXPECT_EQ(staged.Weights(1), plain.Weights(1));
  // Shard 1's first value went in a message of its own.
  PushHeader header;
  header.set_length(27);
  EXPECT_EQ(staged.client->bytes_pushed() - plain.client->bytes_pushed(),
            MessageBytes(&header, 1, 26) + MessageBytes(nullptr, 0, 1) -
                MessageBytes(&header, 0, 27));

  // Holding the ends needs borrowed float32 values: a push-pull's.
  EXPECT_THAT(pusher->Start(g.data(), {1, 1}, 8, 8, nullptr, true).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("only for float32 gradients in host memory")));
}

TEST_F(GradientPusherTest, AStagedPushGivenUpBeforeFinishLeavesTheShardsAsTheyWere) {
  const TrainingConfig config = ResolvedConfig(kFloat32);
  Cluster cluster(config), reference(config);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GradientPusher> pusher,
                       Pusher(cluster, config));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GradientPusher> reference_pusher,
                       Pusher(reference, config));
  const std::vector<float> initial = cluster.Weights(0);
  std::vector<float> grads = Gradient(4);
  std::vector<float> params(53, 0.0f);
  std::vector<int64_t> versions;
  const PullTarget pull{absl::MakeSpan(params), &versions, absl::Seconds(30)};
  {
    ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<StagedPush> push,
        pusher->Start(grads.data(), {0, 0}, 8, 0, &pull, /*hold_ends=*/true));
    push->Ready(26);
    push->Ready(10);  // shard 0's part is less than a chunk: it waits
    EXPECT_EQ(push->sent_early(), 1);
    // Given up: the step turned out other than the push said.
  }
  EXPECT_EQ(cluster.servers[0]->state()->version(), 0);
  EXPECT_EQ(cluster.servers[1]->state()->version(), 0);
  EXPECT_EQ(cluster.Weights(0), initial);
  // The shards take the same step whole afterwards, as ones that never saw
  // the parts do.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingCall> again,
                       pusher->Push(grads.data(), {0, 0}, 8, 0, &pull));
  ASSERT_OK(again->Wait());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingCall> whole,
                       reference_pusher->Push(grads.data(), {0, 0}, 8, 0));
  ASSERT_OK(whole->Wait());
  EXPECT_EQ(cluster.Weights(1), reference.Weights(1));
  EXPECT_EQ(params, reference.Weights(1));
}

TEST_F(GradientPusherTest, AStagedPushTakesNoAccumulatedSteps) {
  const TrainingConfig config = ResolvedConfig(kFloat32);
  Cluster cluster(config);
  ASSERT_NE(cluster.client, nullptr);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GradientPusher> pusher,
                       Pusher(cluster, config));
  ASSERT_OK_AND_ASSIGN(float* device, Device());
  cpu_->Fill(53, 0.5f, device);
  ASSERT_OK(pusher->Accumulate(device));
  EXPECT_THAT(pusher->Start(device, {0, 0}, 8, 0).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("nothing accumulated")));
}

}  // namespace
}  // namespace monsoon::worker
