// Replicated shards (ps_server --replicas=1, server/replication.h): a push
// is acknowledged only once the range's backup (in the next shard's
// process) has applied it; a worker that loses a shard's process has the
// backup take the range over and loses nothing acknowledged; a primary that
// was given up for dead and comes back is fenced; a backup does not take
// over from a primary that still answers it.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/model_layout.h"
#include "common/sparse_ids.h"
#include "common/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/service.grpc.pb.h"
#include "server/shard_server.h"
#include "tests/blobs.h"
#include "tests/local_shards.h"
#include "tests/running_time.h"
#include "tests/status_matchers.h"
#include "tests/tcp_proxy.h"
#include "tests/test_util.h"
#include "tests/worker_hold.h"
#include "worker/cpu_backend.h"
#include "worker/dataset.h"
#include "worker/gradient_pusher.h"
#include "worker/model/model.h"
#include "worker/ps_client.h"
#include "worker/training_loop.h"
#include "worker/worker_counters.h"

namespace monsoon::server {
namespace {

using ::monsoon::testutil::FreePort;
using ::monsoon::testutil::ResolvedConfig;
using ::monsoon::testutil::StatusIs;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// Downpour with plain SGD at rate 0.5 on a [3, 2] layer (8 parameters, 4
// per shard of 2), so that every weight after k pushes of ones is known.
TrainingConfig PlainSgd() {
  return ResolvedConfig(
      "layer_sizes: [3, 2] mode: DOWNPOUR optimizer: SGD learning_rate: 0.5 "
      "momentum: 0");
}

ShardServerOptions Replicated(const TrainingConfig& config, int shard,
                              const std::vector<std::string>& servers,
                              const std::vector<int>& ports) {
  ShardServerOptions options;
  options.config = config;
  options.shard = shard;
  options.num_shards = static_cast<int>(ports.size());
  options.num_workers = 2;
  options.listen_address = absl::StrCat("127.0.0.1:", ports[shard]);
  options.lease = testutil::kTestLease;
  options.replicas = 1;
  options.servers = servers;
  return options;
}

// Two shard processes with --replicas=1 on ports of their own; `servers`
// is where they reach each other (by default, each other's ports).
struct ReplicatedPair {
  explicit ReplicatedPair(const TrainingConfig& config,
                          std::vector<std::string> peer_addresses = {},
                          int num_workers = 2) {
    ports = {FreePort(), FreePort()};
    addresses = {absl::StrCat("127.0.0.1:", ports[0]),
                 absl::StrCat("127.0.0.1:", ports[1])};
    if (peer_addresses.empty()) peer_addresses = addresses;
    for (int s = 0; s < 2; ++s) {
      ShardServerOptions options = Replicated(config, s, peer_addresses, ports);
      options.num_workers = num_workers;
      absl::StatusOr<std::unique_ptr<ShardServer>> server =
          ShardServer::Start(options);
      EXPECT_TRUE(server.ok()) << server.status();
      if (server.ok()) servers.push_back(*std::move(server));
    }
  }
  worker::PsClientOptions Client(const TrainingConfig& config, int rank) {
    worker::PsClientOptions options;
    options.server_addresses = addresses;
    options.config = config;
    options.worker_rank = rank;
    options.num_workers = 2;
    options.connect_timeout = absl::Seconds(10);
    return options;
  }
  std::vector<int> ports;
  std::vector<std::string> addresses;
  std::vector<std::unique_ptr<ShardServer>> servers;
};

// The two shard processes of `ports`, process s reaching the others at
// peers(s) (a proxy in front of one, say).
std::vector<std::unique_ptr<ShardServer>> StartBehind(
    const TrainingConfig& config, const std::vector<int>& ports,
    const std::function<std::vector<std::string>(int)>& peers) {
  std::vector<std::unique_ptr<ShardServer>> servers;
  for (int s = 0; s < 2; ++s) {
    absl::StatusOr<std::unique_ptr<ShardServer>> server =
        ShardServer::Start(Replicated(config, s, peers(s), ports));
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) servers.push_back(*std::move(server));
  }
  return servers;
}

// Sends values[0, 4) to shard 0 and values[4, 8) to shard 1.
void SendHalves(const std::vector<float>& values, worker::ShardedPush* push) {
  for (int s = 0; s < 2; ++s) {
    worker::ShardPayload payload;
    payload.values = 4;
    payload.data = absl::MakeConstSpan(
        reinterpret_cast<const uint8_t*>(values.data() + 4 * s),
        4 * sizeof(float));
    push->Send(s, payload);
  }
}

std::vector<float> Values(UpdateRule* rule) {
  WeightsPtr weights = rule->Snapshot();
  return std::vector<float>(weights->values().begin(),
                            weights->values().end());
}

// Every asynchronous mode: the backup's copy equals the primary's after
// every acknowledged push (hogwild's too: its pushes here do not overlap).
class EveryAsyncMode : public ::testing::TestWithParam<const char*> {};

TEST_P(EveryAsyncMode, ThePrimaryAndItsBackupHoldTheSameWeights) {
  // Hogwild's lock-free shards apply plain SGD; the others Adagrad, whose
  // accumulators the copies must share too. Onebit's pushes are quantized
  // as a worker's are (a GradientPusher, its residual carried on), on
  // ranges of 32 values, so that a forward's bytes tell float32 from 1 bit.
  const std::string mode = GetParam();
  const bool onebit = mode == "ONEBIT";
  const TrainingConfig config = ResolvedConfig(absl::StrCat(
      onebit ? "layer_sizes: [7, 8] onebit_bucket_size: 16"
             : "layer_sizes: [3, 2]",
      " mode: ", mode, " optimizer: ", mode == "HOGWILD" ? "SGD" : "ADAGRAD",
      " learning_rate: 0.1 alpha: 0.5"));
  ReplicatedPair pair(config);
  ASSERT_EQ(pair.servers.size(), 2u);
  absl::StatusOr<std::unique_ptr<worker::PsClient>> client =
      worker::PsClient::Connect(pair.Client(config, 0));
  ASSERT_TRUE(client.ok()) << client.status();
  const size_t n = onebit ? 64 : 8;
  std::unique_ptr<worker::ComputeBackend> cpu = worker::MakeCpuBackend(1);
  std::unique_ptr<worker::GradientPusher> pusher;
  float* device = nullptr;
  if (onebit) {
    absl::StatusOr<std::unique_ptr<worker::GradientPusher>> made =
        worker::GradientPusher::Create(cpu.get(), client->get(), config);
    ASSERT_TRUE(made.ok()) << made.status();
    pusher = *std::move(made);
    absl::StatusOr<float*> allocated = cpu->AllocateFloats(n);
    ASSERT_TRUE(allocated.ok()) << allocated.status();
    device = *allocated;
  }
  std::vector<float> grads(n);
  for (int k = 0; k < 4; ++k) {
    for (size_t i = 0; i < grads.size(); ++i) {
      grads[i] = 0.25f * ((i % 8) + k) - 1;
    }
    if (onebit) {
      ASSERT_OK(cpu->CopyToDevice(grads.data(), device, n * sizeof(float)));
      absl::StatusOr<std::unique_ptr<worker::PendingCall>> push =
          pusher->Push(device, {k, k}, 4, /*sample_offset=*/4 * k);
      ASSERT_TRUE(push.ok()) << push.status();
      ASSERT_OK((*push)->Wait());
    } else {
      ASSERT_OK((*client)->Push(grads, {k, k}, 4));
    }
    EXPECT_EQ(pair.servers[1]->backup_state()->version(), k + 1);
    EXPECT_THAT(Values(pair.servers[1]->backup_rule()),
                ElementsAreArray(Values(pair.servers[0]->rule())));
    EXPECT_THAT(Values(pair.servers[0]->backup_rule()),
                ElementsAreArray(Values(pair.servers[1]->rule())));
  }
  // And the optimizer's state: a checkpoint of either copy is the same.
  EXPECT_EQ(pair.servers[1]->backup_rule()->SaveState().optimizer_state,
            pair.servers[0]->rule()->SaveState().optimizer_state);
  // A 1-bit push is forwarded as it came: each of the 4 forwards of a
  // range of 32 values took what the worker's push took (2 buckets: 4
  // bytes of bits and 16 of scales, and the header), under the 128 bytes
  // of its values as float32; the other modes forward float32.
  const int64_t forwarded =
      pair.servers[1]->backup_state()->Stats().bytes_pushed();
  const int64_t pushed = pair.servers[0]->state()->Stats().bytes_pushed();
  if (onebit) {
    EXPECT_EQ(forwarded - pushed, 4 * 2 * 2);  // replica_seq and _epoch
    EXPECT_LT(forwarded, 4 * 128);
  } else {
    EXPECT_GT(forwarded, 4 * 4 * static_cast<int64_t>(sizeof(float)));
  }
  if (device != nullptr) cpu->Free(device);
}

INSTANTIATE_TEST_SUITE_P(Modes, EveryAsyncMode,
                         ::testing::Values("DOWNPOUR", "HOGWILD", "EASGD",
                                           "ONEBIT"));

TEST(ReplicationTest, APushIsAcknowledgedOnlyOnceTheBackupAppliedIt) {
  const TrainingConfig config = PlainSgd();
  ReplicatedPair pair(config);
  ASSERT_EQ(pair.servers.size(), 2u);
  absl::StatusOr<std::unique_ptr<worker::PsClient>> client =
      worker::PsClient::Connect(pair.Client(config, 0));
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<float> before0 = Values(pair.servers[0]->rule());
  const std::vector<float> before1 = Values(pair.servers[1]->rule());
  // Each backup starts from its range's initial weights.
  EXPECT_THAT(Values(pair.servers[1]->backup_rule()),
              ElementsAreArray(before0));
  EXPECT_THAT(Values(pair.servers[0]->backup_rule()),
              ElementsAreArray(before1));

  const std::vector<float> ones(8, 1.0f);
  for (int k = 0; k < 3; ++k) {
    ASSERT_OK((*client)->Push(ones, {k, k}, 4));
    // As soon as the push is acknowledged, both copies of both ranges have
    // it, bit for bit.
    EXPECT_EQ(pair.servers[1]->backup_state()->version(), k + 1);
    EXPECT_EQ(pair.servers[0]->backup_state()->version(), k + 1);
    EXPECT_THAT(Values(pair.servers[1]->backup_rule()),
                ElementsAreArray(Values(pair.servers[0]->rule())));
    EXPECT_THAT(Values(pair.servers[0]->backup_rule()),
                ElementsAreArray(Values(pair.servers[1]->rule())));
  }
  EXPECT_FLOAT_EQ(Values(pair.servers[0]->backup_rule())[0],
                  before1[0] - 3 * 0.5f);
  // Three pushes, each acknowledged as applied by both shards.
  EXPECT_EQ((*client)->ledger().updates_acknowledged, 6);
  EXPECT_EQ((*client)->ledger().updates_answered_as_duplicate, 0);
  EXPECT_EQ((*client)->ledger().updates_lost, 0);
  // The backup knows where rank 0's data is, as the primary does.
  EXPECT_EQ(pair.servers[0]->backup_state()->SamplePosition(0), 12);
  absl::StatusOr<std::vector<StatsResponse>> stats =
      (*client)->Stats(absl::Seconds(5));
  ASSERT_TRUE(stats.ok()) << stats.status();
  const StatsResponse& primary = (*stats)[1];
  EXPECT_EQ(primary.replica_role(), StatsResponse::PRIMARY);
  EXPECT_EQ(primary.range_epoch(), 1);
  EXPECT_EQ(primary.replicated_updates(), 3);
  // Every forward went on one call (ParameterService.Replicate), each
  // primary's to its backup.
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(pair.servers[s]->replication()->forward_calls(), 1) << s;
    // Each timed, once applied.
    EXPECT_EQ(pair.servers[s]->replication()->forward_seconds().count, 3u) << s;
  }
}

