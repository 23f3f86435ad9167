// PsClient against real ShardServers on 127.0.0.1:0.
#include "worker/ps_client.h"

#include <arpa/inet.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/model_layout.h"
#include "common/onebit.h"
#include "common/socket_buffers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard_server.h"
#include "tests/local_shards.h"
#include "tests/running_time.h"
#include "tests/status_matchers.h"
#include "tests/tcp_proxy.h"
#include "tests/test_util.h"

namespace monsoon::worker {
namespace {

using ::monsoon::testutil::ResolvedConfig;
using ::monsoon::testutil::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// 53 parameters on two shards: [0, 26) and [26, 53).
constexpr char kSmallConfig[] =
    "layer_sizes: [6, 5, 3] mode: SYNC optimizer: SGD learning_rate: 1 "
    "momentum: 0 chunk_bytes: 262144";

std::vector<std::unique_ptr<server::ShardServer>> StartShards(
    const TrainingConfig& config, int num_shards, int num_workers) {
  return testutil::StartLocalShards(config, num_shards, num_workers);
}

PsClientOptions OptionsFor(
    const std::vector<std::unique_ptr<server::ShardServer>>& servers,
    const TrainingConfig& config, int rank = 0) {
  return testutil::ClientOptions(servers, config, rank);
}

std::vector<float> AllInitialValues(const TrainingConfig& config) {
  const common::ModelLayout layout = common::ModelLayout::FromConfig(config);
  std::vector<float> values(layout.num_params());
  common::InitialValues(layout, config.seed(), 0, absl::MakeSpan(values));
  return values;
}

// A port on 127.0.0.1 that is bound, so no one else gets it, but where no
// one listens: connections to it are refused.
class ReservedPort {
 public:
  ReservedPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address = {};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    socklen_t length = sizeof(address);
    if (fd_ < 0 ||
        ::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
            0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) !=
            0) {
      ADD_FAILURE() << "cannot reserve a port";
      return;
    }
    port_ = ntohs(address.sin_port);
  }
  ~ReservedPort() {
    if (fd_ >= 0) ::close(fd_);
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// kSmallConfig on two shards, one worker, and that worker's client.
class TwoShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(cluster.client, nullptr);
    client = cluster.client.get();
  }

  const TrainingConfig config = ResolvedConfig(kSmallConfig);
  testutil::LocalCluster cluster{config, 2, 1};
  PsClient* client = nullptr;
};

TEST(PsClientTest, ConnectToAnAddressWhereNoServerRunsIsUnavailableNamingIt) {
  const TrainingConfig config = ResolvedConfig(kSmallConfig);
  std::vector<std::unique_ptr<server::ShardServer>> servers =
      StartShards(config, 2, 1);
  ASSERT_EQ(servers.size(), 2u);
  ReservedPort nobody;
  PsClientOptions options = OptionsFor(servers, config);
  // Shard 0 is the missing one: with a live shard first, its registration
  // could use up the second on a loaded machine (it did once under
  // ThreadSanitizer), and the error would name it instead.
  options.server_addresses[0] = nobody.address();
  options.connect_timeout = absl::Seconds(1);
  EXPECT_THAT(
      PsClient::Connect(options),
      StatusIs(absl::StatusCode::kUnavailable,
               AllOf(HasSubstr("shard 0 at " + nobody.address()),
                     HasSubstr("is ps_server running there"))));
}

TEST(PsClientTest, ALauncherEndsADeadWorkersSessionAndItsDataShardGoesBack) {
  const TrainingConfig config = ResolvedConfig(
      absl::StrCat(kSmallConfig, " elastic: true batch_size: 2"));
  std::vector<std::unique_ptr<server::ShardServer>> servers =
      StartShards(config, 2, 2);
  PsClientOptions options = OptionsFor(servers, config, 1);
  options.session = 77;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> worker,
                       PsClient::Connect(options));
  ASSERT_OK_AND_ASSIGN(TakeDataResponse taken,
                       worker->TakeData(20, std::nullopt, 0, absl::Seconds(5)));
  ASSERT_EQ(taken.kind(), TakeDataResponse::SHARD);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> launcher,
                       PsClient::Connect(OptionsFor(servers, config, -1)));
  // Only the session that holds the rank is ended, and only by rank -1.
  EXPECT_THAT(launcher->EndSessionOf(1, 78, absl::Seconds(5)),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(worker->EndSessionOf(1, 77, absl::Seconds(5)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("only a client of rank -1")));
  ASSERT_OK_AND_ASSIGN(std::vector<StatsResponse> before,
                       launcher->Stats(absl::Seconds(5)));
  EXPECT_THAT(before[0].live_ranks(), ElementsAre(1));
  EXPECT_EQ(before[0].data_queue().in_flight_size(), 1);
  EXPECT_EQ(before[0].data_queue().put_back_size(), 0);

  ASSERT_OK(launcher->EndSessionOf(1, 77, absl::Seconds(5)));
  ASSERT_OK_AND_ASSIGN(std::vector<StatsResponse> after,
                       launcher->Stats(absl::Seconds(5)));
  for (const StatsResponse& shard : after) {
    EXPECT_THAT(shard.live_ranks(), ::testing::IsEmpty());
  }
  EXPECT_EQ(after[0].data_queue().in_flight_size(), 0);
  ASSERT_EQ(after[0].data_queue().put_back_size(), 1);
  EXPECT_EQ(after[0].data_queue().put_back(0).index(), taken.shard().index());
}

TEST(PsClientTest, ConnectWithoutServersIsInvalid) {
  PsClientOptions options;
  options.config = ResolvedConfig(kSmallConfig);
  EXPECT_THAT(PsClient::Connect(options),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// Refused, naming both fingerprints and the fields that differ (the
// shard's value, then this daemon's).
TEST(PsClientTest, ConnectWithADifferentConfigIsFailedPrecondition) {
  const TrainingConfig config = ResolvedConfig(kSmallConfig);
  std::vector<std::unique_ptr<server::ShardServer>> servers =
      StartShards(config, 2, 1);
  ASSERT_EQ(servers.size(), 2u);
  TrainingConfig other = config;
  other.set_learning_rate(0.5f);
  other.set_batch_size(config.batch_size() + 1);
  EXPECT_THAT(
      PsClient::Connect(OptionsFor(servers, other)),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               AllOf(HasSubstr(servers[0]->address()),
                     HasSubstr(absl::StrFormat(
                         "%016x", common::ConfigFingerprint(other))),
                     HasSubstr(absl::StrFormat(
                         "%016x", common::ConfigFingerprint(config))),
                     HasSubstr("shard 0's config -> this daemon's: "
                               "learning_rate: 1 -> 0.5; batch_size: 64 -> "
                               "65"))));
}

TEST(PsClientTest, ConnectWithServersOutOfOrderIsRefused) {
  const TrainingConfig config = ResolvedConfig(kSmallConfig);
  std::vector<std::unique_ptr<server::ShardServer>> servers =
      StartShards(config, 2, 1);
  ASSERT_EQ(servers.size(), 2u);
  PsClientOptions options = OptionsFor(servers, config);
  std::swap(options.server_addresses[0], options.server_addresses[1]);
  EXPECT_THAT(PsClient::Connect(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("this is shard 1, not shard 0")));
}

TEST(PsClientTest, ConnectWithAnotherWorkerCountIsFailedPrecondition) {
  const TrainingConfig config = ResolvedConfig(kSmallConfig);
  std::vector<std::unique_ptr<server::ShardServer>> servers =
      StartShards(config, 2, 2);
  ASSERT_EQ(servers.size(), 2u);
  PsClientOptions options = OptionsFor(servers, config);
  options.num_workers = 3;
  EXPECT_THAT(PsClient::Connect(options),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("started with --num_workers=3 but shard 0 "
                                 "with --num_workers=2")));
  options.num_workers = 2;
  EXPECT_OK(PsClient::Connect(options).status());
}

