// The asynchronous modes over real gRPC: a ShardServer on 127.0.0.1:0, the
// real PsClient for well-formed traffic and raw stubs for malformed pushes.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/float_bytes.h"
#include "common/model_layout.h"
#include "common/onebit.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/service.grpc.pb.h"
#include "server/shard_server.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"
#include "worker/cpu_backend.h"
#include "worker/gradient_pusher.h"
#include "worker/ps_client.h"

namespace monsoon {
namespace {

using ::monsoon::testutil::IsOk;
using ::monsoon::testutil::ResolvedConfig;
using ::monsoon::testutil::StatusIs;
using ::testing::HasSubstr;

// {60, 20, 5}: 1325 parameters, one shard.
constexpr char kLayers[] = "layer_sizes: [60, 20, 5] chunk_bytes: 262144 ";

std::unique_ptr<server::ShardServer> StartShard(const TrainingConfig& config,
                                                int num_workers) {
  server::ShardServerOptions options;
  options.config = config;
  options.num_workers = num_workers;
  absl::StatusOr<std::unique_ptr<server::ShardServer>> server =
      server::ShardServer::Start(options);
  EXPECT_THAT(server.status(), IsOk());
  return server.ok() ? *std::move(server) : nullptr;
}

std::unique_ptr<worker::PsClient> Connect(const TrainingConfig& config,
                                          const server::ShardServer& server,
                                          int rank) {
  worker::PsClientOptions options;
  options.server_addresses = {server.address()};
  options.config = config;
  options.worker_rank = rank;
  options.connect_timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<worker::PsClient>> client =
      worker::PsClient::Connect(options);
  EXPECT_THAT(client.status(), IsOk());
  return client.ok() ? *std::move(client) : nullptr;
}

std::vector<float> Weights(worker::PsClient* client, size_t n) {
  std::vector<float> weights(n);
  std::vector<int64_t> versions;
  EXPECT_THAT(
      client->Pull(0, absl::Seconds(10), absl::MakeSpan(weights), &versions),
      IsOk());
  return weights;
}

// Pushes `grads` as a worker does: through a GradientPusher on the CPU
// backend, which quantizes them under 1-bit (from a zero residual: a new
// pusher each time).
absl::Status PushAsWorker(worker::PsClient* client,
                          const TrainingConfig& config,
                          const std::vector<float>& grads) {
  std::unique_ptr<worker::ComputeBackend> cpu = worker::MakeCpuBackend(1);
  absl::StatusOr<std::unique_ptr<worker::GradientPusher>> pusher =
      worker::GradientPusher::Create(cpu.get(), client, config);
  if (!pusher.ok()) return pusher.status();
  absl::StatusOr<float*> device = cpu->AllocateFloats(grads.size());
  if (!device.ok()) return device.status();
  absl::Status status =
      cpu->CopyToDevice(grads.data(), *device, grads.size() * sizeof(float));
  if (status.ok()) {
    absl::StatusOr<std::unique_ptr<worker::PendingCall>> push =
        (*pusher)->Push(*device, {0}, 1, /*sample_offset=*/0);
    status = push.ok() ? (*push)->Wait() : push.status();
  }
  cpu->Free(*device);
  return status;
}

std::vector<float> Ramp(size_t n, float scale) {
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) {
    values[i] = scale * (static_cast<float>(i % 7) - 3.0f);
  }
  return values;
}

TEST(HogwildServiceTest, TwoPushesApplyAtTheSameTimeOnGrpcThreads) {
  const TrainingConfig config =
      ResolvedConfig(std::string(kLayers) + "mode: HOGWILD");
  auto server = StartShard(config, 2);
  ASSERT_NE(server, nullptr);
  // The first push to start applying waits inside its apply until a second
  // one has started applying too. A rule that serialized pushes would keep
  // the second out, and the wait would time out.
  std::atomic<int> entered{0};
  absl::Notification second_entered;
  std::atomic<bool> overlapped{false};
  server->state()->set_apply_hook_for_testing([&] {
    if (entered.fetch_add(1) == 0) {
      overlapped =
          second_entered.WaitForNotificationWithTimeout(absl::Seconds(20));
    } else {
      second_entered.Notify();
    }
  });
  const size_t p = server->state()->size();
  auto client0 = Connect(config, *server, 0);
  auto client1 = Connect(config, *server, 1);
  const std::vector<float> grads = Ramp(p, 0.01f);
  absl::Status status0, status1;
  std::thread t0([&] { status0 = client0->Push(grads, {0}, 1); });
  std::thread t1([&] { status1 = client1->Push(grads, {0}, 1); });
  t0.join();
  t1.join();
  EXPECT_THAT(status0, IsOk());
  EXPECT_THAT(status1, IsOk());
  EXPECT_TRUE(overlapped.load());
  const StatsResponse stats = server->state()->Stats();
  EXPECT_EQ(stats.max_concurrent_applies(), 2);
  EXPECT_EQ(stats.version(), 2);
  EXPECT_EQ(stats.pushes(), 2);
}

TEST(HogwildServiceTest, OnePushAppliesPlainSgd) {
  const TrainingConfig config =
      ResolvedConfig(std::string(kLayers) + "mode: HOGWILD learning_rate: 0.5");
  auto server = StartShard(config, 1);
  auto client = Connect(config, *server, 0);
  const size_t p = server->state()->size();
  const std::vector<float> before = Weights(client.get(), p);
  const std::vector<float> grads = Ramp(p, 0.25f);
  std::vector<PushResponse> responses;
  ASSERT_THAT(client->Push(grads, {0}, 8, &responses), IsOk());
  EXPECT_EQ(responses[0].version(), 1);
  EXPECT_EQ(responses[0].staleness(), 0);
  const std::vector<float> after = Weights(client.get(), p);
  for (size_t i = 0; i < p; ++i) {
    ASSERT_FLOAT_EQ(after[i], before[i] - 0.5f * grads[i]) << i;
  }
  // Computed from version 0 after one push was applied: staleness 1.
  ASSERT_THAT(client->Push(grads, {0}, 8, &responses), IsOk());
  EXPECT_EQ(responses[0].staleness(), 1);
  EXPECT_EQ(server->state()->Stats().staleness_max(), 1);
}

TEST(EasgdServiceTest, ElasticDifferenceIsAddedToTheCenter) {
  const TrainingConfig config =
      ResolvedConfig(std::string(kLayers) + "mode: EASGD");
  auto server = StartShard(config, 2);
  auto client = Connect(config, *server, 1);
  const size_t p = server->state()->size();
  // One exchange as a worker does it: d = alpha * (x - center).
  const std::vector<float> center = Weights(client.get(), p);
  const float alpha = 0.45f;
  std::vector<float> x(p), d(p);
  for (size_t i = 0; i < p; ++i) {
    x[i] = center[i] + 0.125f * static_cast<float>(i % 5);
    d[i] = alpha * (x[i] - center[i]);
  }
  ASSERT_THAT(client->Push(d, {0}, 4), IsOk());
  const std::vector<float> after = Weights(client.get(), p);
  for (size_t i = 0; i < p; ++i) {
    ASSERT_FLOAT_EQ(after[i], center[i] + d[i]) << i;
  }
  EXPECT_EQ(server->state()->version(), 1);
}

// 1-bit: SGD with learning rate 0.5 on the shard keeps the arithmetic exact.
constexpr char kOneBit[] =
    "mode: ONEBIT optimizer: SGD learning_rate: 0.5 onebit_bucket_size: 64";

TEST(OneBitServiceTest, ShardAppliesTheDecodedGradient) {
  const TrainingConfig config = ResolvedConfig(std::string(kLayers) + kOneBit);
  auto server = StartShard(config, 1);
  auto client = Connect(config, *server, 0);
  const size_t p = server->state()->size();
  const std::vector<float> before = Weights(client.get(), p);
  const std::vector<float> grads = Ramp(p, 1.0f);
  // What the shard should see: the same quantization from a zero residual.
  std::vector<float> residual(p, 0.0f), decoded(p);
  common::OneBitEncoded encoded;
  common::OneBitEncode(grads, absl::MakeSpan(residual), 64, &encoded);
  ASSERT_THAT(common::OneBitDecode(encoded.bits, encoded.scales, 64,
                                   absl::MakeSpan(decoded)),
              IsOk());
  ASSERT_THAT(PushAsWorker(client.get(), config, grads), IsOk());
  const std::vector<float> after = Weights(client.get(), p);
  for (size_t i = 0; i < p; ++i) {
    ASSERT_FLOAT_EQ(after[i], before[i] - 0.5f * decoded[i]) << i;
  }
}

TEST(OneBitServiceTest, PushIsOverTwentyTimesSmallerThanFloat32) {
  // Same values pushed as float32 (downpour) and as 1-bit (buckets of 512):
  // 32 bits a value against 1 + 64/512.
  const TrainingConfig float32 =
      ResolvedConfig(std::string(kLayers) + "mode: DOWNPOUR");
  const TrainingConfig onebit =
      ResolvedConfig(std::string(kLayers) + "mode: ONEBIT");
  auto server_f = StartShard(float32, 1);
  auto server_b = StartShard(onebit, 1);
  auto client_f = Connect(float32, *server_f, 0);
  auto client_b = Connect(onebit, *server_b, 0);
  const size_t p = server_f->state()->size();  // 1325 values
  const std::vector<float> grads = Ramp(p, 1.0f);
  ASSERT_THAT(client_f->Push(grads, {0}, 1), IsOk());
  ASSERT_THAT(PushAsWorker(client_b.get(), onebit, grads), IsOk());
  // Payload: 166 bytes of bits (3 buckets: 64 + 64 + 38) and 24 of scales;
  // the rest is the header and field tags.
  EXPECT_GE(client_b->bytes_pushed(), 166 + 24);
  EXPECT_LE(client_b->bytes_pushed(), 166 + 24 + 40);
  EXPECT_GE(client_f->bytes_pushed(), static_cast<int64_t>(p * 4));
  EXPECT_GT(client_f->bytes_pushed(), 20 * client_b->bytes_pushed());
  // The shard counts the same bytes.
  EXPECT_EQ(server_b->state()->Stats().bytes_pushed(),
            client_b->bytes_pushed());
}

// Raw pushes, for malformed 1-bit payloads.
class OneBitMalformedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = ResolvedConfig(std::string(kLayers) + kOneBit);
    server_ = StartShard(config_, 1);
    ASSERT_NE(server_, nullptr);
    // An evaluator's client (rank -1), to read the weights: the raw pushes
    // act for rank 0, which no process holds.
    client_ = Connect(config_, *server_, -1);
    size_ = server_->state()->size();
    before_ = Weights(client_.get(), size_);
    stub_ = ParameterService::NewStub(grpc::CreateChannel(
        server_->address(), grpc::InsecureChannelCredentials()));
    std::vector<float> residual(size_, 0.0f);
    common::OneBitEncode(Ramp(size_, 1.0f), absl::MakeSpan(residual), 64,
                         &good_);
  }

  PushChunk Header() const {
    PushChunk chunk;
    PushHeader* h = chunk.mutable_header();
    h->set_shard(0);
    h->set_length(size_);
    h->set_encoding(ENCODING_ONEBIT);
    h->set_bucket_size(64);
    return chunk;
  }

  grpc::Status Send(const PushChunk& chunk) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    PushResponse response;
    auto writer = stub_->Push(&context, &response);
    writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  }

  void ExpectUnchanged() {
    EXPECT_EQ(Weights(client_.get(), size_), before_);
    EXPECT_EQ(server_->state()->version(), 0);
  }

  TrainingConfig config_;
  std::unique_ptr<server::ShardServer> server_;
  std::unique_ptr<worker::PsClient> client_;
  std::unique_ptr<ParameterService::Stub> stub_;
  size_t size_ = 0;
  std::vector<float> before_;
  common::OneBitEncoded good_;
};