TEST(ReplicationTest, ABackupTakesOverALostShardAndNothingAcknowledgedIsLost) {
  const TrainingConfig config = PlainSgd();
  ReplicatedPair pair(config);
  ASSERT_EQ(pair.servers.size(), 2u);
  absl::StatusOr<std::unique_ptr<worker::PsClient>> client =
      worker::PsClient::Connect(pair.Client(config, 0));
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<float> initial1 = Values(pair.servers[1]->rule());
  const std::vector<float> ones(8, 1.0f);
  int acknowledged = 0;
  for (int k = 0; k < 5; ++k) {
    ASSERT_OK((*client)->Push(ones, {k, k}, 4));
    ++acknowledged;
  }
  // Shard 1's process dies.
  pair.servers[1]->Shutdown(absl::ZeroDuration());
  pair.servers[1].reset();

  EXPECT_THAT((*client)->Push(ones, {5, 5}, 4),
              StatusIs(absl::StatusCode::kUnavailable));
  testutil::RunningTime reconnect;
  ASSERT_OK((*client)->Reconnect(absl::Seconds(10), absl::Seconds(5)));
  EXPECT_LT(reconnect.Elapsed(), absl::Seconds(1));
  // Every acknowledged push is in the backup's copy, which now serves the
  // range (shard 0 applied the refused push already: the repeat is
  // acknowledged as a duplicate there and applied once on the backup).
  EXPECT_EQ((*client)->applied_samples(), 4 * acknowledged);
  EXPECT_EQ((*client)->initial_versions()[1], acknowledged);
  const int64_t acknowledged_before = (*client)->ledger().updates_acknowledged;
  std::vector<PushResponse> answers;
  ASSERT_OK((*client)->Push(ones, {5, 5}, 4, &answers));
  ASSERT_EQ(answers.size(), 2u);
  // Shard 0 has the push already, unless the lost call was cancelled
  // before it read the whole push.
  const int shard0_applied_now = answers[0].duplicate() ? 0 : 1;
  EXPECT_FALSE(answers[1].duplicate());
  EXPECT_EQ(answers[1].version(), 6);

  // A push-pull (the loops' call) to the range that moved: applied there
  // once, acknowledged as applied, with the weights that include it.
  std::vector<PushResponse> pulled_answers;
  std::vector<float> params(8, 0.0f);
  std::vector<int64_t> versions;
  const worker::PullTarget pull{absl::MakeSpan(params), &versions,
                                absl::Seconds(10)};
  common::BufferLease lease;
  std::unique_ptr<worker::ShardedPush> push = (*client)->StartPush(
      {6, 6}, 4, /*sample_offset=*/24, &lease, &pulled_answers, &pull);
  SendHalves(ones, push.get());
  ASSERT_OK(push->Wait());
  EXPECT_FALSE(pulled_answers[0].duplicate());
  EXPECT_FALSE(pulled_answers[1].duplicate());
  EXPECT_EQ(pulled_answers[1].version(), 7);
  EXPECT_EQ(versions[1], 7);

  ShardState* taken = pair.servers[0]->backup_state();
  EXPECT_EQ(taken->version(), 7);
  EXPECT_EQ(taken->SamplePosition(0), 28);
  ASSERT_TRUE(lease.AwaitReleased(absl::Seconds(10)));
  const std::vector<float> now = Values(pair.servers[0]->backup_rule());
  for (size_t i = 0; i < now.size(); ++i) {
    EXPECT_FLOAT_EQ(now[i], initial1[i] - 7 * 0.5f) << i;
    EXPECT_FLOAT_EQ(params[4 + i], now[i]) << i;
  }
  // One more, whose answers the caller does not keep (as the loops' pushes).
  {
    std::unique_ptr<worker::ShardedPush> unanswered = (*client)->StartPush(
        {7, 7}, 4, /*sample_offset=*/28, &lease, nullptr, &pull);
    SendHalves(ones, unanswered.get());
    ASSERT_OK(unanswered->Wait());
  }
  // The client's ledger: what it was told was applied, once each; nothing
  // lost.
  EXPECT_EQ((*client)->ledger().updates_acknowledged,
            acknowledged_before + 1 + shard0_applied_now + 2 + 2);
  EXPECT_EQ((*client)->ledger().updates_answered_as_duplicate,
            1 - shard0_applied_now);
  EXPECT_EQ((*client)->ledger().updates_lost, 0);
  EXPECT_EQ((*client)->ledger().take_overs, 1);
  absl::StatusOr<std::vector<StatsResponse>> stats =
      (*client)->Stats(absl::Seconds(5));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ((*stats)[1].shard(), 1);
  EXPECT_EQ((*stats)[1].replica_role(), StatsResponse::DEGRADED);
  EXPECT_EQ((*stats)[1].range_epoch(), 2);
  EXPECT_EQ((*stats)[1].take_overs(), 1);
  // Shard 0's own range lost its backup with the process: it goes on
  // without one.
  EXPECT_EQ((*stats)[0].replica_role(), StatsResponse::DEGRADED);
}

TEST(ReplicationTest, AClientThatStartsAfterTheFirstShardDiedFindsItsBackup) {
  const TrainingConfig config = PlainSgd();
  ReplicatedPair pair(config);
  ASSERT_EQ(pair.servers.size(), 2u);
  pair.servers[0]->Shutdown(absl::ZeroDuration());
  pair.servers[0].reset();
  // The client has heard from no shard yet: it learns from shard 1's
  // process that it holds a copy of shard 0's range, and has it take over
  // (a client that waited for shard 0's process would give up at the
  // connect timeout).
  worker::PsClientOptions options = pair.Client(config, 1);
  options.connect_timeout = absl::Seconds(20);
  absl::StatusOr<std::unique_ptr<worker::PsClient>> client =
      worker::PsClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->ledger().take_overs, 1);
  EXPECT_EQ(pair.servers[1]->backup_replication()->role(),
            Replication::Role::kDegraded);
  ASSERT_OK((*client)->Push(std::vector<float>(8, 1.0f), {0, 0}, 4));
  EXPECT_EQ(pair.servers[1]->backup_state()->version(), 1);
}

TEST(ReplicationTest, AShardRestartedAfterItsRangeMovedOnServesItNoMore) {
  const TrainingConfig config = PlainSgd();
  ReplicatedPair pair(config);
  ASSERT_EQ(pair.servers.size(), 2u);
  absl::StatusOr<std::unique_ptr<worker::PsClient>> client =
      worker::PsClient::Connect(pair.Client(config, 0));
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<float> ones(8, 1.0f);
  ASSERT_OK((*client)->Push(ones, {0, 0}, 4));
  pair.servers[1]->Shutdown(absl::ZeroDuration());
  pair.servers[1].reset();
  EXPECT_FALSE((*client)->Push(ones, {1, 1}, 4).ok());
  ASSERT_OK((*client)->Reconnect(absl::Seconds(10), absl::Seconds(5)));
  ASSERT_OK((*client)->Push(ones, {1, 1}, 4));

  // Shard 1's process comes back (as a supervisor would restart it), from
  // nothing: its range moved on at shard 0's process, and shard 0's range
  // went on without it. It copies both back and is their backup, serving
  // neither.
  absl::StatusOr<std::unique_ptr<ShardServer>> back = ShardServer::Start(
      Replicated(config, 1, pair.addresses, pair.ports));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)->replication()->role(), Replication::Role::kBackup);
  // A worker that reaches it is sent to the copy that has the updates.
  worker::PsClientOptions late = pair.Client(config, 1);
  absl::StatusOr<std::unique_ptr<worker::PsClient>> second =
      worker::PsClient::Connect(late);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->ledger().take_overs, 1);
  EXPECT_EQ((*second)->initial_versions()[1], 2);
  // Its copy of shard 0's range was made at start, and follows.
  EXPECT_EQ((*back)->backup_state()->version(), 2);
  ASSERT_OK((*second)->Push(ones, {2, 2}, 4));
  EXPECT_EQ((*back)->backup_state()->version(), 3);
  EXPECT_EQ((*back)->state()->version(), 3);
  EXPECT_EQ(pair.servers[0]->state()->version(), 3);
}