TEST(PsClientTest, ConnectToFewerServersThanShardsIsFailedPrecondition) {
  const TrainingConfig config = ResolvedConfig(kSmallConfig);
  std::vector<std::unique_ptr<server::ShardServer>> servers =
      StartShards(config, 2, 1);
  ASSERT_EQ(servers.size(), 2u);
  PsClientOptions options = OptionsFor(servers, config);
  options.server_addresses.pop_back();
  EXPECT_THAT(PsClient::Connect(options),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("this client lists 1 shards in --servers but "
                                 "shard 0 was started with --num_shards=2")));
}

TEST_F(TwoShardsTest, PushAndPullRoundTripAcrossTwoShards) {
  EXPECT_EQ(client->num_shards(), 2);
  ASSERT_EQ(client->ranges().size(), 2u);
  EXPECT_EQ(client->ranges()[0].begin, 0u);
  EXPECT_EQ(client->ranges()[0].end, 26u);
  EXPECT_EQ(client->ranges()[1].begin, 26u);
  EXPECT_EQ(client->ranges()[1].end, 53u);
  EXPECT_THAT(client->initial_versions(), ElementsAre(0, 0));

  std::vector<float> params(53, -100.0f);
  std::vector<int64_t> versions;
  ASSERT_OK(
      client->Pull(0, absl::Seconds(30), absl::MakeSpan(params), &versions));
  EXPECT_THAT(versions, ElementsAre(0, 0));
  const std::vector<float> initial = AllInitialValues(config);
  EXPECT_EQ(params, initial);

  std::vector<float> grads(53);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.5f * i - 10.0f;
  std::vector<PushResponse> responses;
  ASSERT_OK(client->Push(grads, versions, /*samples=*/16, &responses));
  ASSERT_EQ(responses.size(), 2u);
  EXPECT_EQ(responses[0].version(), 1);
  EXPECT_EQ(responses[1].version(), 1);

  ASSERT_OK(
      client->Pull(1, absl::Seconds(30), absl::MakeSpan(params), &versions));
  EXPECT_THAT(versions, ElementsAre(1, 1));
  std::vector<float> expected = initial;
  for (size_t i = 0; i < expected.size(); ++i) expected[i] -= 1.0f * grads[i];
  EXPECT_EQ(params, expected);

  ASSERT_OK_AND_ASSIGN(std::vector<StatsResponse> stats,
                       client->Stats(absl::Seconds(30)));
  ASSERT_EQ(stats.size(), 2u);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(stats[s].shard(), s);
    EXPECT_EQ(stats[s].version(), 1);
    EXPECT_EQ(stats[s].samples(), 16);
  }
  EXPECT_EQ(stats[0].bytes_pushed() + stats[1].bytes_pushed(),
            client->bytes_pushed());
  EXPECT_EQ(stats[0].bytes_pulled() + stats[1].bytes_pulled(),
            client->bytes_pulled());
  EXPECT_GT(client->bytes_pushed(), static_cast<int64_t>(53 * sizeof(float)));
}

// Shards on Unix domain sockets (ps_server --listen=unix:PATH), for
// workers on their machine: the same calls, the same answers.
TEST(PsClientTest, PushAndPullOverUnixDomainSockets) {
  // A short folder: a socket's path must fit 107 bytes, which the test's
  // own temporary folder may not leave.
  char dir[] = "/tmp/monsoon-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const TrainingConfig config = ResolvedConfig(kSmallConfig);
  std::vector<std::unique_ptr<server::ShardServer>> servers =
      testutil::StartLocalShards(config, 2, 1, "", dir);
  ASSERT_EQ(servers.size(), 2u);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(servers[s]->address(),
              absl::StrCat("unix:", dir, "/shard-", s, ".sock"));
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> client,
                       PsClient::Connect(OptionsFor(servers, config)));
  std::vector<float> params(53, -100.0f);
  std::vector<int64_t> versions;
  ASSERT_OK(
      client->Pull(0, absl::Seconds(30), absl::MakeSpan(params), &versions));
  const std::vector<float> initial = AllInitialValues(config);
  EXPECT_EQ(params, initial);
  std::vector<float> grads(53);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.5f * i - 10.0f;
  ASSERT_OK(client->Push(grads, versions, /*samples=*/16));
  ASSERT_OK(
      client->Pull(1, absl::Seconds(30), absl::MakeSpan(params), &versions));
  EXPECT_THAT(versions, ElementsAre(1, 1));
  std::vector<float> expected = initial;
  for (size_t i = 0; i < expected.size(); ++i) expected[i] -= 1.0f * grads[i];
  EXPECT_EQ(params, expected);
  // Every connection's sockets, the client's end and the shard's, hold a
  // MiB-sized message in flight (common/socket_buffers.h): the kernel sets
  // twice the size asked, capped at net.core.wmem_max and rmem_max.
  auto sysctl = [](const char* path) {
    int64_t value = 0;
    std::ifstream(path) >> value;
    return value;
  };
  const int64_t wanted = common::kUnixSocketBufferBytes;
  const int64_t send_buffer =
      2 * std::min(wanted, sysctl("/proc/sys/net/core/wmem_max"));
  const int64_t receive_buffer =
      2 * std::min(wanted, sysctl("/proc/sys/net/core/rmem_max"));
  int connected = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator("/proc/self/fd")) {
    int fd = -1;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &fd)) continue;
    sockaddr_un local = {}, peer = {};
    socklen_t local_length = sizeof(local), peer_length = sizeof(peer);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) !=
            0 ||
        local.sun_family != AF_UNIX ||
        getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) !=
            0) {
      continue;  // not a connected Unix socket
    }
    // The shard's end is named by the socket's path, the client's by its
    // peer's.
    const std::string path(local_length > sizeof(sa_family_t) ? local.sun_path
                                                              : peer.sun_path);
    if (!absl::StartsWith(path, dir)) continue;
    int sndbuf = 0, rcvbuf = 0;
    socklen_t length = sizeof(int);
    ASSERT_EQ(getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, &length), 0);
    ASSERT_EQ(getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, &length), 0);
    EXPECT_EQ(sndbuf, send_buffer) << path;
    EXPECT_EQ(rcvbuf, receive_buffer) << path;
    ++connected;
  }
  // The client's connection to each shard: both ends.
  EXPECT_EQ(connected, 4);
  client.reset();
  for (auto& server : servers) server->Shutdown(absl::ZeroDuration());
  servers.clear();
  // The shards took their sockets with them.
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}

TEST(PsClientTest, ChunkedPushAndPullReassembleALargeModel) {
  // 400*400 + 400 + 400*10 + 10 = 164410 parameters: 82205 per shard, more
  // than the 65536 values of one 262144-byte chunk.
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [400, 400, 10] mode: SYNC optimizer: SGD "
      "learning_rate: 1 momentum: 0 chunk_bytes: 262144");
  std::vector<std::unique_ptr<server::ShardServer>> servers =
      StartShards(config, 2, 1);
  ASSERT_EQ(servers.size(), 2u);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> client,
                       PsClient::Connect(OptionsFor(servers, config)));
  ASSERT_EQ(client->ranges()[0].size(), 82205u);

  std::vector<float> params(164410);
  std::vector<int64_t> versions;
  ASSERT_OK(
      client->Pull(0, absl::Seconds(30), absl::MakeSpan(params), &versions));
  const std::vector<float> initial = AllInitialValues(config);
  EXPECT_EQ(params, initial);

  // A gradient whose every value differs, so that a misplaced chunk shows.
  std::vector<float> grads(params.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    grads[i] = static_cast<float>(i % 1000) * 0.001f - 0.5f;
  }
  ASSERT_OK(client->Push(grads, versions, 1));
  ASSERT_OK(
      client->Pull(1, absl::Seconds(30), absl::MakeSpan(params), &versions));
  EXPECT_THAT(versions, ElementsAre(1, 1));
  std::vector<float> expected = initial;
  for (size_t i = 0; i < expected.size(); ++i) expected[i] -= grads[i];
  EXPECT_EQ(params, expected);

  ASSERT_OK_AND_ASSIGN(std::vector<StatsResponse> stats,
                       client->Stats(absl::Seconds(30)));
  EXPECT_EQ(stats[0].bytes_pushed() + stats[1].bytes_pushed(),
            client->bytes_pushed());
  EXPECT_EQ(stats[0].bytes_pulled() + stats[1].bytes_pulled(),
            client->bytes_pulled());
}

