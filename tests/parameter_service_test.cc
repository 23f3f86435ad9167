// The parameter service over real gRPC: a ShardServer on 127.0.0.1:0 and
// raw ParameterService stubs, so that the requests can be malformed on
// purpose.
#include "server/parameter_service.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/float_bytes.h"
#include "common/model_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/service.grpc.pb.h"
#include "server/shard_server.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace monsoon::server {
namespace {

using ::monsoon::testutil::ResolvedConfig;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

// layer_sizes {6, 5, 3}: 53 parameters; shard 0 of 2 owns [0, 26), shard 1
// owns [26, 53). Plain SGD with learning rate 0.5 keeps the arithmetic exact.
constexpr char kSyncConfig[] =
    "layer_sizes: [6, 5, 3] mode: SYNC optimizer: SGD learning_rate: 0.5 "
    "momentum: 0 chunk_bytes: 262144";

std::unique_ptr<ShardServer> StartShard(const TrainingConfig& config, int shard,
                                        int num_workers) {
  ShardServerOptions options;
  options.config = config;
  options.shard = shard;
  options.num_shards = 2;
  options.num_workers = num_workers;
  options.listen_address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<ShardServer>> server =
      ShardServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

std::unique_ptr<ParameterService::Stub> StubFor(const ShardServer& server) {
  return ParameterService::NewStub(grpc::CreateChannel(
      server.address(), grpc::InsecureChannelCredentials()));
}

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

PushChunk Chunk(uint64_t offset, const std::vector<float>& values) {
  PushChunk chunk;
  chunk.set_offset(offset);
  common::AppendFloatBytes(values, chunk.mutable_data());
  return chunk;
}

// A whole push in one chunk.
// A push as a worker's step `base_version` sends it: its examples are the
// rank's batch of that step (offset base_version * samples) unless given.
PushChunk OneChunkPush(int rank, int shard, int64_t base_version,
                       const std::vector<float>& values, int64_t samples = 8,
                       int64_t sample_offset = -1) {
  PushChunk chunk = Chunk(0, values);
  PushHeader* header = chunk.mutable_header();
  header->set_worker_rank(rank);
  header->set_shard(shard);
  header->set_base_version(base_version);
  header->set_length(values.size());
  header->set_samples(samples);
  header->set_sample_offset(sample_offset >= 0 ? sample_offset
                                               : base_version * samples);
  return chunk;
}

// Calls carry `authorization` as their "authorization" metadata, if given.
void Authorize(grpc::ClientContext* context, const std::string& authorization) {
  if (!authorization.empty()) {
    context->AddMetadata("authorization", authorization);
  }
}

grpc::Status RawPush(ParameterService::Stub* stub,
                     const std::vector<PushChunk>& chunks,
                     PushResponse* response = nullptr,
                     const std::string& authorization = "") {
  PushResponse scratch;
  grpc::ClientContext context;
  Authorize(&context, authorization);
  SetDeadline(&context, absl::Seconds(30));
  std::unique_ptr<grpc::ClientWriter<PushChunk>> writer =
      stub->Push(&context, response != nullptr ? response : &scratch);
  for (const PushChunk& chunk : chunks) {
    if (!writer->Write(chunk)) break;  // the server has answered already
  }
  writer->WritesDone();
  return writer->Finish();
}

struct Pulled {
  grpc::Status status;
  int64_t version = -1;
  std::vector<float> values;
  std::vector<uint64_t> chunk_offsets;
};

Pulled RawPull(ParameterService::Stub* stub, int rank, int shard,
               int64_t min_version, absl::Duration timeout = absl::Seconds(30),
               const std::string& authorization = "") {
  PullRequest request;
  request.set_worker_rank(rank);
  request.set_shard(shard);
  request.set_min_version(min_version);
  grpc::ClientContext context;
  Authorize(&context, authorization);
  SetDeadline(&context, timeout);
  std::unique_ptr<grpc::ClientReader<PullChunk>> reader =
      stub->Pull(&context, request);
  Pulled pulled;
  PullChunk chunk;
  while (reader->Read(&chunk)) {
    EXPECT_EQ(chunk.offset(), pulled.values.size());
    if (pulled.chunk_offsets.empty()) {
      pulled.version = chunk.version();
    } else {
      EXPECT_EQ(chunk.version(), pulled.version);
    }
    pulled.chunk_offsets.push_back(chunk.offset());
    EXPECT_EQ(chunk.data().size() % 4, 0u);
    const size_t at = pulled.values.size();
    pulled.values.resize(at + chunk.data().size() / 4);
    common::CopyBytesToFloats(chunk.data(), pulled.values.data() + at);
  }
  pulled.status = reader->Finish();
  return pulled;
}

StatsResponse RawStats(ParameterService::Stub* stub) {
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(30));
  StatsResponse stats;
  const grpc::Status status = stub->Stats(&context, StatsRequest(), &stats);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return stats;
}

std::vector<float> InitialWeights(const TrainingConfig& config, uint64_t begin,
                                  uint64_t size) {
  std::vector<float> values(size);
  common::InitialValues(common::ModelLayout::FromConfig(config), config.seed(),
                        begin, absl::MakeSpan(values));
  return values;
}

std::vector<float> Filled(size_t n, float value) {
  return std::vector<float>(n, value);
}

MATCHER_P(HasCode, code, "") {
  *result_listener << "whose status is " << arg.error_code() << ": "
                   << arg.error_message();
  return arg.error_code() == code;
}
MATCHER_P2(HasCodeAndMessage, code, message_matcher, "") {
  *result_listener << "whose status is " << arg.error_code() << ": "
                   << arg.error_message();
  return arg.error_code() == code &&
         testing::Matches(message_matcher)(arg.error_message());
}

class ParameterServiceTest : public testing::Test {
 protected:
  ParameterServiceTest() : config_(ResolvedConfig(kSyncConfig)) {}

