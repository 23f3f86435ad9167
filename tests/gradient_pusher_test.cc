// GradientPusher on the CPU backend against real ShardServers on 127.0.0.1.
#include "worker/gradient_pusher.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/model_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard_server.h"
#include "tests/local_shards.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"
#include "worker/compute_backend.h"
#include "worker/cpu_backend.h"
#include "worker/ps_client.h"

namespace monsoon::worker {
namespace {

using ::monsoon::testutil::ResolvedConfig;
using ::monsoon::testutil::StatusIs;

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

// The CPU backend with its 1-bit codec hidden, as a backend without one.
class NoCodecBackend : public ComputeBackend {
 public:
  NoCodecBackend() : cpu_(MakeCpuBackend(1)) {}
  std::string Name() const override { return "cpu without codec"; }
  absl::StatusOr<float*> AllocateFloats(size_t n) override {
    return cpu_->AllocateFloats(n);
  }
  absl::StatusOr<int32_t*> AllocateInts(size_t n) override {
    return cpu_->AllocateInts(n);
  }
  void Free(void* p) override { cpu_->Free(p); }
  absl::Status CopyToDevice(const void* host, void* device,
                            size_t bytes) override {
    return cpu_->CopyToDevice(host, device, bytes);
  }
  absl::Status CopyToHost(const void* device, void* host,
                          size_t bytes) override {
    return cpu_->CopyToHost(device, host, bytes);
  }
  void Gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a,
            const float* b, float beta, float* c) override {
    cpu_->Gemm(ta, tb, m, n, k, alpha, a, b, beta, c);
  }
  void AddBias(int rows, int cols, const float* bias, float* y) override {
    cpu_->AddBias(rows, cols, bias, y);
  }
  void Relu(size_t n, float* y) override { cpu_->Relu(n, y); }
  void ReluBackward(size_t n, const float* y, float* dy) override {
    cpu_->ReluBackward(n, y, dy);
  }
  void ColumnSums(int rows, int cols, const float* x, float* sums) override {
    cpu_->ColumnSums(rows, cols, x, sums);
  }
  void SoftmaxCrossEntropy(int rows, int cols, const float* logits,
                           const int32_t* labels, float* dlogits,
                           float* stats) override {
    cpu_->SoftmaxCrossEntropy(rows, cols, logits, labels, dlogits, stats);
  }
  void Axpy(size_t n, float alpha, const float* x, float* y) override {
    cpu_->Axpy(n, alpha, x, y);
  }
  void Scale(size_t n, float alpha, float* y) override {
    cpu_->Scale(n, alpha, y);
  }
  void Fill(size_t n, float value, float* y) override {
    cpu_->Fill(n, value, y);
  }
  absl::Status Synchronize() override { return cpu_->Synchronize(); }

 private:
  std::unique_ptr<ComputeBackend> cpu_;
};

// Two shards, one worker.
struct Cluster : testutil::LocalCluster {
  explicit Cluster(const TrainingConfig& config) : LocalCluster(config, 2, 1) {}
};

// Pushes Gradient(0..steps-1) through a GradientPusher on `backend` to one
// cluster and through PsClient::Push to another; both must see the same
// bytes and end with the same weights.
void ExpectSameAsPlainPushes(const TrainingConfig& config,
                             ComputeBackend* backend, bool on_device) {
  Cluster plain(config), pushed(config);
  ASSERT_NE(plain.client, nullptr);
  ASSERT_NE(pushed.client, nullptr);
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<GradientPusher> pusher,
      GradientPusher::Create(backend, pushed.client.get(), config));
  EXPECT_EQ(pusher->quantizes_on_device(), on_device);
  ASSERT_OK_AND_ASSIGN(float* device, backend->AllocateFloats(53));
  constexpr int kSteps = 5;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<float> g = Gradient(step);
    ASSERT_OK(plain.client->Push(g, {step, step}, 8));
    ASSERT_OK(backend->CopyToDevice(g.data(), device, 53 * sizeof(float)));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingCall> push,
                         pusher->Push(device, {step, step}, 8));
    ASSERT_OK(push->Wait());
  }
  backend->Free(device);
  EXPECT_EQ(pushed.client->bytes_pushed(), plain.client->bytes_pushed());
  EXPECT_EQ(pushed.Weights(kSteps), plain.Weights(kSteps));
}

TEST(GradientPusherTest, OneBitQuantizedOnTheDeviceMatchesTheHostEncoder) {
  std::unique_ptr<ComputeBackend> cpu = MakeCpuBackend(1);
  ExpectSameAsPlainPushes(ResolvedConfig(kOneBit), cpu.get(),
                          /*on_device=*/true);
}

TEST(GradientPusherTest, OneBitOnABackendWithoutCodecQuantizesOnTheHost) {
  NoCodecBackend backend;
  ExpectSameAsPlainPushes(ResolvedConfig(kOneBit), &backend,
                          /*on_device=*/false);
}

TEST(GradientPusherTest, Float32PushMatchesThePlainPush) {
  std::unique_ptr<ComputeBackend> cpu = MakeCpuBackend(1);
  ExpectSameAsPlainPushes(ResolvedConfig(kFloat32), cpu.get(),
                          /*on_device=*/false);
}

TEST(GradientPusherTest, AccumulatedStepsArePushedAsTheirSumThenCleared) {
  const TrainingConfig config = ResolvedConfig(kFloat32);
  Cluster cluster(config);
  ASSERT_NE(cluster.client, nullptr);
  std::unique_ptr<ComputeBackend> cpu = MakeCpuBackend(1);
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<GradientPusher> pusher,
      GradientPusher::Create(cpu.get(), cluster.client.get(), config));
  ASSERT_OK_AND_ASSIGN(float* device, cpu->AllocateFloats(53));
  auto accumulate = [&](const std::vector<float>& g) {
    ASSERT_OK(cpu->CopyToDevice(g.data(), device, 53 * sizeof(float)));
    ASSERT_OK(pusher->Accumulate(device));
  };
  // Nothing accumulated yet.
  EXPECT_THAT(pusher->PushAccumulated({0, 0}, 8).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  const std::vector<float> initial = cluster.Weights(0);
  const std::vector<float> g0 = Gradient(0), g1 = Gradient(1), g2 = Gradient(2);
  accumulate(g0);
  accumulate(g1);
  EXPECT_EQ(pusher->accumulated_steps(), 2);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PendingCall> push,
                       pusher->PushAccumulated({0, 0}, 16));
  ASSERT_OK(push->Wait());
  EXPECT_EQ(pusher->accumulated_steps(), 0);
  std::vector<float> expected = initial;
  for (size_t i = 0; i < expected.size(); ++i) {
    expected[i] -= (0.0f + g0[i]) + g1[i];
  }
  EXPECT_EQ(cluster.Weights(1), expected);

  // The sum starts again from zero.
  accumulate(g2);
  ASSERT_OK_AND_ASSIGN(push, pusher->PushAccumulated({1, 1}, 8));
  ASSERT_OK(push->Wait());
  for (size_t i = 0; i < expected.size(); ++i) expected[i] -= g2[i];
  EXPECT_EQ(cluster.Weights(2), expected);
  cpu->Free(device);
}

}  // namespace
}  // namespace monsoon::worker