TEST(PsClientTest, PullForAVersionNeverReachedIsDeadlineExceeded) {
  const TrainingConfig config = ResolvedConfig(kSmallConfig);
  std::vector<std::unique_ptr<server::ShardServer>> servers =
      StartShards(config, 2, 1);
  ASSERT_EQ(servers.size(), 2u);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> client,
                       PsClient::Connect(OptionsFor(servers, config)));
  std::vector<float> params(53);
  std::vector<int64_t> versions;
  EXPECT_THAT(client->Pull(1, absl::Milliseconds(300), absl::MakeSpan(params),
                           &versions),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("shard 0 at " + servers[0]->address())));
}

TEST(PsClientTest, AsyncPullWaitsForTheBarrier) {
  const TrainingConfig config = ResolvedConfig(kSmallConfig);
  std::vector<std::unique_ptr<server::ShardServer>> servers =
      StartShards(config, 2, 2);
  ASSERT_EQ(servers.size(), 2u);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> worker0,
                       PsClient::Connect(OptionsFor(servers, config, 0)));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> worker1,
                       PsClient::Connect(OptionsFor(servers, config, 1)));
  std::vector<float> params(53);
  std::vector<int64_t> versions;
  std::unique_ptr<PendingCall> pull = worker0->PullAsync(
      1, absl::Seconds(30), absl::MakeSpan(params), &versions);
  const std::vector<float> ones(53, 1.0f), threes(53, 3.0f);
  ASSERT_OK(worker0->Push(ones, {0, 0}, 1));
  ASSERT_OK(worker1->Push(threes, {0, 0}, 1));
  ASSERT_OK(pull->Wait());
  EXPECT_THAT(versions, ElementsAre(1, 1));
  std::vector<float> expected = AllInitialValues(config);
  for (float& v : expected) v -= 2.0f;  // the mean of 1 and 3
  EXPECT_EQ(params, expected);
}

TEST(PsClientTest, PushErrorsNameTheShard) {
  const TrainingConfig config = ResolvedConfig(kSmallConfig);
  std::vector<std::unique_ptr<server::ShardServer>> servers =
      StartShards(config, 2, 1);
  ASSERT_EQ(servers.size(), 2u);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> evaluator,
                       PsClient::Connect(OptionsFor(servers, config, -1)));
  // An evaluator (rank -1) may pull but not push.
  std::vector<float> params(53);
  std::vector<int64_t> versions;
  ASSERT_OK(
      evaluator->Pull(0, absl::Seconds(30), absl::MakeSpan(params), &versions));
  EXPECT_THAT(evaluator->Push(params, versions, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("shard 0 at " + servers[0]->address()),
                             HasSubstr("worker rank -1"))));
  // The evaluator's pull is not counted as worker traffic.
  ASSERT_OK_AND_ASSIGN(std::vector<StatsResponse> stats,
                       evaluator->Stats(absl::Seconds(30)));
  EXPECT_EQ(stats[0].bytes_pulled(), 0);
  EXPECT_EQ(stats[0].rejected_pushes(), 1);
  EXPECT_EQ(stats[1].rejected_pushes(), 1);
}

std::vector<float> Ramp53() {
  std::vector<float> grads(53);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.5f * i - 10.0f;
  return grads;
}

// A float32 payload of `values`, borrowed.
ShardPayload Float32(absl::Span<const float> values) {
  ShardPayload payload;
  payload.values = values.size();
  payload.data =
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(values.data()),
                          values.size() * sizeof(float));
  return payload;
}

// A 1-bit payload of n values, borrowed from `encoded`.
ShardPayload OneBit(const common::OneBitEncoded& encoded, uint64_t n) {
  ShardPayload payload;
  payload.encoding = ENCODING_ONEBIT;
  payload.values = n;
  payload.data =
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(encoded.bits.data()),
                          encoded.bits.size());
  payload.scales = absl::MakeConstSpan(
      reinterpret_cast<const uint8_t*>(encoded.scales.data()),
      encoded.scales.size());
  return payload;
}

TEST_F(TwoShardsTest, PushHandedOverShardByShardAppliesLikeOnePush) {
  const std::vector<float> grads = Ramp53();
  std::vector<PushResponse> responses;
  common::BufferLease lease;
  std::unique_ptr<ShardedPush> push =
      client->StartPush({0, 0}, 16, /*sample_offset=*/0, &lease, &responses);
  // In either order.
  push->Send(1, Float32(absl::MakeConstSpan(grads).subspan(26)));
  push->Send(0, Float32(absl::MakeConstSpan(grads).subspan(0, 26)));
  ASSERT_OK(push->Wait());
  EXPECT_EQ(responses[0].version(), 1);
  EXPECT_EQ(responses[1].version(), 1);

  std::vector<float> params(53);
  std::vector<int64_t> versions;
  ASSERT_OK(
      client->Pull(1, absl::Seconds(30), absl::MakeSpan(params), &versions));
  std::vector<float> expected = AllInitialValues(config);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] -= grads[i];
  EXPECT_EQ(params, expected);
}

TEST_F(TwoShardsTest, PushPullAnswersWithTheWeightsThatIncludeThePush) {
  const std::vector<float> grads = Ramp53();
  std::vector<PushResponse> responses;
  std::vector<float> params(53, -1.0f);
  std::vector<int64_t> versions;
  const PullTarget pull{absl::MakeSpan(params), &versions, absl::Seconds(30)};
  common::BufferLease lease;
  std::unique_ptr<ShardedPush> push = client->StartPush(
      {0, 0}, 16, /*sample_offset=*/0, &lease, &responses, &pull);
  push->Send(0, Float32(absl::MakeConstSpan(grads).subspan(0, 26)));
  push->Send(1, Float32(absl::MakeConstSpan(grads).subspan(26)));
  ASSERT_OK(push->Wait());
  EXPECT_EQ(responses[0].version(), 1);
  EXPECT_EQ(responses[1].version(), 1);
  EXPECT_THAT(versions, ElementsAre(1, 1));
  std::vector<float> expected = AllInitialValues(config);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] -= grads[i];
  EXPECT_EQ(params, expected);
  // The answer's bytes count as pulled, like a pull's.
  ASSERT_OK_AND_ASSIGN(std::vector<StatsResponse> stats,
                       client->Stats(absl::Seconds(30)));
  EXPECT_EQ(stats[0].bytes_pulled() + stats[1].bytes_pulled(),
            client->bytes_pulled());
  EXPECT_GT(client->bytes_pulled(), static_cast<int64_t>(53 * sizeof(float)));
}

TEST_F(TwoShardsTest, ShardsTakeNoNewBuffersOncePushesAndPullsAreWarm) {
  const std::vector<float> grads = Ramp53();
  std::vector<float> params(53);
  std::vector<int64_t> versions;
  auto step = [&](int64_t version, bool push_pull) {
    const PullTarget pull{absl::MakeSpan(params), &versions, absl::Seconds(30)};
    common::BufferLease lease;
    std::unique_ptr<ShardedPush> push = client->StartPush(
        {version, version}, 16, /*sample_offset=*/16 * version, &lease, nullptr,
        push_pull ? &pull : nullptr);
    push->Send(0, Float32(absl::MakeConstSpan(grads).subspan(0, 26)));
    push->Send(1, Float32(absl::MakeConstSpan(grads).subspan(26)));
    ASSERT_OK(push->Wait());
    if (!push_pull) {
      ASSERT_OK(client->Pull(version + 1, absl::Seconds(30),
                             absl::MakeSpan(params), &versions));
    }
  };

  // A buffer per push and one per version would be 80 after 40 steps. The
  // pool holds what is in use at once: the push being decoded, the current
  // version, and the versions whose slices gRPC still holds after a pull:
  // one or two, more when the machine is loaded (up to 10 seen on a busy
  // 2-core machine, and under ThreadSanitizer), so the bound is set far
  // from both.
  for (int64_t v = 0; v < 40; ++v) step(v, v % 2 == 0);
  for (size_t s = 0; s < cluster.servers.size(); ++s) {
    EXPECT_LE(cluster.servers[s]->state()->buffers().allocations(), 20)
        << "shard " << s;
  }
}