TEST(ReplicationTest, ABackupDoesNotTakeOverFromAPrimaryThatAnswersIt) {
  const TrainingConfig config = PlainSgd();
  ReplicatedPair pair(config);
  ASSERT_EQ(pair.servers.size(), 2u);
  std::unique_ptr<ParameterService::Stub> stub = ParameterService::NewStub(
      worker::MakeChannel(pair.addresses[0]));
  RegisterRequest request;
  request.set_worker_rank(0);
  request.set_shard(1);  // shard 1's range, whose backup is shard 0's
  request.set_config_fingerprint(common::ConfigFingerprint(config));
  request.set_session(7);
  request.set_take_over(true);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  RegisterResponse response;
  const grpc::Status status = stub->Register(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr("still answers"));
  EXPECT_EQ(pair.servers[0]->backup_replication()->role(),
            Replication::Role::kBackup);

  // Without take_over, the backup serves no worker.
  request.set_take_over(false);
  grpc::ClientContext again;
  again.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  const grpc::Status refused = stub->Register(&again, request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.error_message(), HasSubstr("holds the backup"));
}

TEST(ReplicationTest, AFrozenPrimaryThatComesBackIsFencedAndTakesNoWrite) {
  const TrainingConfig config = PlainSgd();
  // Shard 0's process (the backup of shard 1's range) and the first worker
  // reach shard 1 through a proxy that freezes, as a SIGSTOPped process
  // or a partition would look; a second worker reaches it directly.
  std::vector<int> ports = {FreePort(), FreePort()};
  testutil::TcpProxy to_primary(ports[1]);
  ASSERT_NE(to_primary.port(), 0);
  const std::vector<std::string> peers = {
      absl::StrCat("127.0.0.1:", ports[0]), to_primary.address()};
  std::vector<std::unique_ptr<ShardServer>> servers =
      StartBehind(config, ports, [&](int) { return peers; });
  ASSERT_EQ(servers.size(), 2u);
  worker::PsClientOptions cut;
  cut.server_addresses = peers;
  cut.config = config;
  cut.worker_rank = 0;
  cut.num_workers = 2;
  cut.connect_timeout = absl::Seconds(10);
  cut.peer_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<worker::PsClient>> first =
      worker::PsClient::Connect(cut);
  ASSERT_TRUE(first.ok()) << first.status();
  worker::PsClientOptions direct = cut;
  direct.server_addresses = {peers[0], absl::StrCat("127.0.0.1:", ports[1])};
  direct.worker_rank = 1;
  absl::StatusOr<std::unique_ptr<worker::PsClient>> second =
      worker::PsClient::Connect(direct);
  ASSERT_TRUE(second.ok()) << second.status();
  const std::vector<float> ones(8, 1.0f);
  ASSERT_OK((*first)->Push(ones, {0, 0}, 4));

  to_primary.Freeze();
  // The first worker gives up on shard 1 and asks its backup, which cannot
  // reach the primary either, and takes the range over.
  ASSERT_OK((*first)->Reconnect(absl::Seconds(10), absl::Seconds(5)));
  EXPECT_EQ(servers[0]->backup_replication()->role(),
            Replication::Role::kDegraded);
  EXPECT_EQ(servers[0]->backup_replication()->epoch(), 2);
  const int64_t taken_version = servers[0]->backup_state()->version();
  EXPECT_EQ(taken_version, 1);

  // The old primary still takes the second worker's push, applies it and
  // forwards it; the backup refuses it (fenced), so it is not acknowledged
  // and no copy that serves the range has it.
  EXPECT_THAT((*second)->Push(ones, {1, 1}, 4),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("took it")));
  EXPECT_THAT(servers[1]->replication()->role(),
              AnyOf(Replication::Role::kFenced, Replication::Role::kBackup));
  EXPECT_EQ(servers[0]->backup_state()->version(), taken_version);
  // Fenced, it copies the range back from the process that took it over
  // (the repairer, within a second or two), and is its backup from then
  // on: it refuses the range's calls, saying where it is served.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (servers[1]->replication()->repairs() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(servers[1]->replication()->repairs(), 1);
  EXPECT_EQ(servers[1]->replication()->role(), Replication::Role::kBackup);
  EXPECT_THAT((*second)->Push(ones, {1, 1}, 4),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("holds the backup")));
  // Its copy went back to the one it was given: the push it applied alone
  // is gone from it.
  EXPECT_EQ(servers[1]->state()->version(), taken_version);
  EXPECT_EQ(servers[1]->rule()->Snapshot()->version(), taken_version);
  // The second worker follows the range to the process that took it over;
  // its push counts there once.
  ASSERT_OK((*second)->Reconnect(absl::Seconds(10), absl::Seconds(5)));
  ASSERT_OK((*second)->Push(ones, {1, 1}, 4));
  EXPECT_EQ(servers[0]->backup_state()->version(), taken_version + 1);
}

// A process restarted after its range was taken over copies both its
// ranges back (ParameterService.Repair) and is their backup again: the run
// is protected again, and the other process's death then loses nothing
// either. Plain SGD at 0.5 with pushes of ones: every acknowledged push
// takes 0.5 off each weight, exactly once.
TEST(ReplicationTest, ARestartedProcessIsRepairedAndProtectsTheRunAgain) {
  const TrainingConfig config = PlainSgd();
  ReplicatedPair pair(config);
  ASSERT_EQ(pair.servers.size(), 2u);
  absl::StatusOr<std::unique_ptr<worker::PsClient>> client =
      worker::PsClient::Connect(pair.Client(config, 0));
  ASSERT_TRUE(client.ok()) << client.status();
  // One that only reads the counters (the Kubernetes finisher): it makes
  // no call that would follow a range taken over.
  absl::StatusOr<std::unique_ptr<worker::PsClient>> observer =
      worker::PsClient::Connect(pair.Client(config, -1));
  ASSERT_TRUE(observer.ok()) << observer.status();
  const std::vector<float> initial0 = Values(pair.servers[0]->rule());
  const std::vector<float> initial1 = Values(pair.servers[1]->rule());
  const std::vector<float> ones(8, 1.0f);
  for (int k = 0; k < 3; ++k) ASSERT_OK((*client)->Push(ones, {k, k}, 4));
  pair.servers[1]->Shutdown(absl::ZeroDuration());
  pair.servers[1].reset();
  EXPECT_THAT((*client)->Push(ones, {3, 3}, 4),
              StatusIs(absl::StatusCode::kUnavailable));
  ASSERT_OK((*client)->Reconnect(absl::Seconds(10), absl::Seconds(5)));
  ASSERT_OK((*client)->Push(ones, {3, 3}, 4));
  ASSERT_OK((*client)->Push(ones, {4, 4}, 4));
  EXPECT_EQ(pair.servers[0]->backup_replication()->role(),
            Replication::Role::kDegraded);  // range 1, taken over

  // Process 1 comes back: both its ranges are copied at start.
  absl::StatusOr<std::unique_ptr<ShardServer>> back = ShardServer::Start(
      Replicated(config, 1, pair.addresses, pair.ports));
  ASSERT_TRUE(back.ok()) << back.status();
  pair.servers[1] = *std::move(back);
  ShardServer* zero = pair.servers[0].get();
  ShardServer* one = pair.servers[1].get();
  EXPECT_EQ(one->replication()->role(), Replication::Role::kBackup);
  EXPECT_EQ(one->backup_replication()->role(), Replication::Role::kBackup);
  EXPECT_EQ(zero->replication()->role(), Replication::Role::kPrimary);
  EXPECT_EQ(zero->backup_replication()->role(), Replication::Role::kPrimary);
  EXPECT_EQ(one->replication()->repairs(), 1);
  EXPECT_EQ(one->backup_replication()->repairs(), 1);
  EXPECT_EQ(one->state()->version(), 5);
  EXPECT_EQ(one->backup_state()->version(), 5);
  EXPECT_EQ(one->state()->SamplePosition(0), 20);
  EXPECT_THAT(Values(one->rule()), ElementsAreArray(Values(zero->backup_rule())));
  EXPECT_THAT(Values(one->backup_rule()), ElementsAreArray(Values(zero->rule())));
  // Updates reach the copies again before they are acknowledged.
  ASSERT_OK((*client)->Push(ones, {5, 5}, 4));
  EXPECT_EQ(one->state()->version(), 6);
  EXPECT_EQ(one->backup_state()->version(), 6);
  EXPECT_THAT(Values(one->rule()), ElementsAreArray(Values(zero->backup_rule())));
  EXPECT_THAT(Values(one->backup_rule()), ElementsAreArray(Values(zero->rule())));

  // The observer still calls process 1 for range 1, which only backs it up
  // now: its counters are those of the copy that serves it (process 0's),
  // where the worker's finish was recorded.
  ASSERT_OK((*client)->Leave(absl::Seconds(5), /*finished=*/true));
  ASSERT_OK_AND_ASSIGN(std::vector<StatsResponse> seen,
                       (*observer)->Stats(absl::Seconds(5)));
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].shard(), 1);
  EXPECT_EQ(seen[1].replica_role(), StatsResponse::PRIMARY);
  EXPECT_EQ(seen[1].version(), 6);
  EXPECT_THAT(seen[1].finished_ranks(), ElementsAre(0));
  EXPECT_THAT(seen[0].finished_ranks(), ElementsAre(0));
  // The worker comes back to train on (a new session of its rank).
  ASSERT_OK((*client)->Reconnect(absl::Seconds(10), absl::Seconds(5)));

  // Now process 0 dies: process 1 takes both ranges over, range 1 back home.
  pair.servers[0]->Shutdown(absl::ZeroDuration());
  pair.servers[0].reset();
  EXPECT_THAT((*client)->Push(ones, {6, 6}, 4),
              StatusIs(absl::StatusCode::kUnavailable));
  ASSERT_OK((*client)->Reconnect(absl::Seconds(10), absl::Seconds(5)));
  EXPECT_EQ((*client)->initial_versions()[0], 6);
  EXPECT_EQ((*client)->initial_versions()[1], 6);
  ASSERT_OK((*client)->Push(ones, {6, 6}, 4));
  ASSERT_OK((*client)->Push(ones, {7, 7}, 4));
  EXPECT_EQ(one->state()->version(), 8);
  EXPECT_EQ(one->backup_state()->version(), 8);
  const std::vector<float> range0 = Values(one->backup_rule());
  const std::vector<float> range1 = Values(one->rule());
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(range0[i], initial0[i] - 8 * 0.5f) << i;
    EXPECT_FLOAT_EQ(range1[i], initial1[i] - 8 * 0.5f) << i;
  }
  EXPECT_EQ((*client)->ledger().updates_lost, 0);
  EXPECT_EQ((*client)->ledger().take_overs, 3);
}