  TrainingConfig config_;
};

TEST_F(ParameterServiceTest, RegisterDescribesTheShardsSlice) {
  std::unique_ptr<ShardServer> server = StartShard(config_, 1, 2);
  ASSERT_NE(server, nullptr);
  EXPECT_NE(server->port(), 0);
  EXPECT_EQ(server->address(), absl::StrCat("127.0.0.1:", server->port()));
  auto stub = StubFor(*server);
  for (int rank : {0, 1, -1}) {
    SCOPED_TRACE(rank);
    RegisterRequest request;
    request.set_worker_rank(rank);
    request.set_shard(1);
    request.set_config_fingerprint(common::ConfigFingerprint(config_));
    if (rank >= 0) request.set_session(100 + rank);
    RegisterResponse response;
    grpc::ClientContext context;
    SetDeadline(&context, absl::Seconds(30));
    ASSERT_TRUE(stub->Register(&context, request, &response).ok());
    EXPECT_EQ(response.shard(), 1);
    EXPECT_EQ(response.num_shards(), 2);
    EXPECT_EQ(response.offset(), 26u);
    EXPECT_EQ(response.length(), 27u);
    EXPECT_EQ(response.version(), 0);
  }
}

TEST_F(ParameterServiceTest,
       RegisterWithADifferentConfigNamesBothFingerprints) {
  std::unique_ptr<ShardServer> server = StartShard(config_, 0, 2);
  ASSERT_NE(server, nullptr);
  auto stub = StubFor(*server);
  TrainingConfig other = config_;
  other.set_learning_rate(0.25f);
  const uint64_t ours = common::ConfigFingerprint(config_);
  const uint64_t theirs = common::ConfigFingerprint(other);
  ASSERT_NE(ours, theirs);
  RegisterRequest request;
  request.set_worker_rank(0);
  request.set_shard(0);
  request.set_config_fingerprint(theirs);
  RegisterResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(30));
  EXPECT_THAT(
      stub->Register(&context, request, &response),
      HasCodeAndMessage(grpc::StatusCode::FAILED_PRECONDITION,
                        AllOf(HasSubstr(absl::StrFormat("%016x", theirs)),
                              HasSubstr(absl::StrFormat("%016x", ours)))));
}

TEST_F(ParameterServiceTest, RegisterForAnotherShardOrRankIsInvalid) {
  std::unique_ptr<ShardServer> server = StartShard(config_, 0, 2);
  ASSERT_NE(server, nullptr);
  auto stub = StubFor(*server);
  for (const auto& [rank, shard] :
       {std::pair<int, int>{0, 1}, {2, 0}, {-2, 0}}) {
    SCOPED_TRACE(testing::Message() << "rank " << rank << " shard " << shard);
    RegisterRequest request;
    request.set_worker_rank(rank);
    request.set_shard(shard);
    request.set_config_fingerprint(common::ConfigFingerprint(config_));
    RegisterResponse response;
    grpc::ClientContext context;
    SetDeadline(&context, absl::Seconds(30));
    EXPECT_THAT(stub->Register(&context, request, &response),
                HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  }
}

TEST_F(ParameterServiceTest, PullReturnsTheInitialWeights) {
  std::unique_ptr<ShardServer> server = StartShard(config_, 1, 2);
  ASSERT_NE(server, nullptr);
  auto stub = StubFor(*server);
  const Pulled pulled = RawPull(stub.get(), 0, 1, 0);
  ASSERT_TRUE(pulled.status.ok()) << pulled.status.error_message();
  EXPECT_EQ(pulled.version, 0);
  EXPECT_EQ(pulled.values, InitialWeights(config_, 26, 27));
  EXPECT_THAT(pulled.chunk_offsets, ElementsAre(0));
}

TEST_F(ParameterServiceTest,
       MalformedPushesAreInvalidAndLeaveWeightsUntouched) {
  // One worker, so that any push that got through would apply at once.
  std::unique_ptr<ShardServer> server = StartShard(config_, 0, 1);
  ASSERT_NE(server, nullptr);
  auto stub = StubFor(*server);
  const std::vector<float> initial = InitialWeights(config_, 0, 26);
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();

  std::vector<float> with_nan = Filled(26, 1.0f);
  with_nan[7] = kNan;
  std::vector<float> with_inf = Filled(26, 1.0f);
  with_inf[25] = kInf;
  std::vector<float> with_minus_inf = Filled(26, 1.0f);
  with_minus_inf[0] = -kInf;
  PushChunk wrong_header_length = OneChunkPush(0, 0, 0, Filled(26, 1.0f));
  wrong_header_length.mutable_header()->set_length(27);
  PushChunk out_of_order = OneChunkPush(0, 0, 0, Filled(13, 1.0f));

  struct Case {
    const char* what;
    std::vector<PushChunk> chunks;
    const char* message;
    grpc::StatusCode code = grpc::StatusCode::INVALID_ARGUMENT;
  };
  const std::vector<Case> cases = {
      {"too short", {OneChunkPush(0, 0, 0, Filled(25, 1.0f))}, "holds 26"},
      {"too long", {OneChunkPush(0, 0, 0, Filled(27, 1.0f))}, "holds 26"},
      {"header length", {wrong_header_length}, "holds 26"},
      {"stream ends early",
       {[] {
         PushChunk chunk = OneChunkPush(0, 0, 0, Filled(13, 1.0f));
         chunk.mutable_header()->set_length(26);
         return chunk;
       }()},
       "ended after 13 of 26"},
      {"other shard",
       {OneChunkPush(0, 1, 0, Filled(26, 1.0f))},
       "reached shard 0"},
      {"unknown shard",
       {OneChunkPush(0, 7, 0, Filled(26, 1.0f))},
       "reached shard 0"},
      {"bad rank", {OneChunkPush(1, 0, 0, Filled(26, 1.0f))}, "worker rank"},
      {"out of order",
       {[&] {
          PushChunk first = out_of_order;
          first.mutable_header()->set_length(26);
          return first;
        }(),
        Chunk(14, Filled(12, 1.0f))},
       "must begin where they end or end where they begin"},
      {"NaN", {OneChunkPush(0, 0, 0, with_nan)}, "push value 7 is nan"},
      {"Inf", {OneChunkPush(0, 0, 0, with_inf)}, "push value 25 is inf"},
      {"-Inf", {OneChunkPush(0, 0, 0, with_minus_inf)}, "push value 0 is -inf"},
      // What a shard restored from an older checkpoint answers a worker
      // that still holds newer weights: pull and compute again.
      {"future version",
       {OneChunkPush(0, 0, 3, Filled(26, 1.0f))},
       "only at version 0: the shard went back",
       grpc::StatusCode::ABORTED},
  };
  int rejected = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_THAT(RawPush(stub.get(), c.chunks),
                HasCodeAndMessage(c.code, HasSubstr(c.message)));
    ++rejected;
    const Pulled pulled = RawPull(stub.get(), 0, 0, 0);
    ASSERT_TRUE(pulled.status.ok()) << pulled.status.error_message();
    EXPECT_EQ(pulled.version, 0);
    EXPECT_EQ(pulled.values, initial);
  }
  // (A push whose stream ended short is counted when its call is done on
  // the shard, which may be just after the client has its answer: a
  // cancelled call is not counted, and gRPC may tell of the cancellation
  // only then.)
  StatsResponse stats = RawStats(stub.get());
  for (const absl::Time deadline = absl::Now() + absl::Seconds(30);
       stats.rejected_pushes() < rejected && absl::Now() < deadline;
       stats = RawStats(stub.get())) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(stats.pushes(), 0);
  EXPECT_EQ(stats.rejected_pushes(), rejected);
  EXPECT_EQ(stats.version(), 0);

  // The shard still takes a good push, which alone changes the weights.
  ASSERT_TRUE(
      RawPush(stub.get(), {OneChunkPush(0, 0, 0, Filled(26, 2.0f))}).ok());
  const Pulled after = RawPull(stub.get(), 0, 0, 1);
  ASSERT_TRUE(after.status.ok());
  std::vector<float> expected = initial;
  for (float& v : expected) v -= 0.5f * 2.0f;
  EXPECT_EQ(after.values, expected);
}