// pull_compression in sync (one worker, so each push closes its step): the
// push-pulls' answers are 1-bit differences, added to the worker's weights,
// which stay exactly the shards' and follow the quantized update with the
// shard's error feedback (simulated here with the host codec, per shard);
// the pulled bytes are a fraction of float32's; a pull from weights the
// shard has no difference for is a full one.
TEST(PsClientTest, CompressedSyncPullsKeepTheWorkerEqualToTheShards) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [6, 5, 3] mode: SYNC optimizer: SGD learning_rate: 1 "
      "momentum: 0 chunk_bytes: 262144 pull_compression: COMPRESSION_ONEBIT "
      "onebit_bucket_size: 8");
  std::vector<std::unique_ptr<server::ShardServer>> servers =
      StartShards(config, 2, 1);
  ASSERT_EQ(servers.size(), 2u);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> client,
                       PsClient::Connect(OptionsFor(servers, config, 0)));
  std::vector<float> params(53);
  std::vector<int64_t> versions;
  ASSERT_OK(
      client->Pull(0, absl::Seconds(30), absl::MakeSpan(params), &versions));
  EXPECT_EQ(params, AllInitialValues(config));
  const int64_t full_bytes = client->bytes_pulled();
  std::vector<float> simulated = params;
  std::vector<float> residual(53, 0.0f);
  constexpr int kSteps = 10;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float> grads(53);
    for (size_t i = 0; i < grads.size(); ++i) {
      grads[i] = 0.01f * static_cast<float>((i * 7 + step * 5) % 13) - 0.06f;
    }
    const PullTarget pull{absl::MakeSpan(params), &versions, absl::Seconds(30),
                          /*holds_base_versions=*/true};
    common::BufferLease lease;
    std::unique_ptr<ShardedPush> push = client->StartPush(
        {step, step}, 4, /*sample_offset=*/4 * step, &lease, nullptr, &pull);
    push->Send(0, Float32(absl::MakeConstSpan(grads).subspan(0, 26)));
    push->Send(1, Float32(absl::MakeConstSpan(grads).subspan(26)));
    ASSERT_OK(push->Wait());
    EXPECT_THAT(versions, ElementsAre(step + 1, step + 1));
    // The shard: update u = -grads (SGD, rate 1), quantized per shard from
    // each shard's first value, with its residual.
    for (const auto& [begin, end] : {std::pair(0, 26), std::pair(26, 53)}) {
      std::vector<float> update(end - begin);
      for (int i = begin; i < end; ++i) {
        update[i - begin] = (simulated[i] - grads[i]) - simulated[i];
      }
      common::OneBitEncoded encoded;
      common::OneBitEncode(update,
                           absl::MakeSpan(residual).subspan(begin, end - begin),
                           8, &encoded);
      std::vector<float> decoded(end - begin);
      ASSERT_OK(common::OneBitDecode(encoded.bits, encoded.scales, 8,
                                     absl::MakeSpan(decoded)));
      for (int i = begin; i < end; ++i) {
        simulated[i] = simulated[i] + decoded[i - begin];
      }
    }
    EXPECT_EQ(params, simulated) << "step " << step;
  }
  const int64_t compressed_bytes = client->bytes_pulled() - full_bytes;
  // A full pull of the same weights, from no weights held: equal bit for
  // bit, and each such pull costs as much as the first.
  std::vector<float> full(53);
  std::vector<int64_t> full_versions;
  ASSERT_OK(client->Pull(kSteps, absl::Seconds(30), absl::MakeSpan(full),
                         &full_versions));
  EXPECT_EQ(full, params);
  // As many bytes as the first, plus each shard's one chunk's version field
  // (absent for version 0, a tag and a byte for version 10).
  EXPECT_EQ(client->bytes_pulled() - full_bytes - compressed_bytes,
            full_bytes + 2 * 2);
  // Ten 1-bit answers of 53 values in buckets of 8 (7 bytes of bits and 56
  // of scales per step, plus message overhead) against ten float32 ones.
  EXPECT_LT(compressed_bytes, kSteps * full_bytes * 3 / 4);
  // Weights the shards hold no difference from (version 3, long gone):
  // a full pull, though the client said it holds them.
  std::vector<int64_t> old_versions = {3, 3};
  std::vector<float> old = AllInitialValues(config);
  ASSERT_OK(client->Pull(0, absl::Seconds(30), absl::MakeSpan(old),
                         &old_versions, /*params_hold_versions=*/true));
  EXPECT_EQ(old, params);
  EXPECT_THAT(old_versions, ElementsAre(kSteps, kSteps));
}

// pull_compression in downpour: the shard keeps the worker's copy and its
// residual; each push-pull answers with the 1-bit difference from that copy
// to the shard's weights (here read in full by an evaluator, whose pulls
// change nothing), and the worker's weights are that copy, bit for bit.
TEST(PsClientTest, CompressedDownpourPullsKeepTheWorkersCopyOnBothSides) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [6, 5, 3] mode: DOWNPOUR optimizer: SGD learning_rate: 1 "
      "chunk_bytes: 262144 pull_compression: COMPRESSION_ONEBIT "
      "onebit_bucket_size: 8");
  std::vector<std::unique_ptr<server::ShardServer>> servers =
      StartShards(config, 2, 1);
  ASSERT_EQ(servers.size(), 2u);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> client,
                       PsClient::Connect(OptionsFor(servers, config, 0)));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> evaluator,
                       PsClient::Connect(OptionsFor(servers, config, -1)));
  std::vector<float> params(53);
  std::vector<int64_t> versions;
  ASSERT_OK(
      client->Pull(0, absl::Seconds(30), absl::MakeSpan(params), &versions));
  std::vector<float> view = params;
  std::vector<float> residual(53, 0.0f);
  for (int step = 0; step < 8; ++step) {
    std::vector<float> grads(53);
    for (size_t i = 0; i < grads.size(); ++i) {
      grads[i] = 0.02f * static_cast<float>((i * 5 + step * 3) % 11) - 0.1f;
    }
    const PullTarget pull{absl::MakeSpan(params), &versions, absl::Seconds(30),
                          /*holds_base_versions=*/true};
    common::BufferLease lease;
    std::unique_ptr<ShardedPush> push = client->StartPush(
        versions, 4, /*sample_offset=*/4 * step, &lease, nullptr, &pull);
    push->Send(0, Float32(absl::MakeConstSpan(grads).subspan(0, 26)));
    push->Send(1, Float32(absl::MakeConstSpan(grads).subspan(26)));
    ASSERT_OK(push->Wait());
    EXPECT_THAT(versions, ElementsAre(step + 1, step + 1));
    std::vector<float> now(53);
    std::vector<int64_t> now_versions;
    ASSERT_OK(evaluator->Pull(step + 1, absl::Seconds(30), absl::MakeSpan(now),
                              &now_versions));
    for (const auto& [begin, end] : {std::pair(0, 26), std::pair(26, 53)}) {
      std::vector<float> diff(end - begin);
      for (int i = begin; i < end; ++i) diff[i - begin] = now[i] - view[i];
      common::OneBitEncoded encoded;
      common::OneBitEncode(diff,
                           absl::MakeSpan(residual).subspan(begin, end - begin),
                           8, &encoded);
      ASSERT_OK(common::OneBitDecode(encoded.bits, encoded.scales, 8,
                                     absl::MakeSpan(diff)));
      for (int i = begin; i < end; ++i) view[i] = view[i] + diff[i - begin];
    }
    EXPECT_EQ(params, view) << "step " << step;
    EXPECT_NE(params, now) << "step " << step;  // a copy, not the weights
  }
  // A pull that does not claim the copy is a full one, and the copy
  // becomes the weights again.
  ASSERT_OK(
      client->Pull(0, absl::Seconds(30), absl::MakeSpan(params), &versions));
  std::vector<float> now(53);
  std::vector<int64_t> now_versions;
  ASSERT_OK(evaluator->Pull(8, absl::Seconds(30), absl::MakeSpan(now),
                            &now_versions));
  EXPECT_EQ(params, now);
}

