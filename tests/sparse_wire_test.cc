// Sparse tables over the wire: shards on loopback in the test process,
// rows pulled and pushed by id through PsClient (routing, repeats summed),
// and the shards' refusals, through the raw service.
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/sparse_ids.h"
#include "gtest/gtest.h"
#include "proto/service.grpc.pb.h"
#include "tests/local_shards.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace monsoon {
namespace {

using ::monsoon::testutil::IsOk;
using ::monsoon::testutil::ResolvedConfig;
using ::monsoon::testutil::StatusIs;
using ::testing::HasSubstr;

constexpr char kConfig[] =
    "layer_sizes: [4, 2] mode: DOWNPOUR optimizer: SGD learning_rate: 0.5 "
    "sparse_buckets: 64 "
    "sparse_tables { name: 'emb' dim: 2 optimizer: SPARSE_SGD init_scale: 0 "
    "max_rows: 100 }";

constexpr absl::Duration kTimeout = absl::Seconds(10);

std::vector<float> Pull(worker::PsClient& client,
                        const std::vector<uint64_t>& ids) {
  std::vector<float> out(ids.size() * 2, -99.0f);
  EXPECT_THAT(client.SparsePull("emb", ids, absl::MakeSpan(out), kTimeout),
              IsOk());
  return out;
}

TEST(SparseWireTest, RowsGoToTheShardOfTheirBucketAndRepeatsAreSummed) {
  const TrainingConfig config = ResolvedConfig(kConfig);
  testutil::LocalCluster cluster(config, /*num_shards=*/2, /*num_workers=*/1);
  ASSERT_NE(cluster.client, nullptr);
  worker::PsClient& client = *cluster.client;
  // Ids 1 and 1000000 on different shards of 64 buckets.
  ASSERT_NE(common::ShardOfId(1, 64, 2), common::ShardOfId(1000000, 64, 2));
  SparsePushResponse pushed;
  ASSERT_THAT(client.SparsePush("emb", {1, 5, 1, 1000000},
                                {1, 2, 3, 4, 10, 20, -2, 0}, kTimeout, &pushed),
              IsOk());
  EXPECT_EQ(pushed.updated(), 3);  // id 1 once, its gradients summed
  EXPECT_EQ(pushed.created(), 3);
  // w = 0 - 0.5 * g: id 1 sums (1, 2) and (10, 20); id 5 (3, 4); id
  // 1000000 (-2, 0); id 7 was never pushed.
  EXPECT_EQ(Pull(client, {1000000, 1, 5, 7, 1}),
            (std::vector<float>{1, 0, -5.5f, -11, -1.5f, -2, 0, 0, -5.5f, -11}));
  for (int s = 0; s < 2; ++s) {
    const server::SparseTable& table =
        *cluster.servers[s]->sparse_tables()->tables()[0];
    for (uint64_t id : {1ull, 5ull, 1000000ull}) {
      EXPECT_EQ(table.Contains(id), common::ShardOfId(id, 64, 2) == s)
          << "id " << id << " on shard " << s;
    }
    EXPECT_FALSE(table.Contains(7));  // a pull makes no row
  }
  EXPECT_GT(client.bytes_pushed(), 0);
  EXPECT_THAT(client.SparsePull("ads", {1}, absl::Span<float>(), kTimeout),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("no sparse table 'ads' in this run's config")));
}

TEST(SparseWireTest, ANonFinitePushIsRefusedWithNothingApplied) {
  const TrainingConfig config = ResolvedConfig(kConfig);
  testutil::LocalCluster cluster(config, 2, 1);
  ASSERT_NE(cluster.client, nullptr);
  // Ids 3 and 4 on different shards: the client refuses the whole push, so
  // that neither shard applies its part.
  ASSERT_NE(common::ShardOfId(3, 64, 2), common::ShardOfId(4, 64, 2));
  ASSERT_THAT(cluster.client->SparsePush("emb", {3}, {1, 1}, kTimeout), IsOk());
  EXPECT_THAT(cluster.client->SparsePush("emb", {3, 4}, {1, 1, NAN, 0}, kTimeout),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the gradient of id 4 holds nan; nothing "
                                 "was sent")));
  EXPECT_EQ(Pull(*cluster.client, {3, 4}),
            (std::vector<float>{-0.5f, -0.5f, 0, 0}));
}