TEST_F(ParameterServiceTest, ValidPushChangesTheWeightsAsExpected) {
  std::unique_ptr<ShardServer> server = StartShard(config_, 1, 1);
  ASSERT_NE(server, nullptr);
  auto stub = StubFor(*server);
  std::vector<float> grad(27);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = 0.25f * i - 3.0f;
  // In three chunks.
  PushChunk first = OneChunkPush(0, 1, 0, {grad.begin(), grad.begin() + 10});
  first.mutable_header()->set_length(27);
  const std::vector<PushChunk> chunks = {
      first, Chunk(10, {grad.begin() + 10, grad.begin() + 20}),
      Chunk(20, {grad.begin() + 20, grad.end()})};
  PushResponse response;
  const grpc::Status status = RawPush(stub.get(), chunks, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.version(), 1);
  EXPECT_EQ(response.staleness(), 0);

  const Pulled pulled = RawPull(stub.get(), 0, 1, 1);
  ASSERT_TRUE(pulled.status.ok()) << pulled.status.error_message();
  EXPECT_EQ(pulled.version, 1);
  std::vector<float> expected = InitialWeights(config_, 26, 27);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] -= 0.5f * grad[i];
  EXPECT_EQ(pulled.values, expected);
  // An evaluator's pull is not counted in bytes_pulled.
  ASSERT_TRUE(RawPull(stub.get(), -1, 1, 0).status.ok());

  int64_t pushed_bytes = 0;
  for (const PushChunk& chunk : chunks) pushed_bytes += chunk.ByteSizeLong();
  PullChunk one_pull;
  one_pull.set_version(1);
  common::AppendFloatBytes(expected, one_pull.mutable_data());
  const StatsResponse stats = RawStats(stub.get());
  EXPECT_EQ(stats.shard(), 1);
  EXPECT_EQ(stats.version(), 1);
  EXPECT_EQ(stats.pushes(), 1);
  EXPECT_EQ(stats.samples(), 8);
  EXPECT_EQ(stats.bytes_pushed(), pushed_bytes);
  EXPECT_EQ(stats.bytes_pulled(),
            static_cast<int64_t>(one_pull.ByteSizeLong()));
  EXPECT_EQ(stats.rejected_pushes(), 0);
  EXPECT_THAT(stats.staleness_counts(), ElementsAre(1));
}

TEST_F(ParameterServiceTest, SyncPullCompletesOnlyAfterEveryWorkerPushed) {
  std::unique_ptr<ShardServer> server = StartShard(config_, 0, 2);
  ASSERT_NE(server, nullptr);
  auto stub = StubFor(*server);
  Pulled waited;
  absl::Notification pulled;
  std::thread puller([&] {
    waited = RawPull(stub.get(), 1, 0, /*min_version=*/1);
    pulled.Notify();
  });

  PushResponse response;
  ASSERT_TRUE(
      RawPush(stub.get(), {OneChunkPush(0, 0, 0, Filled(26, 1.0f))}, &response)
          .ok());
  EXPECT_EQ(response.version(), 0);  // still collecting step 0
  EXPECT_FALSE(pulled.HasBeenNotified());
  // A pull for version 1 cannot be answered yet: it runs into its deadline.
  const Pulled early = RawPull(stub.get(), 1, 0, 1, absl::Milliseconds(300));
  EXPECT_THAT(early.status, HasCode(grpc::StatusCode::DEADLINE_EXCEEDED));
  EXPECT_TRUE(early.values.empty());
  EXPECT_FALSE(pulled.HasBeenNotified());

  ASSERT_TRUE(
      RawPush(stub.get(), {OneChunkPush(1, 0, 0, Filled(26, 3.0f))}, &response)
          .ok());
  EXPECT_EQ(response.version(), 1);
  pulled.WaitForNotification();
  puller.join();
  ASSERT_TRUE(waited.status.ok()) << waited.status.error_message();
  EXPECT_EQ(waited.version, 1);
  std::vector<float> expected = InitialWeights(config_, 0, 26);
  for (float& v : expected) v -= 0.5f * 2.0f;  // the mean of 1 and 3
  EXPECT_EQ(waited.values, expected);
}