// Two shards of a sync run for two workers, both connected; worker 0's
// push-pull of step 0.
class SyncTwoWorkersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(servers.size(), 2u);
    ASSERT_OK_AND_ASSIGN(worker0,
                         PsClient::Connect(OptionsFor(servers, config, 0)));
    ASSERT_OK_AND_ASSIGN(worker1,
                         PsClient::Connect(OptionsFor(servers, config, 1)));
  }

  // Worker 0 pushes ones as step 0 to both shards; the answer's weights go
  // to params and versions.
  std::unique_ptr<ShardedPush> Worker0PushesStepZero(absl::Duration timeout) {
    pull.emplace(PullTarget{absl::MakeSpan(params), &versions, timeout});
    std::unique_ptr<ShardedPush> push = worker0->StartPush(
        {0, 0}, 1, /*sample_offset=*/0, &lease, nullptr, &*pull);
    push->Send(0, Float32(absl::MakeConstSpan(ones).subspan(0, 26)));
    push->Send(1, Float32(absl::MakeConstSpan(ones).subspan(26)));
    return push;
  }

  const TrainingConfig config = ResolvedConfig(kSmallConfig);
  std::vector<std::unique_ptr<server::ShardServer>> servers =
      StartShards(config, 2, 2);
  std::unique_ptr<PsClient> worker0;
  std::unique_ptr<PsClient> worker1;
  const std::vector<float> ones = std::vector<float>(53, 1.0f);
  std::vector<float> params = std::vector<float>(53);
  std::vector<int64_t> versions;
  std::optional<PullTarget> pull;
  common::BufferLease lease;  // the push's memory, held until it ends
};

TEST_F(SyncTwoWorkersTest, SyncPushPullWaitsForTheBarrier) {
  const std::vector<float> threes(53, 3.0f);
  std::unique_ptr<ShardedPush> push = Worker0PushesStepZero(absl::Seconds(30));
  // Worker 0's answer waits for step 0 to close, which needs worker 1: once
  // both shards hold worker 0's push, the step is still open.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while ((servers[0]->state()->Stats().pushes() < 1 ||
          servers[1]->state()->Stats().pushes() < 1) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_OK_AND_ASSIGN(std::vector<StatsResponse> stats,
                       worker0->Stats(absl::Seconds(30)));
  EXPECT_EQ(stats[0].version(), 0);
  ASSERT_OK(worker1->Push(threes, {0, 0}, 1));
  ASSERT_OK(push->Wait());
  EXPECT_THAT(versions, ElementsAre(1, 1));
  // SGD with learning rate 1 on the mean gradient 2.
  std::vector<float> expected = AllInitialValues(config);
  for (float& v : expected) v -= 2.0f;
  EXPECT_EQ(params, expected);
}

// Worker 0 waits at shard 0's barrier, which needs worker 1, after shard 1
// has answered it; shard 1 then dies (and would come back from a checkpoint
// without this step, waiting for worker 0 to push it again, while worker 0
// waits for worker 1 at shard 0). The wait ends UNAVAILABLE naming shard 1,
// so that worker 0 rides the loss out, rather than at the barrier's timeout.
TEST_F(SyncTwoWorkersTest,
       ASyncWaitEndsWhenAShardThatAnsweredLosesItsConnection) {
  common::BufferLease lease1;
  {
    // Worker 1 pushes step 0 to shard 1 only.
    std::vector<PushResponse> answers;
    std::unique_ptr<ShardedPush> push = worker1->StartPush(
        {0, 0}, 1, /*sample_offset=*/0, &lease1, &answers, nullptr);
    push->Send(1, Float32(absl::MakeConstSpan(ones).subspan(26)));
    // Held by shard 1's step before the push goes out of scope.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (servers[1]->state()->Stats().pushes() < 1 &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_EQ(servers[1]->state()->Stats().pushes(), 1);
  }
  std::unique_ptr<ShardedPush> push = Worker0PushesStepZero(absl::Seconds(60));
  // Shard 1's step 0 closes and it answers; shard 0's waits for worker 1.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (servers[1]->state()->version() < 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(servers[1]->state()->version(), 1);
  absl::SleepFor(absl::Milliseconds(200));
  testutil::RunningTime lost;
  servers[1].reset();
  EXPECT_THAT(push->Wait(), StatusIs(absl::StatusCode::kUnavailable,
                                     HasSubstr("shard 1 at 127.0.0.1:")));
  // Within a few of the wait's 100 ms ticks, not the pull's 60 s.
  EXPECT_LT(lost.Elapsed(), absl::Seconds(10));
}

TEST(PsClientTest, SyncPushPullPastTheTimeoutIsDeadlineExceeded) {
  const TrainingConfig config = ResolvedConfig(kSmallConfig);
  std::vector<std::unique_ptr<server::ShardServer>> servers =
      StartShards(config, 2, 2);
  ASSERT_EQ(servers.size(), 2u);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> worker0,
                       PsClient::Connect(OptionsFor(servers, config, 0)));
  const std::vector<float> ones(53, 1.0f);
  std::vector<float> params(53);
  std::vector<int64_t> versions;
  const PullTarget pull{absl::MakeSpan(params), &versions,
                        absl::Milliseconds(300)};
  common::BufferLease lease;
  std::unique_ptr<ShardedPush> push = worker0->StartPush(
      {0, 0}, 1, /*sample_offset=*/0, &lease, nullptr, &pull);
  push->Send(0, Float32(absl::MakeConstSpan(ones).subspan(0, 26)));
  push->Send(1, Float32(absl::MakeConstSpan(ones).subspan(26)));
  EXPECT_THAT(push->Wait(), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                     HasSubstr("shard 0 at")));
}

TEST_F(TwoShardsTest, PushWithAShardNeverSentIsFailedPreconditionNamingIt) {
  const std::vector<float> grads = Ramp53();
  common::BufferLease lease;
  std::unique_ptr<ShardedPush> push =
      client->StartPush({0, 0}, 16, /*sample_offset=*/0, &lease, nullptr);
  push->Send(0, Float32(absl::MakeConstSpan(grads).subspan(0, 26)));
  EXPECT_THAT(push->Wait(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("without a payload for shard 1")));
  // Shards apply pushes independently: shard 0 took its slice, shard 1
  // never heard of the push.
  ASSERT_OK_AND_ASSIGN(std::vector<StatsResponse> stats,
                       client->Stats(absl::Seconds(30)));
  EXPECT_EQ(stats[0].version(), 1);
  EXPECT_EQ(stats[1].version(), 0);
}