// A push sent again with its number (its answer lost, say) is answered as a
// repeat and applied once; the next number is applied.
TEST(SparseWireTest, APushSentAgainWithItsNumberIsAppliedOnce) {
  const TrainingConfig config = ResolvedConfig(kConfig);
  testutil::LocalCluster cluster(config, 2, 1);
  ASSERT_NE(cluster.client, nullptr);
  worker::PsClient& client = *cluster.client;
  const uint64_t seq = client.NextRowPushSeq();
  SparsePushResponse answer;
  ASSERT_THAT(client.SparsePush("emb", {1, 1000000}, {1, 1, 2, 2}, kTimeout,
                                &answer, nullptr, seq),
              IsOk());
  EXPECT_EQ(answer.updated(), 2);
  EXPECT_FALSE(answer.repeat());
  ASSERT_THAT(client.SparsePush("emb", {1, 1000000}, {1, 1, 2, 2}, kTimeout,
                                &answer, nullptr, seq),
              IsOk());
  EXPECT_EQ(answer.updated(), 0);
  EXPECT_TRUE(answer.repeat());
  EXPECT_EQ(Pull(client, {1, 1000000}),
            (std::vector<float>{-0.5f, -0.5f, -1, -1}));
  ASSERT_THAT(
      client.SparsePush("emb", {1, 1000000}, {1, 1, 2, 2}, kTimeout, &answer),
      IsOk());
  EXPECT_EQ(answer.updated(), 2);
  EXPECT_EQ(Pull(client, {1, 1000000}), (std::vector<float>{-1, -1, -2, -2}));
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(cluster.servers[s]->sparse_tables()->row_pushes(), 2) << s;
  }
}

// A shard lost in the middle of a row push: the part it did not answer is
// sent again once it is back (its checkpoint restored, which remembers the
// pushes in it), the other shard's part is not; sent again whole, the push
// is a repeat on both.
TEST(SparseWireTest, APushThatLostAShardIsSentThereAgainAndAppliedOnce) {
  const TrainingConfig config = ResolvedConfig(kConfig);
  const std::string dir = testutil::FreshDir("rows_ride_out");
  const std::vector<int> ports = {testutil::FreePort(), testutil::FreePort()};
  auto start = [&](int s) {
    server::ShardServerOptions options;
    options.config = config;
    options.shard = s;
    options.num_shards = 2;
    options.num_workers = 1;
    options.listen_address = absl::StrCat("127.0.0.1:", ports[s]);
    options.lease = testutil::kTestLease;
    options.checkpoint_dir = dir;
    absl::StatusOr<std::unique_ptr<server::ShardServer>> server =
        server::ShardServer::Start(options);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  };
  std::vector<std::unique_ptr<server::ShardServer>> servers;
  servers.push_back(start(0));
  servers.push_back(start(1));
  ASSERT_NE(servers[0], nullptr);
  ASSERT_NE(servers[1], nullptr);
  absl::StatusOr<std::unique_ptr<worker::PsClient>> connected =
      worker::PsClient::Connect(testutil::ClientOptions(servers, config));
  ASSERT_TRUE(connected.ok()) << connected.status();
  worker::PsClient& client = **connected;
  const int lost = common::ShardOfId(1000000, 64, 2);
  ASSERT_THAT(client.SparsePush("emb", {1, 1000000}, {1, 1, 2, 2}, kTimeout),
              IsOk());
  ASSERT_THAT(servers[lost]->SaveCheckpoint(nullptr), IsOk());
  servers[lost]->Shutdown(absl::ZeroDuration());
  servers[lost].reset();

  int ride_outs = 0;
  const worker::PsClient::RideOut ride_out = [&](const absl::Status& why) {
    ++ride_outs;
    EXPECT_THAT(why, StatusIs(absl::StatusCode::kUnavailable,
                              HasSubstr(absl::StrCat("shard ", lost))));
    servers[lost] = start(lost);
    return client.Reconnect(kTimeout, absl::Seconds(5));
  };
  const uint64_t seq = client.NextRowPushSeq();
  SparsePushResponse answer;
  ASSERT_THAT(client.SparsePush("emb", {1, 1000000}, {1, 1, 2, 2}, kTimeout,
                                &answer, ride_out, seq),
              IsOk());
  EXPECT_EQ(ride_outs, 1);
  EXPECT_EQ(answer.updated(), 2);
  EXPECT_EQ(Pull(client, {1, 1000000}), (std::vector<float>{-1, -1, -2, -2}));
  ASSERT_THAT(client.SparsePush("emb", {1, 1000000}, {1, 1, 2, 2}, kTimeout,
                                &answer, ride_out, seq),
              IsOk());
  EXPECT_TRUE(answer.repeat());
  EXPECT_EQ(answer.updated(), 0);
  EXPECT_EQ(Pull(client, {1, 1000000}), (std::vector<float>{-1, -1, -2, -2}));
  EXPECT_EQ(ride_outs, 1);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(servers[s]->sparse_tables()->row_pushes(), 2) << s;
  }
}