// The finisher closes a run whose range 1 was taken over and whose process
// came back as its backup: the serving copy (in process 0) closes it,
// having seen every worker finish, and forwards the close to process 1's
// backup copy, so that both processes save their final checkpoints and
// stop. Process 0 does not stop before range 1 is closed too (the
// finisher closes range 0 first), and a forwarded close of another epoch
// is refused.
TEST(ReplicationTest, ARunWhoseRangeMovedIsClosedEverywhere) {
  const TrainingConfig config = PlainSgd();
  ReplicatedPair pair(config, {}, /*num_workers=*/1);
  ASSERT_EQ(pair.servers.size(), 2u);
  worker::PsClientOptions worker_options = pair.Client(config, 0);
  worker_options.num_workers = 1;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<worker::PsClient> client,
                       worker::PsClient::Connect(worker_options));
  worker::PsClientOptions finisher_options = pair.Client(config, -1);
  finisher_options.num_workers = 1;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<worker::PsClient> finisher,
                       worker::PsClient::Connect(finisher_options));
  const std::vector<float> ones(8, 1.0f);
  ASSERT_OK(client->Push(ones, {0, 0}, 4));
  pair.servers[1]->Shutdown(absl::ZeroDuration());
  pair.servers[1].reset();
  EXPECT_THAT(client->Push(ones, {1, 1}, 4),
              StatusIs(absl::StatusCode::kUnavailable));
  ASSERT_OK(client->Reconnect(absl::Seconds(10), absl::Seconds(5)));
  ASSERT_OK(client->Push(ones, {1, 1}, 4));
  ShardServerOptions again = Replicated(config, 1, pair.addresses, pair.ports);
  again.num_workers = 1;
  ASSERT_OK_AND_ASSIGN(pair.servers[1], ShardServer::Start(again));
  ASSERT_EQ(pair.servers[1]->replication()->role(), Replication::Role::kBackup);
  // Before every worker finished: refused, and nothing closed.
  EXPECT_THAT(finisher->CloseRun(absl::Seconds(5)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("before every worker has finished")));
  EXPECT_FALSE(pair.servers[1]->run_closed().HasBeenNotified());
  ASSERT_OK(client->Leave(absl::Seconds(5), /*finished=*/true));

  auto close = [&](int process, CloseRunRequest request) {
    std::unique_ptr<ParameterService::Stub> stub =
        ParameterService::NewStub(worker::MakeChannel(pair.addresses[process]));
    request.set_config_fingerprint(common::ConfigFingerprint(config));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    CloseRunResponse response;
    return stub->CloseRun(&context, request, &response);
  };
  // A close "from the primary" at an epoch the range is not at.
  CloseRunRequest forged;
  forged.set_shard(1);
  forged.set_from_primary(true);
  forged.set_replica_epoch(pair.servers[1]->replication()->epoch() + 1);
  const grpc::Status refused = close(1, forged);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.error_message(), HasSubstr("not the backup"));
  EXPECT_FALSE(pair.servers[1]->run_closed().HasBeenNotified());
  // The finisher asks its backup (process 1) for nothing: range 1's close
  // goes to process 0 only.
  CloseRunRequest at_backup;
  at_backup.set_shard(1);
  EXPECT_EQ(close(1, at_backup).error_code(), grpc::StatusCode::UNAVAILABLE);

  // Range 0 closed: process 0 still serves range 1, so it goes on.
  CloseRunRequest range0;
  range0.set_shard(0);
  ASSERT_TRUE(close(0, range0).ok());
  EXPECT_TRUE(pair.servers[0]->run_closed().HasBeenNotified());
  EXPECT_FALSE(pair.servers[0]->RunClosedEverywhereServed());
  EXPECT_FALSE(pair.servers[1]->run_closed().HasBeenNotified());

  ASSERT_OK(finisher->CloseRun(absl::Seconds(5)));
  EXPECT_TRUE(pair.servers[0]->backup_state()->run_closed().HasBeenNotified());
  EXPECT_TRUE(pair.servers[0]->RunClosedEverywhereServed());
  EXPECT_TRUE(pair.servers[1]->run_closed().HasBeenNotified());
  EXPECT_TRUE(pair.servers[1]->RunClosedEverywhereServed());
}

// Both processes lost before a repair: each range falls back to what its
// restarted process holds (here no checkpoint: the initial weights), and
// the worker counts every update it was told was applied as lost (and
// says so), rather than going on as if nothing happened.
TEST(ReplicationTest, BothCopiesLostFallBackAndTheWorkerCountsTheLoss) {
  const TrainingConfig config = PlainSgd();
  ReplicatedPair pair(config);
  ASSERT_EQ(pair.servers.size(), 2u);
  absl::StatusOr<std::unique_ptr<worker::PsClient>> client =
      worker::PsClient::Connect(pair.Client(config, 0));
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<float> ones(8, 1.0f);
  for (int k = 0; k < 3; ++k) ASSERT_OK((*client)->Push(ones, {k, k}, 4));
  pair.servers[1]->Shutdown(absl::ZeroDuration());
  pair.servers[1].reset();
  EXPECT_FALSE((*client)->Push(ones, {3, 3}, 4).ok());
  ASSERT_OK((*client)->Reconnect(absl::Seconds(10), absl::Seconds(5)));
  ASSERT_OK((*client)->Push(ones, {3, 3}, 4));
  ASSERT_OK((*client)->Push(ones, {4, 4}, 4));
  EXPECT_EQ((*client)->ledger().updates_lost, 0);
  // Now process 0 dies too, and process 1 comes back from nothing.
  pair.servers[0]->Shutdown(absl::ZeroDuration());
  pair.servers[0].reset();
  absl::StatusOr<std::unique_ptr<ShardServer>> back = ShardServer::Start(
      Replicated(config, 1, pair.addresses, pair.ports));
  ASSERT_TRUE(back.ok()) << back.status();
  pair.servers[1] = *std::move(back);
  ASSERT_OK((*client)->Reconnect(absl::Seconds(10), absl::Seconds(5)));
  EXPECT_EQ((*client)->initial_versions()[0], 0);
  EXPECT_EQ((*client)->initial_versions()[1], 0);
  // 5 updates acknowledged on each range (20 examples each), all gone.
  EXPECT_EQ((*client)->ledger().updates_lost, 10);
  EXPECT_EQ((*client)->ledger().examples_lost, 40);
  EXPECT_EQ((*client)->applied_samples(), 0);
}

// A partition between a primary and its backup only (the workers reach
// both): the primary gives its backup up and goes on alone; once the
// partition heals it tells the backup so, and the backup, which no longer
// follows, copies the range again (the repairer) and the run is protected
// again. Nothing acknowledged is lost throughout.
// Two replicated processes where shard 0's process reaches shard 1's (its
// range's backup) through a proxy that a test can freeze; everyone else
// directly. A client of rank 0 of 2.
struct PartitionablePair {
  explicit PartitionablePair(const TrainingConfig& config)
      : ports{FreePort(), FreePort()},
        to_backup(std::make_unique<testutil::TcpProxy>(ports[1])) {
    if (to_backup->port() == 0) return;
    const std::vector<std::string> direct = {
        absl::StrCat("127.0.0.1:", ports[0]),
        absl::StrCat("127.0.0.1:", ports[1])};
    servers = StartBehind(config, ports, [&](int s) {
      std::vector<std::string> peers = direct;
      if (s == 0) peers[1] = to_backup->address();
      return peers;
    });
    if (servers.size() != 2) return;
    worker::PsClientOptions options;
    options.server_addresses = direct;
    options.config = config;
    options.worker_rank = 0;
    options.num_workers = 2;
    options.connect_timeout = absl::Seconds(10);
    absl::StatusOr<std::unique_ptr<worker::PsClient>> connected =
        worker::PsClient::Connect(options);
    EXPECT_TRUE(connected.ok()) << connected.status();
    if (connected.ok()) client = *std::move(connected);
  }
  bool ready() const { return client != nullptr; }

  std::vector<int> ports;
  std::unique_ptr<testutil::TcpProxy> to_backup;
  std::vector<std::unique_ptr<ShardServer>> servers;
  std::unique_ptr<worker::PsClient> client;
};