TEST_F(ParameterServiceTest, SyncPushesOfAClosedOrRepeatedStepAreRefused) {
  std::unique_ptr<ShardServer> server = StartShard(config_, 0, 2);
  ASSERT_NE(server, nullptr);
  auto stub = StubFor(*server);
  ASSERT_TRUE(
      RawPush(stub.get(), {OneChunkPush(0, 0, 0, Filled(26, 1.0f))}).ok());
  EXPECT_THAT(RawPush(stub.get(), {OneChunkPush(0, 0, 0, Filled(26, 1.0f))}),
              HasCode(grpc::StatusCode::ALREADY_EXISTS));
  ASSERT_TRUE(
      RawPush(stub.get(), {OneChunkPush(1, 0, 0, Filled(26, 1.0f))}).ok());
  const Pulled before = RawPull(stub.get(), 0, 0, 1);
  ASSERT_TRUE(before.status.ok());
  // The same examples again, once the step has closed: a duplicate.
  PushResponse repeat;
  ASSERT_TRUE(
      RawPush(stub.get(), {OneChunkPush(1, 0, 0, Filled(26, 1.0f))}, &repeat)
          .ok());
  EXPECT_TRUE(repeat.duplicate());
  // Other examples for the closed step: too stale to apply.
  EXPECT_THAT(RawPush(stub.get(), {OneChunkPush(1, 0, 0, Filled(26, 1.0f), 8,
                                                /*sample_offset=*/800)}),
              HasCodeAndMessage(grpc::StatusCode::ABORTED,
                                HasSubstr("pull and retry")));
  const Pulled after = RawPull(stub.get(), 0, 0, 0);
  ASSERT_TRUE(after.status.ok());
  EXPECT_EQ(after.version, 1);
  EXPECT_EQ(after.values, before.values);
  EXPECT_EQ(RawStats(stub.get()).rejected_pushes(), 2);
  // Counted by the code each rejection got.
  EXPECT_THAT(
      RawStats(stub.get()).rejected_pushes_by_code(),
      UnorderedElementsAre(Pair("ALREADY_EXISTS", 1), Pair("ABORTED", 1)));
  EXPECT_EQ(RawStats(stub.get()).duplicate_pushes(), 1);
}

TEST_F(ParameterServiceTest, DownpourPushesRecordTheirStaleness) {
  const TrainingConfig downpour = ResolvedConfig(
      "layer_sizes: [6, 5, 3] mode: DOWNPOUR learning_rate: 0.1 "
      "chunk_bytes: 262144");
  std::unique_ptr<ShardServer> server = StartShard(downpour, 0, 2);
  ASSERT_NE(server, nullptr);
  auto stub = StubFor(*server);
  PushResponse response;
  for (int64_t expected_version : {1, 2}) {
    ASSERT_TRUE(
        RawPush(stub.get(),
                {OneChunkPush(0, 0, expected_version - 1, Filled(26, 1.0f))},
                &response)
            .ok());
    EXPECT_EQ(response.version(), expected_version);
    EXPECT_EQ(response.staleness(), 0);
  }
  ASSERT_TRUE(
      RawPush(stub.get(), {OneChunkPush(1, 0, 0, Filled(26, 1.0f))}, &response)
          .ok());
  EXPECT_EQ(response.version(), 3);
  EXPECT_EQ(response.staleness(), 2);
  const StatsResponse stats = RawStats(stub.get());
  EXPECT_EQ(stats.version(), 3);
  EXPECT_EQ(stats.staleness_max(), 2);
  EXPECT_THAT(stats.staleness_counts(), ElementsAre(2, 0, 1));
}

TEST_F(ParameterServiceTest, MalformedPullsAreInvalid) {
  std::unique_ptr<ShardServer> server = StartShard(config_, 0, 2);
  ASSERT_NE(server, nullptr);
  auto stub = StubFor(*server);
  EXPECT_THAT(RawPull(stub.get(), 0, 1, 0).status,
              HasCodeAndMessage(grpc::StatusCode::INVALID_ARGUMENT,
                                HasSubstr("reached shard 0")));
  EXPECT_THAT(RawPull(stub.get(), 2, 0, 0).status,
              HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(RawPull(stub.get(), 0, 0, -1).status,
              HasCode(grpc::StatusCode::INVALID_ARGUMENT));
}

TEST_F(ParameterServiceTest, PullStreamsChunksOfAtMostChunkBytes) {
  // 400*400 + 400 + 400*10 + 10 = 164410 parameters; shard 0 of 2 holds
  // 82205, more than the 65536 values of one 262144-byte chunk.
  const TrainingConfig big = ResolvedConfig(
      "layer_sizes: [400, 400, 10] mode: SYNC chunk_bytes: 262144");
  std::unique_ptr<ShardServer> server = StartShard(big, 0, 1);
  ASSERT_NE(server, nullptr);
  auto stub = StubFor(*server);
  const Pulled pulled = RawPull(stub.get(), 0, 0, 0);
  ASSERT_TRUE(pulled.status.ok()) << pulled.status.error_message();
  EXPECT_THAT(pulled.chunk_offsets, ElementsAre(0, 65536));
  EXPECT_EQ(pulled.values, InitialWeights(big, 0, 82205));
}

TEST_F(ParameterServiceTest, HealthServiceReportsServing) {
  std::unique_ptr<ShardServer> server = StartShard(config_, 0, 2);
  ASSERT_NE(server, nullptr);
  grpc::GenericStub stub(grpc::CreateChannel(
      server->address(), grpc::InsecureChannelCredentials()));
  // grpc.health.v1.HealthCheckRequest{service: ""} is the empty message.
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(30));
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                 &request, &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  // HealthCheckResponse{status: SERVING}: field 1, varint 1.
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
}

TEST_F(ParameterServiceTest, ShutdownEndsAPullStillWaitingForItsVersion) {
  std::unique_ptr<ShardServer> server = StartShard(config_, 0, 2);
  ASSERT_NE(server, nullptr);
  auto stub = StubFor(*server);
  Pulled waited;
  std::thread puller([&] { waited = RawPull(stub.get(), 0, 0, 5); });
  server->Shutdown(absl::ZeroDuration());
  puller.join();
  EXPECT_THAT(waited.status, AnyOf(HasCode(grpc::StatusCode::CANCELLED),
                                   HasCode(grpc::StatusCode::UNAVAILABLE)));
  EXPECT_TRUE(waited.values.empty());
  server->Shutdown();  // idempotent
}