// The service as a client that skips PsClient's routing would use it.
class RawCallTest : public ::testing::Test {
 protected:
  void Start(const char* text) {
    config_ = ResolvedConfig(text);
    servers_ = testutil::StartLocalShards(config_, 2, 1);
    ASSERT_EQ(servers_.size(), 2u);
    stub_ = ParameterService::NewStub(grpc::CreateChannel(
        servers_[0]->address(), grpc::InsecureChannelCredentials()));
  }
  grpc::Status PullFromShard0(const std::string& table, uint64_t id) {
    SparsePullRequest request;
    request.mutable_caller()->set_config_fingerprint(
        common::ConfigFingerprint(config_));
    request.mutable_caller()->set_shard(0);
    request.mutable_caller()->set_worker_rank(-1);  // an evaluator
    request.set_table(table);
    request.add_ids(id);
    SparsePullResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kTimeout));
    return stub_->SparsePull(&context, request, &response);
  }

  TrainingConfig config_;
  std::vector<std::unique_ptr<server::ShardServer>> servers_;
  std::unique_ptr<ParameterService::Stub> stub_;
};

TEST_F(RawCallTest, AnIdOfAnotherShardOrAnUnknownTableIsRefused) {
  Start(kConfig);
  uint64_t theirs = 0;
  while (common::ShardOfId(theirs, 64, 2) != 1) ++theirs;
  grpc::Status status = PullFromShard0("emb", theirs);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(),
              HasSubstr(absl::StrCat("id ", theirs, " is shard 1's")));
  status = PullFromShard0("nope", 0);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(),
              HasSubstr("no sparse table 'nope' in this run; its tables: 'emb'"));
}

TEST_F(RawCallTest, AShardRefusesANonFiniteGradientItself) {
  Start(kConfig);
  uint64_t mine = 0;
  while (common::ShardOfId(mine, 64, 2) != 0) ++mine;
  SparsePushRequest request;
  request.mutable_caller()->set_config_fingerprint(
      common::ConfigFingerprint(config_));
  request.mutable_caller()->set_shard(0);
  request.mutable_caller()->set_worker_rank(0);  // no session: a restart
  request.set_table("emb");
  request.add_ids(mine);
  const float grads[2] = {1.0f, INFINITY};
  request.set_grads(reinterpret_cast<const char*>(grads), sizeof(grads));
  SparsePushResponse response;
  grpc::ClientContext context;
  grpc::Status status = stub_->SparsePush(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("holds inf"));
  EXPECT_FALSE(servers_[0]->sparse_tables()->tables()[0]->Contains(mine));
}

TEST_F(RawCallTest, ARunWithoutTablesSaysSo) {
  Start("layer_sizes: [4, 2] mode: DOWNPOUR");
  grpc::Status status = PullFromShard0("emb", 0);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("this run has no sparse tables"));
}