TEST(ReplicationTest, APartitionBetweenPrimaryAndBackupHealsIntoProtectionAgain) {
  const TrainingConfig config = PlainSgd();
  PartitionablePair pair(config);
  ASSERT_TRUE(pair.ready());
  testutil::TcpProxy& to_backup = *pair.to_backup;
  std::vector<std::unique_ptr<ShardServer>>& servers = pair.servers;
  std::unique_ptr<worker::PsClient>* client = &pair.client;
  const std::vector<float> ones(8, 1.0f);
  ASSERT_OK((*client)->Push(ones, {0, 0}, 4));

  to_backup.Freeze();
  ASSERT_OK((*client)->Push(ones, {1, 1}, 4));  // once the backup is given up
  EXPECT_EQ(servers[0]->replication()->role(), Replication::Role::kDegraded);
  // Acknowledged at once: the message that tells the backup it no longer
  // follows goes on its own, and waits out the health check's 500 ms
  // through the frozen proxy without holding the push.
  testutil::RunningTime push;
  ASSERT_OK((*client)->Push(ones, {2, 2}, 4));
  EXPECT_LT(push.Elapsed(), absl::Milliseconds(400));
  // (The first forward may have got through before its answer was held.)
  EXPECT_LT(servers[1]->backup_state()->version(),
            servers[0]->state()->version());

  to_backup.Thaw();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  int64_t k = 3;
  while (absl::Now() < deadline &&
         (servers[1]->backup_replication()->repairs() == 0 ||
          servers[0]->replication()->role() != Replication::Role::kPrimary)) {
    ASSERT_OK((*client)->Push(ones, {k, k}, 4));
    ++k;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(servers[1]->backup_replication()->repairs(), 1);
  EXPECT_EQ(servers[0]->replication()->role(), Replication::Role::kPrimary);
  EXPECT_EQ(servers[1]->backup_replication()->role(),
            Replication::Role::kBackup);
  ASSERT_OK((*client)->Push(ones, {k, k}, 4));
  EXPECT_EQ(servers[0]->state()->version(), k + 1);
  EXPECT_EQ(servers[1]->backup_state()->version(), k + 1);
  EXPECT_THAT(Values(servers[1]->backup_rule()),
              ElementsAreArray(Values(servers[0]->rule())));
  EXPECT_EQ((*client)->ledger().updates_lost, 0);
  EXPECT_EQ((*client)->ledger().take_overs, 0);
}

// Sync: two workers' push-pulls for step k, each on its own thread (the
// barrier answers them together); `values[r]` is rank r's gradient. OK or
// the first error.
absl::Status SyncStep(std::vector<std::unique_ptr<worker::PsClient>>& clients,
                      int64_t k, const std::vector<std::vector<float>>& values,
                      std::vector<int64_t> base = {}) {
  if (base.empty()) base = {k, k};
  std::vector<absl::Status> statuses(clients.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < clients.size(); ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> params(8, 0.0f);
      std::vector<int64_t> versions;
      const worker::PullTarget pull{absl::MakeSpan(params), &versions,
                                    absl::Seconds(10)};
      common::BufferLease lease;
      std::unique_ptr<worker::ShardedPush> push = clients[r]->StartPush(
          base, 4, /*sample_offset=*/4 * k, &lease, nullptr, &pull);
      SendHalves(values[r], push.get());
      statuses[r] = push->Wait();
      push.reset();
      if (statuses[r].ok() && !lease.AwaitReleased(absl::Seconds(10))) {
        statuses[r] = absl::DeadlineExceededError("lease");
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& status : statuses) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

std::vector<std::unique_ptr<worker::PsClient>> TwoClients(
    ReplicatedPair& pair, const TrainingConfig& config) {
  std::vector<std::unique_ptr<worker::PsClient>> clients;
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<std::unique_ptr<worker::PsClient>> client =
        worker::PsClient::Connect(pair.Client(config, r));
    EXPECT_TRUE(client.ok()) << client.status();
    if (client.ok()) clients.push_back(*std::move(client));
  }
  return clients;
}

// Sync forwards each step once, as the averaged gradient, when it closes;
// the workers get the step's weights only once the backup has made the
// same step: the copies hold the same weights, momentum and examples
// after every step.
TEST(ReplicationTest, ASyncStepReachesTheBackupBeforeItIsAcknowledged) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [3, 2] mode: SYNC optimizer: SGD learning_rate: 0.1 "
      "momentum: 0.9");
  ReplicatedPair pair(config);
  ASSERT_EQ(pair.servers.size(), 2u);
  std::vector<std::unique_ptr<worker::PsClient>> clients =
      TwoClients(pair, config);
  ASSERT_EQ(clients.size(), 2u);
  for (int k = 0; k < 4; ++k) {
    std::vector<std::vector<float>> values(2, std::vector<float>(8));
    for (int r = 0; r < 2; ++r) {
      for (size_t i = 0; i < 8; ++i) values[r][i] = 0.3f * (i + k) - r;
    }
    ASSERT_OK(SyncStep(clients, k, values));
    for (int s = 0; s < 2; ++s) {
      SCOPED_TRACE(s);
      ShardServer* primary = pair.servers[s].get();
      ShardServer* backup = pair.servers[1 - s].get();
      EXPECT_EQ(backup->backup_state()->version(), k + 1);
      EXPECT_THAT(Values(backup->backup_rule()),
                  ElementsAreArray(Values(primary->rule())));
      EXPECT_EQ(backup->backup_rule()->SaveState().optimizer_state,
                primary->rule()->SaveState().optimizer_state);
      for (int r = 0; r < 2; ++r) {
        EXPECT_EQ(backup->backup_state()->SamplePosition(r), 4 * (k + 1));
      }
    }
  }
  // One forward per step and range, not one per push.
  absl::StatusOr<std::vector<StatsResponse>> stats =
      clients[0]->Stats(absl::Seconds(5));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ((*stats)[0].replicated_updates(), 4);
  EXPECT_EQ((*stats)[1].replicated_updates(), 4);
}

// Sync, a shard's process lost: the workers repeat the step on the range's
// backup, which has every step they were answered, and training goes on
// there. Plain SGD at 0.5 with gradients of ones: each step takes 0.5 off
// every weight.
TEST(ReplicationTest, SyncGoesOnFromTheBackupWithEveryAcknowledgedStep) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [3, 2] mode: SYNC optimizer: SGD learning_rate: 0.5 "
      "momentum: 0");
  ReplicatedPair pair(config);
  ASSERT_EQ(pair.servers.size(), 2u);
  std::vector<std::unique_ptr<worker::PsClient>> clients =
      TwoClients(pair, config);
  ASSERT_EQ(clients.size(), 2u);
  const std::vector<float> initial1 = Values(pair.servers[1]->rule());
  const std::vector<std::vector<float>> ones(2, std::vector<float>(8, 1.0f));
  for (int k = 0; k < 3; ++k) ASSERT_OK(SyncStep(clients, k, ones));
  pair.servers[1]->Shutdown(absl::ZeroDuration());
  pair.servers[1].reset();
  EXPECT_THAT(SyncStep(clients, 3, ones),
              StatusIs(absl::StatusCode::kUnavailable));
  for (auto& client : clients) {
    ASSERT_OK(client->Reconnect(absl::Seconds(10), absl::Seconds(5)));
    // The backup has the 3 steps answered. Shard 0 closed step 3 too if
    // both pushes reached it before the client cancelled its calls there
    // (its shard 1 lost, ShardCalls::Wait), or still collects it: a sync
    // worker resumes at the furthest shard.
    EXPECT_EQ(client->initial_versions()[1], 3);
    const int64_t shard0 = client->initial_versions()[0];
    EXPECT_TRUE(shard0 == 3 || shard0 == 4) << shard0;
    EXPECT_EQ(client->applied_samples(), 4 * shard0);
  }
  // Step 3 again (shard 0 has it, or collects it), then step 4.
  ASSERT_OK(SyncStep(clients, 3, ones,
                     {clients[0]->initial_versions()[0], 3}));
  ASSERT_OK(
      SyncStep(clients, 4, ones, {pair.servers[0]->state()->version(), 4}));
  ShardState* taken = pair.servers[0]->backup_state();
  EXPECT_EQ(taken->version(), 5);
  EXPECT_EQ(taken->SamplePosition(0), 20);
  EXPECT_EQ(taken->SamplePosition(1), 20);
  const std::vector<float> now = Values(pair.servers[0]->backup_rule());
  for (size_t i = 0; i < now.size(); ++i) {
    EXPECT_FLOAT_EQ(now[i], initial1[i] - 5 * 0.5f) << i;
  }
}

// Sync, a worker's process gone for good before its shard's process is
// lost too: the copy that takes the range over has never seen the rank
// call, so it gives the rank a lease from the take-over (rather than
// counting it live for good, as a worker still starting), and the step
// closes without it once that runs out, as on the other shard.
TEST(ReplicationTest, ARankThatNeverComesBackIsLetGoByTheCopyThatTookOver) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [3, 2] mode: SYNC optimizer: SGD learning_rate: 0.5 "
      "momentum: 0 call_timeout_s: 20");
  ReplicatedPair pair(config);
  ASSERT_EQ(pair.servers.size(), 2u);
  std::vector<std::unique_ptr<worker::PsClient>> clients =
      TwoClients(pair, config);
  ASSERT_EQ(clients.size(), 2u);
  const std::vector<std::vector<float>> ones(2, std::vector<float>(8, 1.0f));
  for (int k = 0; k < 3; ++k) ASSERT_OK(SyncStep(clients, k, ones));
  // Rank 1's process stops calling; then shard 1's process is lost.
  std::vector<std::unique_ptr<worker::PsClient>> left;
  left.push_back(std::move(clients[0]));
  pair.servers[1]->Shutdown(absl::ZeroDuration());
  pair.servers[1].reset();
  ASSERT_OK(left[0]->Reconnect(absl::Seconds(10), absl::Seconds(5)));
  // It closes within rank 1's lease (2 s) of its last call or of the
  // take-over; a copy that waited for rank 1 for good would end the step
  // DEADLINE_EXCEEDED after call_timeout_s (20 s).
  ASSERT_OK(SyncStep(left, 3, ones));
  ShardState* taken = pair.servers[0]->backup_state();
  EXPECT_EQ(taken->version(), 4);
  EXPECT_EQ(taken->SamplePosition(0), 16);
}

// A worker that finished before its range moved: the range's primary
// tells the backup of each finish (and leave), so that the copy that
// takes over knows the rank is done, and the run closes once the other
// worker finishes there too, though the lost process never comes back.
TEST(ReplicationTest, AFinishBeforeTheRangeMovedCountsOnTheCopyThatTookOver) {
  const TrainingConfig config = PlainSgd();
  ReplicatedPair pair(config);
  ASSERT_EQ(pair.servers.size(), 2u);
  std::vector<std::unique_ptr<worker::PsClient>> clients =
      TwoClients(pair, config);
  ASSERT_EQ(clients.size(), 2u);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<worker::PsClient> finisher,
                       worker::PsClient::Connect(pair.Client(config, -1)));
  const std::vector<float> ones(8, 1.0f);
  ASSERT_OK(clients[0]->Push(ones, {0, 0}, 4));
  ASSERT_OK(clients[1]->Push(ones, {1, 1}, 4));
  ASSERT_OK(clients[0]->Leave(absl::Seconds(5), /*finished=*/true));
  // Range 1's backup (in process 0) has it before process 1 is lost.
  EXPECT_TRUE(pair.servers[0]->backup_state()->HasLeft(0));
  pair.servers[1]->Shutdown(absl::ZeroDuration());
  pair.servers[1].reset();
  ASSERT_OK(clients[1]->Reconnect(absl::Seconds(10), absl::Seconds(5)));
  ASSERT_OK(clients[1]->Push(ones, {2, 2}, 4));
  ASSERT_OK(clients[1]->Leave(absl::Seconds(5), /*finished=*/true));
  // Process 1 is not started again: the finisher, which made no call that
  // would have followed range 1, closes it where it is served.
  ASSERT_OK(finisher->CloseRun(absl::Seconds(5)));
  EXPECT_TRUE(pair.servers[0]->backup_state()->run_closed().HasBeenNotified());
  EXPECT_TRUE(pair.servers[0]->RunClosedEverywhereServed());
}