TEST(ShardServerTest, StartRefusesBadOptions) {
  ShardServerOptions options;
  options.config = ResolvedConfig(kSyncConfig);
  options.num_shards = 54;  // more shards than the 53 parameters
  EXPECT_THAT(ShardServer::Start(options),
              testutil::StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("--num_shards")));
  options.num_shards = 2;
  options.shard = 2;
  EXPECT_THAT(ShardServer::Start(options),
              testutil::StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("--shard")));
  options.shard = 0;
  options.num_workers = 0;
  EXPECT_THAT(ShardServer::Start(options),
              testutil::StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("--num_workers")));
}

TEST(ShardServerTest, AddressInUseIsUnavailable) {
  std::unique_ptr<ShardServer> first =
      StartShard(ResolvedConfig(kSyncConfig), 0, 1);
  ASSERT_NE(first, nullptr);
  ShardServerOptions options;
  options.config = ResolvedConfig(kSyncConfig);
  options.num_shards = 2;
  options.listen_address = first->address();
  EXPECT_THAT(ShardServer::Start(options),
              testutil::StatusIs(absl::StatusCode::kUnavailable,
                                 HasSubstr(first->address())));
}

// A shard started with a token answers every call that lacks it, or carries
// another, UNAUTHENTICATED, and reads and changes nothing.
TEST(AuthTest, CallsWithoutTheRunsTokenAreUnauthenticatedAndChangeNothing) {
  const std::string kToken = "0123456789abcdef0123456789abcdef";
  const TrainingConfig config = ResolvedConfig(kSyncConfig);
  ShardServerOptions options;
  options.config = config;
  options.shard = 0;
  options.num_shards = 2;
  options.num_workers = 1;
  options.auth_token = kToken;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardServer> server,
                       ShardServer::Start(options));
  auto stub = StubFor(*server);
  const std::vector<float> initial = InitialWeights(config, 0, 26);
  const std::vector<std::string> wrong = {
      "", "Bearer wrong-token-0123456789abcdef", "Bearer " + kToken + "0",
      "bearer " + kToken, kToken};
  for (const std::string& authorization : wrong) {
    SCOPED_TRACE(authorization);
    grpc::ClientContext register_context;
    Authorize(&register_context, authorization);
    RegisterRequest request;
    request.set_worker_rank(0);
    request.set_config_fingerprint(common::ConfigFingerprint(config));
    RegisterResponse response;
    EXPECT_THAT(stub->Register(&register_context, request, &response),
                HasCode(grpc::StatusCode::UNAUTHENTICATED));
    grpc::ClientContext stats_context;
    Authorize(&stats_context, authorization);
    StatsResponse stats;
    EXPECT_THAT(stub->Stats(&stats_context, StatsRequest(), &stats),
                HasCode(grpc::StatusCode::UNAUTHENTICATED));
    EXPECT_THAT(RawPush(stub.get(), {OneChunkPush(0, 0, 0, Filled(26, 1.0f))},
                        nullptr, authorization),
                HasCode(grpc::StatusCode::UNAUTHENTICATED));
    Pulled pulled =
        RawPull(stub.get(), 0, 0, 0, absl::Seconds(30), authorization);
    EXPECT_THAT(pulled.status, HasCode(grpc::StatusCode::UNAUTHENTICATED));
    EXPECT_TRUE(pulled.values.empty());
  }
  // Nothing was applied or counted.
  EXPECT_EQ(server->state()->version(), 0);
  const StatsResponse stats = server->state()->Stats();
  EXPECT_EQ(stats.pushes(), 0);
  EXPECT_EQ(stats.rejected_pushes(), 0);
  EXPECT_EQ(stats.bytes_pulled(), 0);
  // With the token, the same calls go through.
  const std::string bearer = "Bearer " + kToken;
  ASSERT_THAT(RawPush(stub.get(), {OneChunkPush(0, 0, 0, Filled(26, 1.0f))},
                      nullptr, bearer),
              HasCode(grpc::StatusCode::OK));
  Pulled pulled = RawPull(stub.get(), 0, 0, 1, absl::Seconds(30), bearer);
  ASSERT_THAT(pulled.status, HasCode(grpc::StatusCode::OK));
  EXPECT_EQ(pulled.version, 1);
  ASSERT_EQ(pulled.values.size(), 26u);
  EXPECT_EQ(pulled.values[0], initial[0] - 0.5f);
}

// Once a process has registered a rank, pushes and pulls for that rank are
// taken only with its session: another client cannot slip its gradient into
// the rank's sync step.
TEST(RankBindingTest, CallsForARegisteredRankNeedItsSession) {
  const TrainingConfig config = ResolvedConfig(kSyncConfig);
  std::unique_ptr<ShardServer> server = StartShard(config, 0, 1);
  ASSERT_NE(server, nullptr);
  auto stub = StubFor(*server);
  grpc::ClientContext context;
  RegisterRequest request;
  request.set_worker_rank(0);
  request.set_config_fingerprint(common::ConfigFingerprint(config));
  request.set_session(7);
  RegisterResponse response;
  ASSERT_THAT(stub->Register(&context, request, &response),
              HasCode(grpc::StatusCode::OK));

  for (uint64_t session : {uint64_t{0}, uint64_t{8}}) {
    PushChunk push = OneChunkPush(0, 0, 0, Filled(26, 1.0f));
    push.mutable_header()->set_session(session);
    EXPECT_THAT(RawPush(stub.get(), {push}),
                HasCodeAndMessage(grpc::StatusCode::PERMISSION_DENIED,
                                  HasSubstr("does not hold the rank")));
  }
  EXPECT_EQ(server->state()->version(), 0);
  EXPECT_EQ(server->state()->Stats().pushes(), 0);
  EXPECT_EQ(server->state()->Stats().rejected_pushes(), 2);
  EXPECT_THAT(server->state()->Stats().rejected_pushes_by_code(),
              UnorderedElementsAre(Pair("PERMISSION_DENIED", 2)));

  PushChunk push = OneChunkPush(0, 0, 0, Filled(26, 1.0f));
  push.mutable_header()->set_session(7);
  EXPECT_THAT(RawPush(stub.get(), {push}), HasCode(grpc::StatusCode::OK));
  EXPECT_EQ(server->state()->version(), 1);
  // A pull for the rank without its session is refused too; an evaluator's
  // (rank -1) needs none.
  EXPECT_THAT(RawPull(stub.get(), 0, 0, 0).status,
              HasCode(grpc::StatusCode::PERMISSION_DENIED));
  EXPECT_THAT(RawPull(stub.get(), -1, 0, 0).status,
              HasCode(grpc::StatusCode::OK));
}