TEST_F(OneBitMalformedTest, WellFormedRawPushIsApplied) {
  PushChunk chunk = Header();
  chunk.set_data(good_.bits);
  chunk.set_scales(good_.scales);
  EXPECT_TRUE(Send(chunk).ok());
  EXPECT_EQ(server_->state()->version(), 1);
}

TEST_F(OneBitMalformedTest, BitPayloadOfWrongLengthIsRefused) {
  PushChunk chunk = Header();
  chunk.set_data(good_.bits.substr(1));
  chunk.set_scales(good_.scales);
  const grpc::Status status = Send(chunk);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("bytes of bits"));
  ExpectUnchanged();
}

TEST_F(OneBitMalformedTest, BucketCountThatDoesNotMatchIsRefused) {
  PushChunk chunk = Header();
  chunk.set_data(good_.bits);
  chunk.set_scales(good_.scales + std::string(8, '\0'));  // one bucket more
  EXPECT_EQ(Send(chunk).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  chunk.set_scales(good_.scales.substr(8));  // one bucket fewer
  EXPECT_EQ(Send(chunk).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectUnchanged();
}

TEST_F(OneBitMalformedTest, NaNReconstructionValueIsRefused) {
  PushChunk chunk = Header();
  chunk.set_data(good_.bits);
  std::string scales = good_.scales;
  const float nan = std::nanf("");
  std::memcpy(&scales[8], &nan, sizeof(nan));  // bucket 1's negative side
  chunk.set_scales(scales);
  const grpc::Status status = Send(chunk);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("non-finite"));
  ExpectUnchanged();
}

TEST_F(OneBitMalformedTest, Float32PushToAOneBitRunIsRefused) {
  PushChunk chunk = Header();
  chunk.mutable_header()->set_encoding(ENCODING_FLOAT32);
  common::AppendFloatBytes(Ramp(size_, 1.0f), chunk.mutable_data());
  EXPECT_EQ(Send(chunk).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectUnchanged();
}

TEST_F(OneBitMalformedTest, WrongBucketSizeIsRefused) {
  PushChunk chunk = Header();
  chunk.mutable_header()->set_bucket_size(32);
  chunk.set_data(good_.bits);
  chunk.set_scales(good_.scales);
  EXPECT_EQ(Send(chunk).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectUnchanged();
}

}  // namespace
}  // namespace monsoon
