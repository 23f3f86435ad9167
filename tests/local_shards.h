// Test helpers: a sharded parameter server on 127.0.0.1 inside the test
// process, and client options that reach it. Test-only.
#ifndef MONSOON_TESTS_LOCAL_SHARDS_H_
#define MONSOON_TESTS_LOCAL_SHARDS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/config.pb.h"
#include "server/shard_server.h"
#include "worker/ps_client.h"

namespace monsoon::testutil {

// The shards' worker lease in tests: short, so that a test that restarts a
// worker (or loses one) waits little for its predecessor's to run out, yet
// far longer than a step takes on a loaded machine under ThreadSanitizer (a
// live worker whose lease ran out would have its batch skipped).
inline constexpr absl::Duration kTestLease = absl::Seconds(2);

// Starts shards 0 .. num_shards-1 of `config` on port 0 of 127.0.0.1 (or,
// with `socket_dir`, on Unix domain sockets there: unix:DIR/shard-S.sock),
// with the lease kTestLease (and checkpoints in `checkpoint_dir`, if
// given). A shard that does not start is a test failure and is left out.
std::vector<std::unique_ptr<server::ShardServer>> StartLocalShards(
    const TrainingConfig& config, int num_shards, int num_workers,
    const std::string& checkpoint_dir = "", const std::string& socket_dir = "");

// Options for a client of those shards, with a 10 s connect timeout.
worker::PsClientOptions ClientOptions(
    const std::vector<std::unique_ptr<server::ShardServer>>& servers,
    const TrainingConfig& config, int rank = 0);

// Shards 0 .. num_shards-1 of `config` and one client of rank `rank`
// connected to them. A failure is a test failure, and `client` is then null.
struct LocalCluster {
  LocalCluster(const TrainingConfig& config, int num_shards, int num_workers,
               int rank = 0);
  // Every parameter, once each shard's version is at least min_version
  // (within 30 s; a failed pull is a test failure).
  std::vector<float> Weights(int64_t min_version);

  std::vector<std::unique_ptr<server::ShardServer>> servers;
  std::unique_ptr<worker::PsClient> client;
};

}  // namespace monsoon::testutil

#endif  // MONSOON_TESTS_LOCAL_SHARDS_H_