TEST_F(TwoShardsTest, PushOfTheWrongLengthIsInvalidAndSendsNothing) {
  std::vector<float> grads = Ramp53();
  grads.pop_back();
  EXPECT_THAT(client->Push(grads, {0, 0}, 16),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("push of 52 values to a model of 53")));
  common::BufferLease lease;
  std::unique_ptr<ShardedPush> push =
      client->StartPush({0, 0}, 16, /*sample_offset=*/0, &lease, nullptr);
  push->Send(0, Float32(absl::MakeConstSpan(grads).subspan(0, 26)));
  push->Send(1, Float32(absl::MakeConstSpan(grads).subspan(26)));  // 26 of 27
  EXPECT_THAT(push->Wait(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("push to shard 1 of 26 values with 104 bytes "
                                 "of data and 0 of scales; the shard holds 27 "
                                 "values, which need 108 and 0")));
  EXPECT_GT(client->bytes_pushed(), 0);  // shard 0's slice went
  ASSERT_OK_AND_ASSIGN(std::vector<StatsResponse> stats,
                       client->Stats(absl::Seconds(30)));
  EXPECT_EQ(stats[1].version(), 0);
  EXPECT_EQ(stats[1].rejected_pushes(), 0);
  EXPECT_EQ(stats[1].bytes_pushed(), 0);
}

TEST_F(TwoShardsTest, ShardSentTwiceIsInvalid) {
  const std::vector<float> grads = Ramp53();
  common::BufferLease lease;
  std::unique_ptr<ShardedPush> push =
      client->StartPush({0, 0}, 16, /*sample_offset=*/0, &lease, nullptr);
  push->Send(0, Float32(absl::MakeConstSpan(grads).subspan(0, 26)));
  push->Send(0, Float32(absl::MakeConstSpan(grads).subspan(0, 26)));
  push->Send(2, Float32(absl::MakeConstSpan(grads).subspan(26)));
  EXPECT_THAT(push->Wait(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("shard 0 is out of range or sent twice")));
}

// 1-bit in buckets of 8: shard 0 holds 26 values (4 buckets: 4 bytes of bits,
// 32 of scales), shard 1 27 (4 buckets, the last of 3 values).
constexpr char kOneBitConfig[] =
    "layer_sizes: [6, 5, 3] mode: SYNC optimizer: SGD learning_rate: 1 "
    "momentum: 0 chunk_bytes: 262144 compression: COMPRESSION_ONEBIT "
    "onebit_bucket_size: 8";

TEST(PsClientTest, OneBitPayloadsAreAppliedAsTheValuesTheyDecodeTo) {
  const TrainingConfig config = ResolvedConfig(kOneBitConfig);
  testutil::LocalCluster cluster(config, 2, 1);
  ASSERT_NE(cluster.client, nullptr);
  PsClient* client = cluster.client.get();
  const std::vector<float> grads = Ramp53();
  std::vector<float> residual(53, 0.0f);
  std::vector<common::OneBitEncoded> encoded(2);
  std::vector<float> decoded(53);
  common::BufferLease lease;
  std::unique_ptr<ShardedPush> push =
      client->StartPush({0, 0}, 4, /*sample_offset=*/0, &lease, nullptr);
  for (int s = 0; s < 2; ++s) {
    const common::ShardRange r = client->ranges()[s];
    common::OneBitEncode(absl::MakeConstSpan(grads).subspan(r.begin, r.size()),
                         absl::MakeSpan(residual).subspan(r.begin, r.size()), 8,
                         &encoded[s]);
    ASSERT_OK(common::OneBitDecode(
        encoded[s].bits, encoded[s].scales, 8,
        absl::MakeSpan(decoded).subspan(r.begin, r.size())));
    push->Send(s, OneBit(encoded[s], r.size()));
  }
  ASSERT_OK(push->Wait());
  // SGD with learning rate 1 on what the bits and scales decode to.
  std::vector<float> expected = AllInitialValues(config);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] -= decoded[i];
  EXPECT_EQ(cluster.Weights(1), expected);
  // Bytes on the wire: each shard's 1 chunk of bits and scales, and header.
  EXPECT_GT(client->bytes_pushed(), 2 * (4 + 32));
  EXPECT_LT(client->bytes_pushed(), 2 * (4 + 32) + 2 * 64);
}

TEST(PsClientTest, OneBitSliceOfTheWrongSizeIsInvalidAndNeverSent) {
  const TrainingConfig config = ResolvedConfig(kOneBitConfig);
  testutil::LocalCluster cluster(config, 2, 1);
  ASSERT_NE(cluster.client, nullptr);
  PsClient* client = cluster.client.get();
  common::OneBitEncoded encoded;
  encoded.bits.assign(3, '\0');  // shard 0 needs 4
  encoded.scales.assign(32, '\0');
  common::BufferLease lease;
  std::unique_ptr<ShardedPush> push =
      client->StartPush({0, 0}, 4, /*sample_offset=*/0, &lease, nullptr);
  push->Send(0, OneBit(encoded, 26));
  EXPECT_THAT(push->Wait(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("with 3 bytes of data and 32 of scales; the "
                                 "shard holds 26 values, which need 4 and 32 "
                                 "in ENCODING_ONEBIT")));
  EXPECT_EQ(client->bytes_pushed(), 0);
}

TEST_F(TwoShardsTest, OneBitSliceFromAFloat32ClientIsInvalid) {
  common::OneBitEncoded encoded;
  encoded.bits.assign(4, '\0');
  encoded.scales.assign(32, '\0');
  common::BufferLease lease;
  std::unique_ptr<ShardedPush> push =
      client->StartPush({0, 0}, 4, /*sample_offset=*/0, &lease, nullptr);
  push->Send(0, OneBit(encoded, 26));
  EXPECT_THAT(push->Wait(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a push encoded as ENCODING_ONEBIT from a "
                                 "client whose config pushes "
                                 "ENCODING_FLOAT32")));
  EXPECT_EQ(client->bytes_pushed(), 0);
}

TEST(PsClientTest, Float32ConvenienceRefusesAOneBitConfig) {
  const TrainingConfig config = ResolvedConfig(kOneBitConfig);
  testutil::LocalCluster cluster(config, 2, 1);
  ASSERT_NE(cluster.client, nullptr);
  EXPECT_THAT(cluster.client->Push(Ramp53(), {0, 0}, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("GradientPusher")));
}

// On two shards and one worker in `mode`: a push of 16 examples to both,
// then one of the next 16 that reaches shard 0 only (the worker died
// mid-push). Returns where a restarted client of the rank resumes.
int64_t ResumePointAfterAPushHalfSent(absl::string_view mode) {
  const TrainingConfig config = ResolvedConfig(
      absl::StrCat("layer_sizes: [6, 5, 3] mode: ", mode,
                   " optimizer: SGD learning_rate: 1 momentum: 0 "
                   "chunk_bytes: 262144"));
  testutil::LocalCluster cluster(config, 2, 1);
  if (cluster.client == nullptr) return -1;
  EXPECT_EQ(cluster.client->applied_samples(), 0);
  const std::vector<float> grads = Ramp53();
  EXPECT_OK(cluster.client->Push(grads, {0, 0}, 16));
  common::BufferLease lease;
  std::unique_ptr<ShardedPush> push = cluster.client->StartPush(
      {1, 1}, 16, /*sample_offset=*/16, &lease, nullptr);
  push->Send(0, Float32(absl::MakeConstSpan(grads).subspan(0, 26)));
  EXPECT_THAT(push->Wait(), StatusIs(absl::StatusCode::kFailedPrecondition));

  // The replacement is let in once the dead worker's lease has run out
  // (Connect retries until then).
  absl::StatusOr<std::unique_ptr<PsClient>> restarted = PsClient::Connect(
      testutil::ClientOptions(cluster.servers, config, /*rank=*/0));
  EXPECT_OK(restarted.status());
  absl::StatusOr<std::unique_ptr<PsClient>> evaluator = PsClient::Connect(
      testutil::ClientOptions(cluster.servers, config, /*rank=*/-1));
  EXPECT_OK(evaluator.status());
  if (!restarted.ok() || !evaluator.ok()) return -1;
  EXPECT_EQ((*evaluator)->applied_samples(), 0);
  return (*restarted)->applied_samples();
}