// The attack a session 0 once allowed: a client holding the run's token
// registered a live worker's rank with session 0, which unbound the worker,
// then pushed into the rank's sync step without any session, and the
// worker's own push for the step was refused. Now a registration without a
// session is refused, the holder keeps the rank, and nothing changes.
TEST(RankBindingTest, ARegistrationWithoutASessionCannotTakeARank) {
  const TrainingConfig config = ResolvedConfig(kSyncConfig);
  std::unique_ptr<ShardServer> server = StartShard(config, 0, 2);
  ASSERT_NE(server, nullptr);
  auto stub = StubFor(*server);
  auto register_rank = [&](int rank, uint64_t session) {
    grpc::ClientContext context;
    RegisterRequest request;
    request.set_worker_rank(rank);
    request.set_config_fingerprint(common::ConfigFingerprint(config));
    request.set_session(session);
    RegisterResponse response;
    return stub->Register(&context, request, &response);
  };
  auto leave = [&](int rank, uint64_t session, bool finished) {
    grpc::ClientContext context;
    LeaveRequest request;
    request.set_worker_rank(rank);
    request.set_config_fingerprint(common::ConfigFingerprint(config));
    request.set_session(session);
    LeaveResponse response;
    return finished ? stub->FinishRank(&context, request, &response)
                    : stub->Leave(&context, request, &response);
  };
  ASSERT_THAT(register_rank(0, 7), HasCode(grpc::StatusCode::OK));
  ASSERT_THAT(register_rank(1, 9), HasCode(grpc::StatusCode::OK));

  // The attacker's registration: refused, naming what is missing.
  EXPECT_THAT(register_rank(0, 0),
              HasCodeAndMessage(grpc::StatusCode::INVALID_ARGUMENT,
                                HasSubstr("without a session id")));
  // Nor may it end or finish the rank for its holder.
  EXPECT_THAT(leave(0, 0, /*finished=*/true),
              HasCode(grpc::StatusCode::PERMISSION_DENIED));
  EXPECT_THAT(leave(0, 8, /*finished=*/false),
              HasCode(grpc::StatusCode::PERMISSION_DENIED));
  EXPECT_FALSE(server->state()->HasLeft(0));
  EXPECT_THAT(server->state()->Stats().finished_ranks(), testing::IsEmpty());
  // Its push into rank 0's step 0 without a session is refused...
  PushChunk forged = OneChunkPush(0, 0, 0, Filled(26, 100.0f));
  EXPECT_THAT(RawPush(stub.get(), {forged}),
              HasCode(grpc::StatusCode::PERMISSION_DENIED));
  // ...and the holder's own pushes close the step as if nothing happened.
  PushChunk own = OneChunkPush(0, 0, 0, Filled(26, 1.0f));
  own.mutable_header()->set_session(7);
  PushChunk other = OneChunkPush(1, 0, 0, Filled(26, 3.0f));
  other.mutable_header()->set_session(9);
  std::thread rank0([&] {
    EXPECT_THAT(RawPush(stub.get(), {own}), HasCode(grpc::StatusCode::OK));
  });
  EXPECT_THAT(RawPush(stub.get(), {other}), HasCode(grpc::StatusCode::OK));
  rank0.join();
  EXPECT_EQ(server->state()->version(), 1);
  const std::vector<float> initial = InitialWeights(config, 0, 26);
  const Pulled pulled = RawPull(stub.get(), -1, 0, 1);
  ASSERT_THAT(pulled.status, HasCode(grpc::StatusCode::OK));
  ASSERT_EQ(pulled.values.size(), 26u);
  // SGD at rate 0.5 on the mean of 1 and 3.
  EXPECT_EQ(pulled.values[0], initial[0] - 0.5f * 2.0f);
}

// Finite values that would poison the model, and claims that would
// overflow the shard's counters, are refused and change nothing.
TEST(PoisonTest, HugeValuesAndExampleCountsAreRefused) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [6, 5, 3] mode: DOWNPOUR optimizer: ADAGRAD "
      "learning_rate: 0.5 chunk_bytes: 262144 batch_size: 8 n_push: 2");
  std::unique_ptr<ShardServer> server = StartShard(config, 0, 1);
  ASSERT_NE(server, nullptr);
  auto stub = StubFor(*server);
  // 1e20 once would make Adagrad's accumulator infinite for good.
  std::vector<float> poison(26, 0.0f);
  poison[9] = 1e20f;
  EXPECT_THAT(RawPush(stub.get(), {OneChunkPush(0, 0, 0, poison)}),
              HasCodeAndMessage(grpc::StatusCode::INVALID_ARGUMENT,
                                HasSubstr("push value 9 is 1e+20")));
  // batch_size 8 x n_push 2: a push summarizes at most 16 examples.
  EXPECT_THAT(RawPush(stub.get(),
                      {OneChunkPush(0, 0, 0, Filled(26, 1.0f),
                                    std::numeric_limits<int64_t>::max(), 0)}),
              HasCodeAndMessage(grpc::StatusCode::INVALID_ARGUMENT,
                                HasSubstr("summarizes at most 16")));
  EXPECT_EQ(server->state()->version(), 0);
  EXPECT_EQ(server->state()->Stats().samples(), 0);
  EXPECT_THAT(
      RawPush(stub.get(), {OneChunkPush(0, 0, 0, Filled(26, 1.0f), 16, 0)}),
      HasCode(grpc::StatusCode::OK));
  EXPECT_EQ(server->state()->version(), 1);
}

