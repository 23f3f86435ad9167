#include "tests/local_shards.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace monsoon::testutil {

std::vector<std::unique_ptr<server::ShardServer>> StartLocalShards(
    const TrainingConfig& config, int num_shards, int num_workers,
    const std::string& checkpoint_dir, const std::string& socket_dir) {
  std::vector<std::unique_ptr<server::ShardServer>> servers;
  for (int s = 0; s < num_shards; ++s) {
    server::ShardServerOptions options;
    options.config = config;
    options.shard = s;
    options.num_shards = num_shards;
    options.num_workers = num_workers;
    options.listen_address =
        socket_dir.empty()
            ? "127.0.0.1:0"
            : absl::StrCat("unix:", socket_dir, "/shard-", s, ".sock");
    options.lease = kTestLease;
    options.checkpoint_dir = checkpoint_dir;
    absl::StatusOr<std::unique_ptr<server::ShardServer>> server =
        server::ShardServer::Start(options);
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) servers.push_back(*std::move(server));
  }
  return servers;
}

worker::PsClientOptions ClientOptions(
    const std::vector<std::unique_ptr<server::ShardServer>>& servers,
    const TrainingConfig& config, int rank) {
  worker::PsClientOptions options;
  for (const auto& server : servers) {
    options.server_addresses.push_back(server->address());
  }
  options.config = config;
  options.worker_rank = rank;
  options.connect_timeout = absl::Seconds(10);
  return options;
}

LocalCluster::LocalCluster(const TrainingConfig& config, int num_shards,
                           int num_workers, int rank)
    : servers(StartLocalShards(config, num_shards, num_workers)) {
  if (static_cast<int>(servers.size()) != num_shards) return;
  absl::StatusOr<std::unique_ptr<worker::PsClient>> connected =
      worker::PsClient::Connect(ClientOptions(servers, config, rank));
  EXPECT_TRUE(connected.ok()) << connected.status();
  if (connected.ok()) client = *std::move(connected);
}

std::vector<float> LocalCluster::Weights(int64_t min_version) {
  if (client == nullptr) return {};
  std::vector<float> weights(client->ranges().back().end);
  std::vector<int64_t> versions;
  absl::Status status = client->Pull(min_version, absl::Seconds(30),
                                     absl::MakeSpan(weights), &versions);
  EXPECT_TRUE(status.ok()) << status;
  return weights;
}

}  // namespace monsoon::testutil