// One worker's sync run on two replicated shards, training the blobs for
// 20 epochs (400 steps); with `kill_at`, shard 1's process is lost (shut
// down at once) once its range reaches that version. The worker's final
// weights.
std::vector<float> TrainOneSyncWorker(const TrainingConfig& config,
                                      int64_t kill_at,
                                      worker::WorkerResult* result) {
  ReplicatedPair pair(config, {}, /*num_workers=*/1);
  if (pair.servers.size() != 2) return {};
  const worker::Dataset train = testutil::Blobs(400, 1);
  std::unique_ptr<worker::ComputeBackend> backend = worker::MakeCpuBackend(1);
  absl::StatusOr<std::unique_ptr<worker::Model>> model = worker::Model::Create(
      backend.get(), common::ModelLayout::FromConfig(config),
      config.batch_size());
  EXPECT_TRUE(model.ok()) << model.status();
  worker::PsClientOptions options = pair.Client(config, 0);
  options.num_workers = 1;
  absl::StatusOr<std::unique_ptr<worker::PsClient>> client =
      worker::PsClient::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  if (!model.ok() || !client.ok()) return {};
  worker::WorkerCounters counters;
  worker::WorkerContext context;
  context.config = config;
  context.rank = 0;
  context.num_workers = 1;
  context.train = &train;
  context.model = model->get();
  context.client = client->get();
  context.rendezvous = client->get();
  context.log_interval = absl::ZeroDuration();
  context.counters = &counters;
  worker::PlaceWorker(**client, config, /*resume=*/false, &context);
  // The kill lands while the worker trains, most often with a step in
  // flight: it comes once the range reaches `kill_at`, and the worker holds
  // at the end of step kill_at + 50 until it has come, so that a starved
  // test thread cannot let the run end first (the test would then pass
  // with nothing failed over).
  absl::Notification killed;
  if (kill_at > 0) {
    testutil::HoldAtStep(&context, kill_at + 50, [&killed, kill_at] {
      EXPECT_TRUE(killed.WaitForNotificationWithTimeout(absl::Minutes(1)))
          << "the worker waited a minute at step " << kill_at + 50
          << " for shard 1's process to be lost";
    });
  }
  std::unique_ptr<worker::TrainingLoop> loop =
      worker::MakeTrainingLoop(config.mode());
  absl::StatusOr<worker::WorkerResult> trained =
      absl::UnknownError("not run");
  std::thread training([&] { trained = loop->Run(context); });
  if (kill_at > 0) {
    while (pair.servers[1]->state()->version() < kill_at) {
      absl::SleepFor(absl::Microseconds(200));
    }
    pair.servers[1]->Shutdown(absl::ZeroDuration());
    killed.Notify();
  }
  training.join();
  EXPECT_TRUE(trained.ok()) << trained.status();
  if (!trained.ok()) return {};
  // The backup took the range over, once.
  EXPECT_EQ((*client)->ledger().take_overs, kill_at > 0 ? 1 : 0);
  *result = *trained;
  std::vector<float> params(common::ModelLayout::FromConfig(config).num_params());
  EXPECT_OK((*model)->GetParams(absl::MakeSpan(params)));
  return params;
}

// Sync with one worker: losing a shard's process changes nothing. The
// range's backup has every step the worker was answered; the worker sends
// the step that was in flight again as it was (not recomputed on the other
// shard's newer weights), so the weights come out as without the failure,
// bit for bit, and so does every step's loss. With 1-bit pushes and pulls
// too: the copy that takes over has quantized every step as the primary
// did (the same residual), so the worker's 1-bit pulls go on from it.
class OneSyncWorker : public ::testing::TestWithParam<const char*> {};

TEST_P(OneSyncWorker, EndsBitForBitAsWithoutTheFailure) {
  const TrainingConfig config = ResolvedConfig(absl::StrCat(
      "layer_sizes: [20, 16, 10] batch_size: 20 epochs: 20 seed: 3 "
      "mode: SYNC learning_rate: 0.05 momentum: 0.9 ",
      GetParam()));
  worker::WorkerResult clean_result;
  const std::vector<float> clean = TrainOneSyncWorker(config, 0, &clean_result);
  ASSERT_FALSE(clean.empty());
  for (int64_t kill_at : {57, 211}) {
    SCOPED_TRACE(kill_at);
    worker::WorkerResult result;
    const std::vector<float> failed =
        TrainOneSyncWorker(config, kill_at, &result);
    ASSERT_EQ(failed.size(), clean.size());
    EXPECT_EQ(result.steps, 400);
    EXPECT_EQ(result.samples, 8000);
    EXPECT_EQ(result.last_loss, clean_result.last_loss);  // the last step's
    size_t differ = 0;
    for (size_t i = 0; i < clean.size(); ++i) {
      if (std::memcmp(&clean[i], &failed[i], sizeof(float)) != 0) ++differ;
    }
    EXPECT_EQ(differ, 0u) << "of " << clean.size();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, OneSyncWorker,
    ::testing::Values("",
                      "compression: COMPRESSION_ONEBIT "
                      "pull_compression: COMPRESSION_ONEBIT "
                      "onebit_bucket_size: 64",
                      "pull_compression: COMPRESSION_ONEBIT "
                      "onebit_bucket_size: 64",
                      "compression: COMPRESSION_ONEBIT "
                      "onebit_bucket_size: 64"));

// Sync with 1-bit pulls: each step's update is quantized with a residual
// that both copies of a range carry (StepPullEncoder), and the step's
// weights are the quantized ones. A process restarted after a failure gets
// the residual with its copy (RepairResponse.pull_residual), so that the
// two copies go on quantizing alike: after the repair and three more steps
// they hold the same weights and residual, bit for bit.
TEST(ReplicationTest, SyncCompressedPullsResidualIsCopiedByARepair) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [3, 2] mode: SYNC optimizer: SGD learning_rate: 0.1 "
      "momentum: 0.9 pull_compression: COMPRESSION_ONEBIT "
      "onebit_bucket_size: 2");
  ReplicatedPair pair(config, {}, /*num_workers=*/1);
  ASSERT_EQ(pair.servers.size(), 2u);
  worker::PsClientOptions options = pair.Client(config, 0);
  options.num_workers = 1;
  std::vector<std::unique_ptr<worker::PsClient>> clients;
  ASSERT_OK_AND_ASSIGN(clients.emplace_back(),
                       worker::PsClient::Connect(options));
  // Values of several magnitudes in each bucket of 2: the 1-bit encoding
  // loses something at every step.
  auto values = [](int64_t k) {
    std::vector<std::vector<float>> v(1, std::vector<float>(8));
    for (size_t i = 0; i < 8; ++i) v[0][i] = 0.1f * (i * i + 1) - 0.3f * k;
    return v;
  };
  for (int k = 0; k < 3; ++k) ASSERT_OK(SyncStep(clients, k, values(k)));
  pair.servers[1]->Shutdown(absl::ZeroDuration());
  pair.servers[1].reset();
  EXPECT_THAT(SyncStep(clients, 3, values(3)),
              StatusIs(absl::StatusCode::kUnavailable));
  ASSERT_OK(clients[0]->Reconnect(absl::Seconds(10), absl::Seconds(5)));
  ASSERT_OK(
      SyncStep(clients, 3, values(3), {clients[0]->initial_versions()[0], 3}));
  ASSERT_OK(SyncStep(clients, 4, values(4),
                     {pair.servers[0]->state()->version(), 4}));

  ShardServerOptions again = Replicated(config, 1, pair.addresses, pair.ports);
  again.num_workers = 1;
  ASSERT_OK_AND_ASSIGN(pair.servers[1], ShardServer::Start(again));
  ShardServer* zero = pair.servers[0].get();
  ShardServer* one = pair.servers[1].get();
  ASSERT_EQ(one->replication()->repairs(), 1);
  ASSERT_EQ(one->backup_replication()->repairs(), 1);
  for (int k = 5; k < 8; ++k) ASSERT_OK(SyncStep(clients, k, values(k)));
  // Range 1 is served by process 0 (its backup copy, which took it over),
  // range 0 by process 0 too; process 1 holds both backups.
  const std::vector<std::pair<UpdateRule*, UpdateRule*>> copies = {
      {zero->rule(), one->backup_rule()}, {zero->backup_rule(), one->rule()}};
  for (const auto& [primary, backup] : copies) {
    EXPECT_EQ(primary->SaveState().version, 8);
    EXPECT_EQ(backup->SaveState().version, 8);
    EXPECT_THAT(Values(backup), ElementsAreArray(Values(primary)));
    const std::vector<float> residual = primary->SaveState().pull_residual;
    ASSERT_EQ(residual.size(), 4u);
    EXPECT_THAT(backup->SaveState().pull_residual, ElementsAreArray(residual));
    // Not all zero: the steps' encodings did lose something.
    EXPECT_NE(residual, std::vector<float>(4, 0.0f));
  }
}

// Delay compensation: a worker's stale push is applied as g + lambda * g *
// g * (w_now - w_pulled), and only the range's primary saw the worker's
// pull. The primary forwards the gradient it applied, so that the backup's
// copy is the same, and is what serves the range once its process is lost.
// Plain SGD at 0.5, lambda 0.5: rank 1's push of ones takes 0.5 off every
// weight, then rank 0's push of ones, computed before it, is compensated
// to 1 + 0.5 * (-0.5) = 0.75 and takes 0.375. In onebit too, whose push
// of ones decodes to ones: the primary forwards the compensated gradient
// as float32, not the push's bits.
class DelayCompensated : public ::testing::TestWithParam<const char*> {};