// Each row's bytes (values and state) over every shard's table, and the
// shard that holds it.
std::map<uint64_t, std::pair<std::string, int>> AllRows(
    const std::vector<std::unique_ptr<server::ShardServer>>& servers) {
  std::map<uint64_t, std::pair<std::string, int>> rows;
  for (size_t s = 0; s < servers.size(); ++s) {
    const SparseTableSnapshot snapshot =
        servers[s]->sparse_tables()->tables()[0]->Snapshot(64);
    const size_t bytes = snapshot.rows().size() /
                         std::max(1, snapshot.ids_size());
    for (int i = 0; i < snapshot.ids_size(); ++i) {
      EXPECT_TRUE(rows.emplace(snapshot.ids(i),
                               std::make_pair(snapshot.rows().substr(
                                                  i * bytes, bytes),
                                              static_cast<int>(s)))
                      .second)
          << "id " << snapshot.ids(i) << " on two shards";
    }
  }
  return rows;
}

TEST(SparseWireTest, CheckpointedRowsRestoreBitForBitOnTwoAndThreeShards) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [4, 2] mode: DOWNPOUR learning_rate: 0.1 "
      "sparse_buckets: 64 sparse_tables { name: 'emb' dim: 3 "
      "optimizer: SPARSE_ROWWISE_ADAGRAD max_rows: 1000 }");
  const std::string dir = testutil::FreshDir("sparse_checkpoints");
  std::map<uint64_t, std::pair<std::string, int>> before;
  {
    auto servers = testutil::StartLocalShards(config, 2, 1, dir);
    ASSERT_EQ(servers.size(), 2u);
    absl::StatusOr<std::unique_ptr<worker::PsClient>> client =
        worker::PsClient::Connect(testutil::ClientOptions(servers, config));
    ASSERT_THAT(client, IsOk());
    for (int step = 0; step < 5; ++step) {
      std::vector<uint64_t> ids;
      std::vector<float> grads;
      for (uint64_t id = 0; id < 40; ++id) {
        ids.push_back(id * 7919 + step % 2);
        for (int c = 0; c < 3; ++c) grads.push_back(0.01f * (id + c) - 0.2f);
      }
      ASSERT_THAT((*client)->SparsePush("emb", ids, grads, kTimeout), IsOk());
    }
    before = AllRows(servers);
    ASSERT_EQ(before.size(), 80u);
    for (auto& server : servers) ASSERT_THAT(server->SaveCheckpoint(), IsOk());
  }
  // The same shard count resumes its own rows; three take theirs from both.
  for (int shards : {2, 3}) {
    auto servers = testutil::StartLocalShards(config, shards, 1, dir);
    ASSERT_EQ(servers.size(), static_cast<size_t>(shards));
    const auto after = AllRows(servers);
    ASSERT_EQ(after.size(), before.size());
    for (const auto& [id, row] : after) {
      EXPECT_EQ(row.first, before.at(id).first) << "id " << id;
      EXPECT_EQ(row.second, common::ShardOfId(id, 64, shards)) << "id " << id;
    }
  }
}

TEST(SparseWireTest, BadTableConfigsAreRefusedAtResolution) {
  absl::StatusOr<TrainingConfig> parsed = common::ParseConfigText(
      "layer_sizes: [4, 2] sparse_tables { name: 'a' dim: 2 max_rows: 5 } "
      "sparse_tables { name: 'a' dim: 3 max_rows: 5 }");
  ASSERT_THAT(parsed, IsOk());
  EXPECT_THAT(common::ResolveConfig(*parsed, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("two tables are named 'a'")));
  // Resolution writes out the scale the rows start with.
  parsed = common::ParseConfigText(
      "layer_sizes: [4, 2] sparse_tables { name: 'a' dim: 16 max_rows: 5 } "
      "sparse_tables { name: 'b' dim: 4 max_rows: 5 init_scale: 0 }");
  ASSERT_THAT(parsed, IsOk());
  absl::StatusOr<TrainingConfig> resolved =
      common::ResolveConfig(*parsed, nullptr);
  ASSERT_THAT(resolved, IsOk());
  EXPECT_EQ(resolved->sparse_tables(0).init_scale(), 0.25f);
  EXPECT_EQ(resolved->sparse_tables(1).init_scale(), 0.0f);
  parsed = common::ParseConfigText(
      "layer_sizes: [4, 2] sparse_tables { name: 'a' dim: 2 }");
  ASSERT_THAT(parsed, IsOk());
  EXPECT_THAT(common::ResolveConfig(*parsed, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("give max_rows")));
}

}  // namespace
}  // namespace monsoon