// A client that opens pushes and never ends them holds at most its rank's
// slots (each a shard-sized buffer): the next is refused, and a push that
// ends gives its slot back.
TEST(ResourceTest, PushesHeldOpenBeyondARanksSlotsAreRefused) {
  const TrainingConfig config = ResolvedConfig(kSyncConfig);
  ShardServerOptions options;
  options.config = config;
  options.num_shards = 2;
  options.max_pushes_per_rank = 1;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardServer> server,
                       ShardServer::Start(options));
  auto stub = StubFor(*server);
  const int64_t buffers = server->state()->buffers().allocations();
  grpc::ClientContext held_context;
  SetDeadline(&held_context, absl::Seconds(30));
  PushResponse held_response;
  auto held = stub->Push(&held_context, &held_response);
  PushChunk first = OneChunkPush(0, 0, 0, Filled(10, 1.0f));
  first.mutable_header()->set_length(26);
  ASSERT_TRUE(held->Write(first));
  // Once the shard has read it, the push holds a buffer.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (server->state()->buffers().allocations() == buffers) {
    ASSERT_LT(absl::Now(), deadline) << "the shard never read the push";
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_THAT(RawPush(stub.get(), {OneChunkPush(0, 0, 0, Filled(26, 1.0f))}),
              HasCodeAndMessage(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                HasSubstr("already has 1 pushes in flight")));
  held->WritesDone();
  EXPECT_THAT(held->Finish(), HasCode(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(RawPush(stub.get(), {OneChunkPush(0, 0, 0, Filled(26, 1.0f))}),
              HasCode(grpc::StatusCode::OK));
  EXPECT_EQ(server->state()->version(), 1);
}

// Pulls that wait (or are never read) hold at most their rank's pull slots:
// the next is refused, other ranks still pull, and a pull that ends gives
// its slot back.
TEST(ResourceTest, PullsHeldBeyondARanksSlotsAreRefused) {
  const TrainingConfig config = ResolvedConfig(kSyncConfig);
  ShardServerOptions options;
  options.config = config;
  options.num_shards = 2;
  options.max_pulls_per_rank = 2;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardServer> server,
                       ShardServer::Start(options));
  auto stub = StubFor(*server);
  PullRequest waiting;
  waiting.set_worker_rank(0);
  waiting.set_min_version(5);  // never reached: the pulls wait
  grpc::ClientContext first_context, second_context;
  SetDeadline(&first_context, absl::Seconds(30));
  SetDeadline(&second_context, absl::Seconds(30));
  auto first = stub->Pull(&first_context, waiting);
  auto second = stub->Pull(&second_context, waiting);
  // Once both wait at the shard, a third pull of rank 0 is refused.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (server->state()->NumWaiting() < 2) {
    ASSERT_LT(absl::Now(), deadline) << "the pulls never reached the shard";
    absl::SleepFor(absl::Milliseconds(5));
  }
  const Pulled third = RawPull(stub.get(), 0, 0, 0);
  EXPECT_THAT(third.status,
              HasCodeAndMessage(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                HasSubstr("already has 2 pulls in flight")));
  // The evaluator (rank -1) has slots of its own.
  EXPECT_THAT(RawPull(stub.get(), -1, 0, 0).status,
              HasCode(grpc::StatusCode::OK));
  first_context.TryCancel();
  EXPECT_THAT(first->Finish(), HasCode(grpc::StatusCode::CANCELLED));
  // The cancelled pull's slot comes back once the shard has ended it.
  while (!RawPull(stub.get(), 0, 0, 0).status.ok()) {
    ASSERT_LT(absl::Now(), deadline) << "the slot never came back";
    absl::SleepFor(absl::Milliseconds(5));
  }
  second_context.TryCancel();
  EXPECT_THAT(second->Finish(), HasCode(grpc::StatusCode::CANCELLED));
}

// A push-pull takes a pull slot of its rank for its wait: beyond the slots
// its push is still applied, and the answer says so.
TEST(ResourceTest, APushPullWaitsOnlyWithAPullSlot) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [6, 5, 3] mode: DOWNPOUR optimizer: SGD learning_rate: "
      "0.5 momentum: 0 chunk_bytes: 262144 batch_size: 8");
  ShardServerOptions options;
  options.config = config;
  options.num_shards = 2;
  options.num_workers = 2;
  options.max_pulls_per_rank = 1;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardServer> server,
                       ShardServer::Start(options));
  auto stub = StubFor(*server);
  PullRequest waiting;
  waiting.set_worker_rank(0);
  waiting.set_min_version(100);
  grpc::ClientContext held_context;
  SetDeadline(&held_context, absl::Seconds(30));
  auto held = stub->Pull(&held_context, waiting);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (server->state()->NumWaiting() < 1) {
    ASSERT_LT(absl::Now(), deadline) << "the pull never reached the shard";
    absl::SleepFor(absl::Milliseconds(5));
  }
  auto push_pull = [&](int rank, int64_t offset) {
    grpc::ClientContext context;
    SetDeadline(&context, absl::Seconds(30));
    auto stream = stub->PushPull(&context);
    stream->Write(OneChunkPush(rank, 0, 0, Filled(26, 1.0f), 8, offset));
    stream->WritesDone();
    PullChunk chunk;
    while (stream->Read(&chunk)) {
    }
    return stream->Finish();
  };
  EXPECT_THAT(push_pull(0, 0),
              HasCodeAndMessage(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                HasSubstr("its push was taken")));
  EXPECT_EQ(server->state()->version(), 1);
  EXPECT_THAT(push_pull(1, 0), HasCode(grpc::StatusCode::OK));
  EXPECT_EQ(server->state()->version(), 2);
  held_context.TryCancel();
  EXPECT_THAT(held->Finish(), HasCode(grpc::StatusCode::CANCELLED));
  // Its slot back, rank 0's next push-pull waits and answers.
  while (true) {
    const grpc::Status status = push_pull(0, 8);
    if (status.ok()) break;
    ASSERT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    ASSERT_LT(absl::Now(), deadline) << "the slot never came back";
    absl::SleepFor(absl::Milliseconds(5));
  }
}