TEST_P(DelayCompensated, IsAppliedAlikeOnBothCopies) {
  const bool onebit = std::string(GetParam()) == "ONEBIT";
  const TrainingConfig config = ResolvedConfig(
      absl::StrCat("layer_sizes: [3, 2] mode: ", GetParam(),
                   " optimizer: SGD learning_rate: 0.5 momentum: 0 "
                   "delay_compensation: 0.5"));
  ReplicatedPair pair(config);
  ASSERT_EQ(pair.servers.size(), 2u);
  std::vector<std::unique_ptr<worker::PsClient>> clients =
      TwoClients(pair, config);
  ASSERT_EQ(clients.size(), 2u);
  const std::vector<float> initial0 = Values(pair.servers[0]->rule());
  const std::vector<float> initial1 = Values(pair.servers[1]->rule());
  std::vector<float> params(8, 0.0f);
  std::vector<int64_t> versions;
  ASSERT_OK(clients[0]->Pull(0, absl::Seconds(10), absl::MakeSpan(params),
                             &versions));
  ASSERT_OK(clients[1]->Pull(0, absl::Seconds(10), absl::MakeSpan(params),
                             &versions));
  const std::vector<float> ones(8, 1.0f);
  std::unique_ptr<worker::ComputeBackend> cpu = worker::MakeCpuBackend(1);
  ASSERT_OK_AND_ASSIGN(float* device, cpu->AllocateFloats(8));
  ASSERT_OK(cpu->CopyToDevice(ones.data(), device, 8 * sizeof(float)));
  std::vector<std::unique_ptr<worker::GradientPusher>> pushers;
  for (auto& client : clients) {
    ASSERT_OK_AND_ASSIGN(
        pushers.emplace_back(),
        worker::GradientPusher::Create(cpu.get(), client.get(), config));
  }
  // A push of ones from version 0, as the mode's workers push it.
  auto push = [&](int rank) -> absl::Status {
    if (!onebit) return clients[rank]->Push(ones, {0, 0}, 4);
    absl::StatusOr<std::unique_ptr<worker::PendingCall>> call =
        pushers[rank]->Push(device, {0, 0}, 4, /*sample_offset=*/0);
    return call.ok() ? (*call)->Wait() : call.status();
  };
  ASSERT_OK(push(1));
  ASSERT_OK(push(0));
  cpu->Free(device);
  for (int s = 0; s < 2; ++s) {
    SCOPED_TRACE(s);
    const std::vector<float> primary = Values(pair.servers[s]->rule());
    const std::vector<float>& initial = s == 0 ? initial0 : initial1;
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_FLOAT_EQ(primary[i], initial[i] - 0.5f - 0.375f) << i;
    }
    EXPECT_THAT(Values(pair.servers[1 - s]->backup_rule()),
                ElementsAreArray(primary));
  }
  // Process 1 is lost: range 1 goes on from process 0's copy, as it was.
  const std::vector<float> range1 = Values(pair.servers[1]->rule());
  pair.servers[1]->Shutdown(absl::ZeroDuration());
  pair.servers[1].reset();
  ASSERT_OK(clients[0]->Reconnect(absl::Seconds(10), absl::Seconds(5)));
  ASSERT_OK(clients[0]->Pull(0, absl::Seconds(10), absl::MakeSpan(params),
                             &versions));
  EXPECT_THAT(std::vector<float>(params.begin() + 4, params.end()),
              ElementsAreArray(range1));
}

INSTANTIATE_TEST_SUITE_P(Modes, DelayCompensated,
                         ::testing::Values("DOWNPOUR", "ONEBIT"));

// Bounded staleness: a worker's clock is the examples a range has applied
// from it, which its backup applies too, so the bound holds on where the
// range moves. Rank 0 three steps ahead of rank 1 with max_staleness 1:
// its pull waits on the copy that took range 1 over, until rank 1 pushes.
TEST(ReplicationTest, TheStalenessBoundHoldsOnTheCopyThatTookOver) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [3, 2] mode: DOWNPOUR optimizer: SGD learning_rate: 0.5 "
      "momentum: 0 batch_size: 4 max_staleness: 1");
  ReplicatedPair pair(config);
  ASSERT_EQ(pair.servers.size(), 2u);
  std::vector<std::unique_ptr<worker::PsClient>> clients =
      TwoClients(pair, config);
  ASSERT_EQ(clients.size(), 2u);
  const std::vector<float> ones(8, 1.0f);
  ASSERT_OK(clients[1]->Push(ones, {0, 0}, 4));
  for (int k = 1; k < 4; ++k) ASSERT_OK(clients[0]->Push(ones, {k, k}, 4));
  pair.servers[1]->Shutdown(absl::ZeroDuration());
  pair.servers[1].reset();
  for (auto& client : clients) {
    ASSERT_OK(client->Reconnect(absl::Seconds(10), absl::Seconds(5)));
  }
  ShardState* taken = pair.servers[0]->backup_state();
  EXPECT_EQ(taken->version(), 4);
  std::vector<float> params(8, 0.0f);
  std::vector<int64_t> versions;
  absl::Status pulled = absl::UnknownError("not yet");
  absl::Notification done;
  std::thread pull([&] {
    pulled = clients[0]->Pull(0, absl::Seconds(30), absl::MakeSpan(params),
                              &versions);
    done.Notify();
  });
  // The pull waits on both ranges, range 1's at the copy that took it over.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (taken->NumWaiting() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(taken->NumWaiting(), 1u);
  EXPECT_THAT(taken->DescribeClockWaits(absl::Now()),
              ElementsAre("rank 0 at step 3 waits for rank 1 at step 1"));
  EXPECT_FALSE(done.HasBeenNotified());
  // Rank 1's next step brings it within 1 of rank 0: the pull goes ahead.
  ASSERT_OK(clients[1]->Push(ones, {4, 4}, 4));
  pull.join();
  ASSERT_OK(pulled);
  EXPECT_EQ(versions, (std::vector<int64_t>{5, 5}));
  EXPECT_EQ(taken->NumWaiting(), 0u);
}

// A forwarded update of range 0 (4 values of `value`, rank 0's examples
// [offset, offset + 4)) as Replicate sends it: one chunk.
PushChunk Forwarded(int64_t seq, int64_t epoch, int64_t offset, float value) {
  PushChunk chunk;
  PushHeader* h = chunk.mutable_header();
  h->set_worker_rank(0);
  h->set_shard(0);
  h->set_length(4);
  h->set_samples(4);
  h->set_encoding(ENCODING_FLOAT32);
  h->set_sample_offset(offset);
  h->set_replica_seq(seq);
  h->set_replica_epoch(epoch);
  const std::vector<float> values(4, value);
  chunk.set_offset(0);
  chunk.set_data(values.data(), values.size() * sizeof(float));
  return chunk;
}

// A Replicate call to `address` for range 0, as a primary opens one.
struct ReplicateCall {
  explicit ReplicateCall(const std::string& address)
      : stub(ParameterService::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {
    context.AddMetadata(common::kRangeMetadataKey, "0");
    stream = stub->Replicate(&context);
  }
  // The next acknowledgement, as (seq, code).
  std::pair<int64_t, int> Ack() {
    ReplicaAck ack;
    if (!stream->Read(&ack)) return {-1, -1};
    return {ack.replica_seq(), ack.code()};
  }
  std::unique_ptr<ParameterService::Stub> stub;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<PushChunk, ReplicaAck>> stream;
};

TEST(ReplicationTest, ForwardsOnACallAreAppliedInTheirOrderEachOnce) {
  const TrainingConfig config = PlainSgd();
  ReplicatedPair pair(config);
  ASSERT_EQ(pair.servers.size(), 2u);
  const std::vector<float> before = Values(pair.servers[1]->backup_rule());
  ReplicateCall call(pair.addresses[1]);  // range 0's backup
  // Update 2 comes first: it waits for update 1, and both are answered
  // once 1 is in, in their order.
  ASSERT_TRUE(call.stream->Write(Forwarded(2, 1, 4, 1.0f)));
  ASSERT_TRUE(call.stream->Write(Forwarded(1, 1, 0, 1.0f)));
  EXPECT_EQ(call.Ack(), std::make_pair(int64_t{1}, 0));
  EXPECT_EQ(call.Ack(), std::make_pair(int64_t{2}, 0));
  EXPECT_EQ(pair.servers[1]->backup_state()->version(), 2);
  std::vector<float> expected = before;
  for (float& w : expected) w -= 2 * 0.5f;
  EXPECT_THAT(Values(pair.servers[1]->backup_rule()),
              ElementsAreArray(expected));
  // Update 2 sent again: answered as applied, not applied again.
  ASSERT_TRUE(call.stream->Write(Forwarded(2, 1, 4, 1.0f)));
  EXPECT_EQ(call.Ack(), std::make_pair(int64_t{2}, 0));
  // From another epoch: its sender is fenced.
  ASSERT_TRUE(call.stream->Write(Forwarded(3, 2, 8, 1.0f)));
  EXPECT_EQ(
      call.Ack(),
      std::make_pair(int64_t{3},
                     static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION)));
  EXPECT_EQ(pair.servers[1]->backup_state()->version(), 2);
  EXPECT_THAT(Values(pair.servers[1]->backup_rule()),
              ElementsAreArray(expected));
  // The primary ends its side: the call ends OK.
  ASSERT_TRUE(call.stream->WritesDone());
  EXPECT_EQ(call.Ack(), std::make_pair(int64_t{-1}, -1));
  EXPECT_TRUE(call.stream->Finish().ok());
}

TEST(ReplicationTest, AWorkersPushOnTheForwardingCallIsRefused) {
  const TrainingConfig config = PlainSgd();
  ReplicatedPair pair(config);
  ASSERT_EQ(pair.servers.size(), 2u);
  ReplicateCall call(pair.addresses[1]);
  PushChunk push = Forwarded(1, 1, 0, 1.0f);
  push.mutable_header()->clear_replica_seq();
  push.mutable_header()->clear_replica_epoch();
  call.stream->Write(push);
  EXPECT_EQ(call.Ack(), std::make_pair(int64_t{-1}, -1));
  const grpc::Status status = call.stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("forwarded updates only"));
  EXPECT_EQ(pair.servers[1]->backup_state()->version(), 0);
}

TEST(ReplicationTest, AStoppingBackupEndsTheCallsForwardedToIt) {
  const TrainingConfig config = PlainSgd();
  ReplicatedPair pair(config);
  ASSERT_EQ(pair.servers.size(), 2u);
  ReplicateCall call(pair.addresses[1]);
  ASSERT_TRUE(call.stream->Write(Forwarded(1, 1, 0, 1.0f)));
  EXPECT_EQ(call.Ack(), std::make_pair(int64_t{1}, 0));
  // The call stays open for the run; a stopping process ends it rather
  // than wait out its grace for it.
  pair.servers[1]->Shutdown(absl::Hours(1));
  EXPECT_EQ(call.Ack(), std::make_pair(int64_t{-1}, -1));
  const grpc::Status status = call.stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr("process is stopping"));
}