// A push given up before its payload was final (a script's step that
// turned out other than its backward pass said) takes nothing, and leaves
// "repeat the step" (set by a reconnect) to the push sent in its place.
TEST(PsClientTest, APushGivenUpLeavesTheRepeatOfAStepToThePushInItsPlace) {
  const TrainingConfig config = ResolvedConfig(kSmallConfig);
  testutil::LocalCluster cluster(config, 2, /*num_workers=*/2);
  ASSERT_NE(cluster.client, nullptr);
  // Rank 1 is live and has not pushed: step 0 stays open (for the lease,
  // kTestLease; were it to close first, the push below would be a
  // duplicate by its examples alone).
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> other,
                       PsClient::Connect(testutil::ClientOptions(
                           cluster.servers, config, /*rank=*/1)));
  PsClient* client = cluster.client.get();
  const std::vector<float> grads = Ramp53();
  ASSERT_OK(client->Push(grads, {0, 0}, 16));
  // As after a lost shard: every shard answers again, and the next push
  // repeats step 0.
  ASSERT_OK(client->Reconnect(absl::Seconds(30), absl::ZeroDuration()));
  common::BufferLease lease;
  {
    std::unique_ptr<ShardedPush> push =
        client->StartPush({0, 0}, 16, /*sample_offset=*/0, &lease, nullptr);
    push->SendFrom(1, Float32(absl::MakeConstSpan(grads).subspan(26, 27)), 5);
    EXPECT_THAT(push->Wait(), StatusIs(absl::StatusCode::kAborted,
                                       HasSubstr("given up before its payload "
                                                 "was final")));
  }
  // The step pushed whole in its place, recomputed to other values, is
  // still the repeat: the shards keep the step's first push and say they
  // have it (ALREADY_EXISTS, which a worker's loop takes as done); without
  // the repeat it would be the same examples twice with other values,
  // FAILED_PRECONDITION.
  std::vector<float> recomputed = grads;
  for (float& g : recomputed) g *= 2.0f;
  EXPECT_THAT(client->Push(recomputed, {0, 0}, 16),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       HasSubstr("already pushed step 0")));
}

TEST(PsClientTest, ARestartedAsyncClientResumesWhereEveryShardHasItsData) {
  // Shard 0 has 32 examples from rank 0, shard 1 only 16: from 16, shard 0
  // answers the repeat as a duplicate.
  EXPECT_EQ(ResumePointAfterAPushHalfSent("DOWNPOUR"), 16);
}

TEST(PsClientTest, ARestartedSyncClientResumesAtTheFurthestShardsStep) {
  // Sync: where the barrier is (shard 0 closed step 1 with the examples
  // from 16 on); shard 1 takes the next batch into its step 1.
  EXPECT_EQ(ResumePointAfterAPushHalfSent("SYNC"), 32);
}

TEST_F(TwoShardsTest, ASecondClientForALiveRankIsAlreadyExists) {
  // The first client has just called (its lease is renewed); a second
  // process started with the same rank is refused while that lease runs.
  std::vector<float> weights(client->ranges().back().end);
  std::vector<int64_t> versions;
  ASSERT_OK(
      client->Pull(0, absl::Seconds(10), absl::MakeSpan(weights), &versions));
  PsClientOptions options = OptionsFor(cluster.servers, config, /*rank=*/0);
  // Half the lease: long enough for a Register on a loaded machine (50 ms
  // was not, under ThreadSanitizer), short enough that the first client's
  // lease still runs when the second gives up.
  options.connect_timeout = testutil::kTestLease / 2;
  EXPECT_THAT(PsClient::Connect(options),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       HasSubstr("two workers started with --rank=0")));
  // Once the first stops calling for the lease, a restart takes the rank.
  options.connect_timeout = 20 * testutil::kTestLease;
  ASSERT_OK(PsClient::Connect(options).status());
}

// A shard that answers Register from a script (then OK for good), as
// one real shard of a one-shard run: the codes a worker can meet while the
// shard it lost shuts down and its successor comes up, in an order no real
// restart can be made to keep.
class ScriptedShard : public ParameterService::CallbackService {
 public:
  ScriptedShard(const TrainingConfig& config,
                std::deque<grpc::StatusCode> script)
      : params_(common::ModelLayout::FromConfig(config).num_params()),
        script_(std::move(script)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~ScriptedShard() override { server_->Shutdown(); }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int registrations() {
    std::lock_guard<std::mutex> lock(mu_);
    return registrations_;
  }
  // From now on, Register answers `codes` in turn before OK again.
  void Script(std::deque<grpc::StatusCode> codes) {
    std::lock_guard<std::mutex> lock(mu_);
    script_ = std::move(codes);
  }
  // From now on, Register answers UNAVAILABLE for as long as `unavailable`
  // says so (called on each Register, under the shard's lock).
  void UnavailableWhile(std::function<bool()> unavailable) {
    std::lock_guard<std::mutex> lock(mu_);
    unavailable_ = std::move(unavailable);
  }

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const RegisterRequest* request,
                                     RegisterResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    grpc::StatusCode code = grpc::StatusCode::OK;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++registrations_;
      if (!script_.empty()) {
        code = script_.front();
        script_.pop_front();
      } else if (unavailable_ && unavailable_()) {
        code = grpc::StatusCode::UNAVAILABLE;
      }
    }
    if (code != grpc::StatusCode::OK) {
      reactor->Finish(grpc::Status(code, "scripted"));
      return reactor;
    }
    response->set_shard(0);
    response->set_num_shards(1);
    response->set_offset(0);
    response->set_length(params_);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  const uint64_t params_;
  std::mutex mu_;
  std::deque<grpc::StatusCode> script_;
  std::function<bool()> unavailable_;
  int registrations_ = 0;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// A worker that lost a shard registers again while the old shard process
// may still be shutting down: gRPC cancels the calls that reach it then
// (CANCELLED). That is the lost shard, not this worker's stop: Reconnect
// waits for the successor, as for UNAVAILABLE. (It used to give up at the
// first CANCELLED, having re-registered with the shards before that one
// and not with it: in sync, that shard's barrier then waited for the worker
// until its lease ran out, and the worker ended CANCELLED.)
TEST(PsClientTest, ReconnectWaitsThroughAShardThatIsShuttingDown) {
  const TrainingConfig config = ResolvedConfig(kSmallConfig);
  ScriptedShard shard(config, {});
  PsClientOptions options;
  options.server_addresses = {shard.address()};
  options.config = config;
  options.worker_rank = 0;
  options.num_workers = 1;
  options.connect_timeout = absl::Seconds(30);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> client,
                       PsClient::Connect(options));
  ASSERT_EQ(shard.registrations(), 1);
  shard.Script({grpc::StatusCode::CANCELLED, grpc::StatusCode::UNAVAILABLE,
                grpc::StatusCode::CANCELLED});
  EXPECT_OK(client->Reconnect(absl::Seconds(30), absl::ZeroDuration()));
  // 4 attempts, then the second pass that reads where the shard is once
  // every shard is back.
  EXPECT_EQ(shard.registrations(), 6);
}