// A pull that waits for a version that does not come is ended by the shard
// after its bound, even when its client set no deadline, and gives its slot
// back.
TEST(ResourceTest, APullWaitsNoLongerThanTheShardsBound) {
  const TrainingConfig config = ResolvedConfig(kSyncConfig);
  ShardServerOptions options;
  options.config = config;
  options.num_shards = 2;
  options.max_pulls_per_rank = 1;
  options.max_wait = absl::Milliseconds(300);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardServer> server,
                       ShardServer::Start(options));
  auto stub = StubFor(*server);
  PullRequest waiting;
  waiting.set_worker_rank(0);
  waiting.set_min_version(5);
  grpc::ClientContext context;  // no deadline
  auto reader = stub->Pull(&context, waiting);
  PullChunk chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  EXPECT_THAT(reader->Finish(),
              HasCodeAndMessage(grpc::StatusCode::DEADLINE_EXCEEDED,
                                HasSubstr("waited 300ms for version 5 of "
                                          "shard 0, which is at version 0")));
  EXPECT_EQ(server->state()->NumWaiting(), 0u);
  // Its slot comes back once the shard has ended the call.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!RawPull(stub.get(), 0, 0, 0).status.ok()) {
    ASSERT_LT(absl::Now(), deadline) << "the slot never came back";
    absl::SleepFor(absl::Milliseconds(5));
  }
}

// Generated bad requests over gRPC: push streams whose chunks take random
// values in every field, from plausible to absurd (ranks, shards, versions,
// lengths, offsets, example counts, encodings, NaN, infinite and huge
// values, partial floats, chunks out of order or missing a header). Every
// call gets an answer; only whole, valid pushes are applied (each one moves
// the version by one); the weights stay finite; the shard still serves.
TEST(BadRequestTest, RandomPushStreamsAreAnsweredAndApplyOnlyValidPushes) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [6, 5, 3] mode: DOWNPOUR optimizer: ADAGRAD "
      "learning_rate: 0.5 chunk_bytes: 262144 batch_size: 8");
  std::unique_ptr<ShardServer> server = StartShard(config, 0, 4);
  ASSERT_NE(server, nullptr);
  auto stub = StubFor(*server);
  std::mt19937_64 random(42);
  auto pick = [&](std::initializer_list<int64_t> choices) {
    return *(choices.begin() + random() % choices.size());
  };
  auto value = [&]() -> float {
    switch (random() % 8) {
      case 0:
        return std::numeric_limits<float>::quiet_NaN();
      case 1:
        return std::numeric_limits<float>::infinity();
      case 2:
        return 3e38f;
      default:
        return static_cast<float>(static_cast<int64_t>(random() % 2001) -
                                  1000) /
               1000.0f;
    }
  };
  int ok = 0, applied = 0;
  for (int call = 0; call < 400; ++call) {
    // A valid push of this call's examples, in one chunk or two ...
    std::vector<PushChunk> chunks;
    std::vector<float> values(26);
    for (float& v : values) v = value() == value() ? 0.25f : -0.5f;
    if (random() % 2 == 0) {
      chunks.push_back(OneChunkPush(static_cast<int>(random() % 4), 0, 0,
                                    values, 8, 8 * call));
    } else {
      chunks.push_back(
          OneChunkPush(static_cast<int>(random() % 4), 0, 0,
                       std::vector<float>(values.begin(), values.begin() + 13),
                       8, 8 * call));
      chunks[0].mutable_header()->set_length(26);
      chunks.push_back(
          Chunk(13, std::vector<float>(values.begin() + 13, values.end())));
    }
    // ... with none to three mutations, each of any field.
    const int mutations = static_cast<int>(random() % 4);
    for (int m = 0; m < mutations; ++m) {
      PushChunk& chunk = chunks[random() % chunks.size()];
      PushHeader* h = chunks[0].mutable_header();
      switch (random() % 14) {
        case 0:
          h->set_worker_rank(static_cast<int32_t>(pick({-2, 4, 1000})));
          break;
        case 1:
          h->set_shard(static_cast<int32_t>(pick({1, -1})));
          break;
        case 2:
          h->set_base_version(pick({1, -1, int64_t{1} << 40}));
          break;
        case 3:
          h->set_length(pick({0, 25, 27, int64_t{1} << 40}));
          break;
        case 4:
          h->set_samples(pick({-1, 9, int64_t{1} << 62}));
          break;
        case 5:
          h->set_sample_offset(pick({-1, int64_t{1} << 60}));
          break;
        case 6:
          h->set_encoding(static_cast<PushEncoding>(pick({1, 7})));
          break;
        case 7:
          chunk.set_offset(pick({1, 13, 26, int64_t{1} << 50}));
          break;
        case 8: {  // a value NaN, infinite, or huge
          std::vector<float> bad(chunk.data().size() / sizeof(float));
          if (bad.empty()) break;
          common::CopyBytesToFloats(chunk.data(), bad.data());
          bad[random() % bad.size()] =
              value() == value() ? 3e38f
                                 : std::numeric_limits<float>::quiet_NaN();
          chunk.clear_data();
          common::AppendFloatBytes(bad, chunk.mutable_data());
          break;
        }
        case 9:
          chunk.mutable_data()->append("\x01\x02\x03");
          break;
        case 10:
          chunk.set_scales(std::string(8, '\x7f'));
          break;
        case 11:
          chunks[0].clear_header();
          break;
        case 12:
          chunks.push_back(chunks.back());  // a chunk twice
          break;
        default:
          chunks.back().clear_data();
          break;
      }
    }
    PushResponse response;
    const grpc::Status status = RawPush(stub.get(), chunks, &response);
    ASSERT_NE(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
        << "call " << call << " got no answer";
    ASSERT_NE(status.error_code(), grpc::StatusCode::UNKNOWN) << call;
    ASSERT_NE(status.error_code(), grpc::StatusCode::INTERNAL) << call;
    if (status.ok()) {
      ++ok;
      if (!response.duplicate()) ++applied;
    }
  }
  RecordProperty("answered_ok", ok);
  RecordProperty("applied", applied);
  // Some pushes were whole and valid, most were not.
  EXPECT_GT(applied, 0);
  EXPECT_LT(ok, 400);
  EXPECT_EQ(server->state()->version(), applied);
  const Pulled pulled = RawPull(stub.get(), -1, 0, 0);
  ASSERT_TRUE(pulled.status.ok()) << pulled.status.error_message();
  ASSERT_EQ(pulled.values.size(), 26u);
  for (float w : pulled.values) EXPECT_TRUE(std::isfinite(w));
}

}  // namespace
}  // namespace monsoon::server