// A table's rows, its optimizer state and admission counts, as bytes.
std::string RowsOf(const ShardSparseTables* tables) {
  return tables->tables()[0]->Snapshot(tables->buckets()).SerializeAsString();
}

// Sparse tables: a row push is applied on the range's backup before it is
// acknowledged, with the rank's number, so that the copy that takes the
// range over holds every acknowledged push and answers one sent again as a
// repeat; the process that comes back copies the rows (and what was
// pushed meanwhile) and follows again.
TEST(ReplicationTest, RowPushesReachTheBackupAndATakeOverAndARepairKeepThem) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [3, 2] mode: DOWNPOUR optimizer: SGD learning_rate: 0.5 "
      "momentum: 0 sparse_buckets: 64 sparse_tables { name: 'emb' dim: 2 "
      "optimizer: SPARSE_ROWWISE_ADAGRAD max_rows: 100 }");
  ReplicatedPair pair(config);
  ASSERT_EQ(pair.servers.size(), 2u);
  absl::StatusOr<std::unique_ptr<worker::PsClient>> client =
      worker::PsClient::Connect(pair.Client(config, 0));
  ASSERT_TRUE(client.ok()) << client.status();
  // An id of each range.
  uint64_t ids[2] = {0, 0};
  for (int range = 0; range < 2; ++range) {
    while (common::ShardOfId(ids[range], 64, 2) != range) ++ids[range];
  }
  const std::vector<uint64_t> both = {ids[0], ids[1]};
  const std::vector<float> grads = {1, -1, 0.5f, 2};
  auto copies_agree = [&](int pushes) {
    for (int range = 0; range < 2; ++range) {
      const ShardSparseTables* primary = pair.servers[range]->sparse_tables();
      const ShardSparseTables* backup =
          pair.servers[(range + 1) % 2]->backup_sparse_tables();
      EXPECT_EQ(primary->row_pushes(), pushes) << "range " << range;
      EXPECT_EQ(backup->row_pushes(), pushes) << "range " << range;
      EXPECT_EQ(RowsOf(primary), RowsOf(backup)) << "range " << range;
    }
  };
  uint64_t last_seq = 0;
  for (int k = 1; k <= 3; ++k) {
    last_seq = (*client)->NextRowPushSeq();
    ASSERT_OK((*client)->SparsePush("emb", both, grads, absl::Seconds(10),
                                    nullptr, nullptr, last_seq));
    copies_agree(k);
  }
  std::vector<float> before(4);
  ASSERT_OK((*client)->SparsePull("emb", both, absl::MakeSpan(before),
                                  absl::Seconds(10)));

  // Process 1 dies: the last push, sent again as if its answer had been
  // lost, is a repeat on the copy that takes range 1 over.
  pair.servers[1]->Shutdown(absl::ZeroDuration());
  pair.servers[1].reset();
  int ride_outs = 0;
  const worker::PsClient::RideOut ride_out = [&](const absl::Status& lost) {
    ++ride_outs;
    EXPECT_THAT(lost, StatusIs(absl::StatusCode::kUnavailable));
    return (*client)->Reconnect(absl::Seconds(10), absl::Seconds(5));
  };
  SparsePushResponse answer;
  ASSERT_OK((*client)->SparsePush("emb", both, grads, absl::Seconds(10),
                                  &answer, ride_out, last_seq));
  EXPECT_EQ(ride_outs, 1);
  EXPECT_TRUE(answer.repeat());
  EXPECT_EQ(answer.updated(), 0);
  std::vector<float> after(4);
  ASSERT_OK((*client)->SparsePull("emb", both, absl::MakeSpan(after),
                                  absl::Seconds(10), ride_out));
  EXPECT_THAT(after, ElementsAreArray(before));
  EXPECT_EQ(pair.servers[0]->backup_replication()->role(),
            Replication::Role::kDegraded);
  // Two more, applied where each range is served now.
  for (int k = 0; k < 2; ++k) {
    ASSERT_OK((*client)->SparsePush("emb", both, grads, absl::Seconds(10),
                                    &answer, ride_out));
    EXPECT_EQ(answer.updated(), 2);
  }
  EXPECT_EQ(pair.servers[0]->sparse_tables()->row_pushes(), 5);
  EXPECT_EQ(pair.servers[0]->backup_sparse_tables()->row_pushes(), 5);

  // Process 1 comes back: both its copies are repaired, rows included.
  absl::StatusOr<std::unique_ptr<ShardServer>> back =
      ShardServer::Start(Replicated(config, 1, pair.addresses, pair.ports));
  ASSERT_TRUE(back.ok()) << back.status();
  pair.servers[1] = *std::move(back);
  EXPECT_EQ(pair.servers[1]->backup_replication()->repairs(), 1);
  EXPECT_EQ(pair.servers[1]->replication()->repairs(), 1);
  // Range 1 is served by process 0 still, its copy back home.
  EXPECT_EQ(RowsOf(pair.servers[1]->sparse_tables()),
            RowsOf(pair.servers[0]->backup_sparse_tables()));
  EXPECT_EQ(RowsOf(pair.servers[1]->backup_sparse_tables()),
            RowsOf(pair.servers[0]->sparse_tables()));
  ASSERT_OK((*client)->SparsePush("emb", both, grads, absl::Seconds(10),
                                  &answer, ride_out));
  EXPECT_EQ(answer.updated(), 2);
  EXPECT_EQ(pair.servers[1]->sparse_tables()->row_pushes(), 6);
  EXPECT_EQ(pair.servers[1]->backup_sparse_tables()->row_pushes(), 6);
  EXPECT_EQ(RowsOf(pair.servers[1]->sparse_tables()),
            RowsOf(pair.servers[0]->backup_sparse_tables()));
  EXPECT_EQ(RowsOf(pair.servers[1]->backup_sparse_tables()),
            RowsOf(pair.servers[0]->sparse_tables()));
  EXPECT_EQ(ride_outs, 1);
}

// A primary that went on without its backup tells it so also when only rows
// are pushed: else the backup, partitioned away and back, would go on
// believing it follows, would never be repaired, and would take the range
// over with rows older than those acknowledged.
TEST(ReplicationTest, APartitionHealsIntoProtectionAgainWhenOnlyRowsArePushed) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [3, 2] mode: DOWNPOUR optimizer: SGD learning_rate: 0.5 "
      "momentum: 0 sparse_buckets: 64 sparse_tables { name: 'emb' dim: 2 "
      "optimizer: SPARSE_SGD max_rows: 100 }");
  PartitionablePair pair(config);
  ASSERT_TRUE(pair.ready());
  testutil::TcpProxy& to_backup = *pair.to_backup;
  std::vector<std::unique_ptr<ShardServer>>& servers = pair.servers;
  std::unique_ptr<worker::PsClient>* client = &pair.client;
  uint64_t id = 0;  // a row of range 0
  while (common::ShardOfId(id, 64, 2) != 0) ++id;
  const std::vector<float> grads = {1, -1};
  auto push = [&] {
    return (*client)->SparsePush("emb", {id}, grads, absl::Seconds(10));
  };
  ASSERT_OK(push());
  const ShardSparseTables* primary = servers[0]->sparse_tables();
  const ShardSparseTables* backup = servers[1]->backup_sparse_tables();
  EXPECT_EQ(backup->row_pushes(), 1);

  to_backup.Freeze();
  ASSERT_OK(push());  // once the backup is given up
  EXPECT_EQ(servers[0]->replication()->role(), Replication::Role::kDegraded);
  ASSERT_OK(push());
  EXPECT_EQ(primary->row_pushes(), 3);
  EXPECT_LT(backup->row_pushes(), 3);

  to_backup.Thaw();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  int64_t pushes = 3;
  while (absl::Now() < deadline &&
         (servers[1]->backup_replication()->repairs() == 0 ||
          servers[0]->replication()->role() != Replication::Role::kPrimary)) {
    ASSERT_OK(push());
    ++pushes;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(servers[1]->backup_replication()->repairs(), 1);
  EXPECT_EQ(servers[0]->replication()->role(), Replication::Role::kPrimary);
  ASSERT_OK(push());
  ++pushes;
  EXPECT_EQ(primary->row_pushes(), pushes);
  EXPECT_EQ(backup->row_pushes(), pushes);
  EXPECT_EQ(RowsOf(backup), RowsOf(primary));
  // Plain SGD at 0.5 from the row's initial values: every push moved it by
  // (-0.5, 0.5), on both copies.
  std::vector<float> row(2);
  ASSERT_OK((*client)->SparsePull("emb", {id}, absl::MakeSpan(row),
                                  absl::Seconds(10)));
  std::vector<float> initial(2);
  primary->tables()[0]->InitialRow(id, absl::MakeSpan(initial));
  EXPECT_FLOAT_EQ(row[0], initial[0] - 0.5f * static_cast<float>(pushes));
  EXPECT_FLOAT_EQ(row[1], initial[1] + 0.5f * static_cast<float>(pushes));
}

TEST(ReplicationTest, WhatIsNotReplicatedYetIsRefusedWithTheReason) {
  const std::vector<std::string> servers = {"127.0.0.1:1", "127.0.0.1:2"};
  ShardServerOptions allreduce =
      Replicated(ResolvedConfig("layer_sizes: [3, 2] mode: ALLREDUCE"), 0,
                 servers, {0, 0});
  EXPECT_THAT(ShardServer::Start(allreduce).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not built for mode allreduce")));
  ShardServerOptions no_servers =
      Replicated(PlainSgd(), 0, {}, {0, 0});
  EXPECT_THAT(ShardServer::Start(no_servers).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("needs --servers")));
  ShardServerOptions one = Replicated(PlainSgd(), 0, {"127.0.0.1:1"}, {0});
  EXPECT_THAT(ShardServer::Start(one).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("at least 2 shards")));
}

}  // namespace
}  // namespace monsoon::server