// Reconnect still ends at once for this worker's own stop, and for codes
// that waiting cannot mend (a shard that refuses the worker).
TEST(PsClientTest, ReconnectEndsAtOnceForAStopOrARefusal) {
  const TrainingConfig config = ResolvedConfig(kSmallConfig);
  ScriptedShard shard(config, {});
  absl::Notification stop;
  PsClientOptions options;
  options.server_addresses = {shard.address()};
  options.config = config;
  options.worker_rank = 0;
  options.num_workers = 1;
  options.stop = &stop;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> client,
                       PsClient::Connect(options));
  shard.Script({grpc::StatusCode::FAILED_PRECONDITION});
  EXPECT_THAT(
      client->Reconnect(absl::Seconds(30), absl::ZeroDuration()),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("scripted")));
  EXPECT_EQ(shard.registrations(), 2);
  stop.Notify();
  shard.Script({grpc::StatusCode::CANCELLED});
  EXPECT_THAT(client->Reconnect(absl::Seconds(30), absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(shard.registrations(), 2);
}

// Stops this process (SIGSTOP, as a paused machine would) for `stop`, from
// a helper process started by Start; Ended says whether the helper has
// sent SIGCONT and ended, Wait waits for that. Thread-safe.
class ProcessStopper {
 public:
  explicit ProcessStopper(absl::Duration stop) : stop_(stop) {}
  ~ProcessStopper() { Wait(); }
  // Starts the helper (once); false if it could not be started.
  bool Start() {
    std::lock_guard<std::mutex> lock(mu_);
    if (helper_ != 0) return helper_ > 0;
    const std::string script =
        absl::StrFormat("kill -STOP %d; sleep %.1f; kill -CONT %d", getpid(),
                        absl::ToDoubleSeconds(stop_), getpid());
    std::vector<char*> argv = {const_cast<char*>("sh"), const_cast<char*>("-c"),
                               const_cast<char*>(script.c_str()), nullptr};
    if (posix_spawn(&helper_, "/bin/sh", nullptr, nullptr, argv.data(),
                    environ) != 0) {
      helper_ = -1;
    }
    return helper_ > 0;
  }
  bool Ended() {
    std::lock_guard<std::mutex> lock(mu_);
    if (helper_ > 0 && !ended_) {
      ended_ = waitpid(helper_, nullptr, WNOHANG) == helper_;
    }
    return ended_;
  }
  void Wait() {
    std::lock_guard<std::mutex> lock(mu_);
    if (helper_ > 0 && !ended_) {
      ended_ = waitpid(helper_, nullptr, 0) == helper_;
    }
  }
  // Start, then Wait: a test failure unless this process was stopped.
  void StopNow() {
    const absl::Time start = absl::Now();
    ASSERT_TRUE(Start()) << "could not start /bin/sh";
    Wait();
    ASSERT_GT(absl::Now() - start, stop_) << "this process was not stopped";
  }

 private:
  const absl::Duration stop_;
  std::mutex mu_;
  pid_t helper_ = 0;
  bool ended_ = false;
};

// Time this process did not run (a SIGSTOP here; a paused machine, a
// process swapped out) is not taken as the shard's silence: a worker
// stopped for longer than its whole connect timeout, while the shard was
// not answering yet, still registers once it runs again.
TEST(PsClientTest, TimeThisProcessDidNotRunDoesNotCountAgainstTheWait) {
  const TrainingConfig config = ResolvedConfig(kSmallConfig);
  ScriptedShard shard(config, {});
  // The first Register stops this process for 3 s; the shard answers
  // UNAVAILABLE until the process runs again.
  ProcessStopper stopper(absl::Seconds(3));
  std::atomic<bool> started{true};
  shard.UnavailableWhile([&] {
    if (!stopper.Start()) started = false;
    return !stopper.Ended();
  });
  PsClientOptions options;
  options.server_addresses = {shard.address()};
  options.config = config;
  options.worker_rank = 0;
  options.num_workers = 1;
  options.connect_timeout = absl::Seconds(2);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(options);
  stopper.Wait();
  ASSERT_TRUE(started) << "could not start /bin/sh to stop this process";
  ASSERT_GT(absl::Now() - start, absl::Seconds(3))
      << "this process was not stopped";
  EXPECT_OK(client.status());
}

// The tests' stopwatch leaves out the time the process was stopped.
TEST(PsClientTest, RunningTimeLeavesOutTimeTheProcessDidNotRun) {
  testutil::RunningTime running;
  ASSERT_NO_FATAL_FAILURE(ProcessStopper(absl::Seconds(3)).StopNow());
  EXPECT_LT(running.Elapsed(), absl::Seconds(1));
}

// The same for a shard: time it did not run does not count against its
// workers' leases (2 s here). Stopped for 3 s just after the worker's
// push, it does not count the worker as gone.
TEST(PsClientTest, TimeAShardDidNotRunDoesNotCountAgainstTheLeases) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [6, 5, 3] mode: DOWNPOUR optimizer: SGD learning_rate: 1 "
      "momentum: 0 chunk_bytes: 262144");
  std::vector<std::unique_ptr<server::ShardServer>> servers =
      StartShards(config, 1, 1);
  ASSERT_EQ(servers.size(), 1u);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> client,
                       PsClient::Connect(OptionsFor(servers, config)));
  ASSERT_OK(client->Push(Ramp53(), {0}, 4));
  ASSERT_NO_FATAL_FAILURE(ProcessStopper(absl::Seconds(3)).StopNow());
  // The ticker's next ticks (five a second) have run.
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_LT(servers[0]->state()->SinceContact(0, absl::Now()),
            testutil::kTestLease);
  EXPECT_TRUE(servers[0]->state()->Alive(0, absl::Now()));
}

TEST(PsClientTest, AFrozenShardIsUnavailableWithinThePeerTimeout) {
  // Downpour, whose pushes end at the push deadline (call_timeout_s) at the
  // latest: 600 s, far beyond this test's time limit, so that only the
  // keepalive can end the push below.
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [6, 5, 3] mode: DOWNPOUR optimizer: SGD learning_rate: 1 "
      "momentum: 0 chunk_bytes: 262144 call_timeout_s: 600");
  std::vector<std::unique_ptr<server::ShardServer>> servers =
      StartShards(config, 1, 1);
  ASSERT_EQ(servers.size(), 1u);
  const std::string& address = servers[0]->address();
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port));
  testutil::TcpProxy proxy(port);
  ASSERT_NE(proxy.port(), 0);
  PsClientOptions options = OptionsFor(servers, config);
  options.server_addresses = {proxy.address()};
  options.peer_timeout = absl::Seconds(2);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> client,
                       PsClient::Connect(options));
  ASSERT_OK(client->Push(Ramp53(), {0}, 4));
  // The shard's host stops answering, its connection left open.
  proxy.Freeze();
  EXPECT_THAT(client->Push(Ramp53(), {1}, 4),
              StatusIs(absl::StatusCode::kUnavailable));
}

TEST(PsClientTest, AClientWithoutTheRunsTokenIsUnauthenticated) {
  const TrainingConfig config = ResolvedConfig(kSmallConfig);
  server::ShardServerOptions server_options;
  server_options.config = config;
  server_options.auth_token = "0123456789abcdef0123456789abcdef";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<server::ShardServer> server,
                       server::ShardServer::Start(server_options));
  PsClientOptions options;
  options.server_addresses = {server->address()};
  options.config = config;
  options.connect_timeout = absl::Seconds(30);
  // Refused at once, not retried until the timeout.
  EXPECT_THAT(PsClient::Connect(options),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("--auth_token_file")));
  options.auth_token = "0123456789abcdef0123456789abcdeX";
  EXPECT_THAT(PsClient::Connect(options),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("wrong auth token")));
  options.auth_token = server_options.auth_token;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> client,
                       PsClient::Connect(options));
  ASSERT_OK(client->Push(Ramp53(), {0}, 4));
  std::vector<float> weights(53);
  std::vector<int64_t> versions;
  ASSERT_OK(
      client->Pull(1, absl::Seconds(10), absl::MakeSpan(weights), &versions));
  EXPECT_THAT(versions, ElementsAre(1));
  ASSERT_OK(client->Stats(absl::Seconds(10)).status());
}

TEST_F(TwoShardsTest, AClientThatLeftFreesItsRankAtOnce) {
  std::vector<float> weights(client->ranges().back().end);
  std::vector<int64_t> versions;
  ASSERT_OK(
      client->Pull(0, absl::Seconds(10), absl::MakeSpan(weights), &versions));
  ASSERT_OK(client->Leave(absl::Seconds(10)));
  // Well inside the lease the rank is free: a rank still held would be
  // refused (ALREADY_EXISTS) until half the lease had passed.
  PsClientOptions options = OptionsFor(cluster.servers, config, /*rank=*/0);
  options.connect_timeout = testutil::kTestLease / 2;
  ASSERT_OK(PsClient::Connect(options).status());
}

}  // namespace
}  // namespace monsoon::worker
