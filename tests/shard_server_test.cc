// ShardServer as a service: resuming from a checkpoint, refusing checkpoints
// that are not its own, and the grpc.health.v1 status around Shutdown. Real
// gRPC servers on 127.0.0.1:0; checkpoints in the test's scratch folder.
#include "server/shard_server.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/health.grpc.pb.h"
#include "server/checkpoint.h"
#include "server/update_rule.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace monsoon::server {
namespace {

using ::grpc::health::v1::Health;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::monsoon::testutil::ResolvedConfig;
using ::monsoon::testutil::StatusIs;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// 53 parameters: shard 0 of 2 owns [0, 26), shard 1 [26, 53).
constexpr char kSyncConfig[] =
    "layer_sizes: [6, 5, 3] mode: SYNC optimizer: SGD learning_rate: 0.5 "
    "momentum: 0.9";
constexpr char kDownpourConfig[] =
    "layer_sizes: [6, 5, 3] mode: DOWNPOUR optimizer: ADAGRAD "
    "learning_rate: 0.5";

// A fresh, empty directory per call.
std::string NewDir(const std::string& name) {
  const std::string dir = testutil::TempPath(name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

ShardServerOptions Options(const std::string& config_text, int shard,
                           int num_shards, int num_workers,
                           const std::string& checkpoint_dir) {
  ShardServerOptions options;
  options.config = ResolvedConfig(config_text);
  options.shard = shard;
  options.num_shards = num_shards;
  options.num_workers = num_workers;
  options.listen_address = "127.0.0.1:0";
  options.checkpoint_dir = checkpoint_dir;
  return options;
}

// A push that owns its values; PushData only points at them, for as long
// as the OwnedPush lives.
struct OwnedPush {
  std::vector<float> values;
  PushData data;
  operator PushData() const {  // NOLINT: converts where a push is wanted
    PushData push = data;
    push.values = values;
    return push;
  }
};

// A gradient whose values depend on the step, the worker and the index.
OwnedPush Gradient(size_t size, int64_t base_version, int worker, int step) {
  OwnedPush push;
  push.data.worker_rank = worker;
  push.data.base_version = base_version;
  push.data.samples = 8;
  push.data.sample_offset = 8 * static_cast<int64_t>(step);
  push.data.wire_bytes = static_cast<int64_t>(4 * size);
  for (size_t i = 0; i < size; ++i) {
    push.values.push_back(
        0.01f * static_cast<float>((i * 7 + step * 3 + worker) % 11) - 0.05f);
  }
  return push;
}

void ExpectSameState(const RuleState& a, const RuleState& b) {
  EXPECT_EQ(a.version, b.version);
  EXPECT_THAT(a.weights, ElementsAreArray(b.weights));  // bit for bit
  EXPECT_EQ(a.optimizer, b.optimizer);
  EXPECT_EQ(a.optimizer_state, b.optimizer_state);
}

class CheckpointRoundTripTest : public ::testing::TestWithParam<const char*> {};

TEST_P(CheckpointRoundTripTest,
       ResumedShardHasSameStateAndAppliesNextPushIdentically) {
  const std::string dir = NewDir("round_trip");
  const ShardServerOptions options = Options(GetParam(), 1, 2, 2, dir);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardServer> original,
                       ShardServer::Start(options));
  EXPECT_EQ(original->resumed_version(), -1);
  const size_t size = original->state()->size();
  ASSERT_EQ(size, 27u);
  // Three steps of two workers each.
  for (int step = 0; step < 3; ++step) {
    for (int worker = 0; worker < 2; ++worker) {
      const int64_t base = original->rule()->SaveState().version;
      ASSERT_OK(
          original->rule()->Apply(Gradient(size, base, worker, step)).status());
    }
  }
  original->Shutdown();
  ASSERT_OK(original->SaveCheckpoint());
  EXPECT_EQ(original->checkpoint_path(),
            absl::StrCat(dir, "/shard-1-of-2.ckpt"));
  EXPECT_FALSE(std::filesystem::exists(original->checkpoint_path() + ".tmp"));

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardServer> resumed,
                       ShardServer::Start(options));
  const RuleState before = original->rule()->SaveState();
  EXPECT_GT(before.version, 0);
  EXPECT_FALSE(before.optimizer_state.empty());
  EXPECT_EQ(resumed->resumed_version(), before.version);
  ExpectSameState(resumed->rule()->SaveState(), before);
  const StatsResponse stats = original->state()->Stats();
  const StatsResponse resumed_stats = resumed->state()->Stats();
  EXPECT_EQ(resumed_stats.version(), stats.version());
  EXPECT_EQ(resumed_stats.pushes(), stats.pushes());
  EXPECT_EQ(resumed_stats.samples(), stats.samples());
  EXPECT_EQ(resumed_stats.bytes_pushed(), stats.bytes_pushed());
  EXPECT_THAT(resumed_stats.staleness_counts(),
              ElementsAreArray(stats.staleness_counts()));
  for (int worker = 0; worker < 2; ++worker) {
    EXPECT_GT(original->state()->AppliedSamples(worker), 0);
    EXPECT_EQ(resumed->state()->AppliedSamples(worker),
              original->state()->AppliedSamples(worker));
  }

  // The next step gives the same result on both.
  for (int worker = 0; worker < 2; ++worker) {
    const OwnedPush push = Gradient(size, before.version, worker, 3);
    ASSERT_OK_AND_ASSIGN(PushResult a, original->rule()->Apply(push));
    ASSERT_OK_AND_ASSIGN(PushResult b, resumed->rule()->Apply(push));
    EXPECT_EQ(a.version, b.version);
    EXPECT_EQ(a.staleness, b.staleness);
  }
  ExpectSameState(resumed->rule()->SaveState(), original->rule()->SaveState());
}

INSTANTIATE_TEST_SUITE_P(SgdMomentumAndAdagrad, CheckpointRoundTripTest,
                         ::testing::Values(kSyncConfig, kDownpourConfig));

TEST(ShardServerCheckpointTest, SyncCheckpointMidStepKeepsOnlyCompletedSteps) {
  const std::string dir = NewDir("mid_step");
  const ShardServerOptions options = Options(kSyncConfig, 0, 1, 2, dir);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardServer> original,
                       ShardServer::Start(options));
  const size_t size = original->state()->size();
  ASSERT_OK(original->rule()->Apply(Gradient(size, 0, 0, 0)).status());
  ASSERT_OK(original->rule()->Apply(Gradient(size, 0, 1, 0)).status());
  const RuleState after_step = original->rule()->SaveState();
  ASSERT_EQ(after_step.version, 1);
  // Worker 0's gradient for step 1 is collected, worker 1's is not.
  ASSERT_OK(original->rule()->Apply(Gradient(size, 1, 0, 1)).status());
  original->Shutdown();
  ASSERT_OK(original->SaveCheckpoint());

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardServer> resumed,
                       ShardServer::Start(options));
  ExpectSameState(resumed->rule()->SaveState(), after_step);
  // The dropped gradient is pushed again, not refused as a duplicate.
  ASSERT_OK(resumed->rule()->Apply(Gradient(size, 1, 0, 1)).status());
  ASSERT_OK_AND_ASSIGN(PushResult result,
                       resumed->rule()->Apply(Gradient(size, 1, 1, 1)));
  EXPECT_EQ(result.version, 2);
}

// Writes a checkpoint of shard 0 of 2 under kSyncConfig into `dir`.
std::string WriteShardZeroCheckpoint(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<ShardServer>> server =
      ShardServer::Start(Options(kSyncConfig, 0, 2, 1, dir));
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return "";
  (*server)->Shutdown();
  EXPECT_OK((*server)->SaveCheckpoint());
  return (*server)->checkpoint_path();
}

TEST(ShardServerCheckpointTest, CheckpointOfAnotherConfigIsRefused) {
  const std::string dir = NewDir("other_config");
  WriteShardZeroCheckpoint(dir);
  const std::string other =
      "layer_sizes: [6, 5, 3] mode: SYNC optimizer: SGD learning_rate: 0.25 "
      "momentum: 0.9";
  EXPECT_THAT(
      ShardServer::Start(Options(other, 0, 2, 1, dir)),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               AllOf(HasSubstr("config fingerprint"),
                     HasSubstr("the checkpoint's config -> this "
                               "shard's: learning_rate: 0.5 -> 0.25"))));
}

// The same from a set of another shard count, read to reshard.
TEST(ShardServerCheckpointTest, CheckpointSetOfAnotherConfigIsRefused) {
  const std::string dir = NewDir("other_config_set");
  for (int shard : {0, 1}) {
    absl::StatusOr<std::unique_ptr<ShardServer>> server =
        ShardServer::Start(Options(kSyncConfig, shard, 2, 1, dir));
    ASSERT_TRUE(server.ok()) << server.status();
    (*server)->Shutdown();
    ASSERT_OK((*server)->SaveCheckpoint());
  }
  const std::string other =
      "layer_sizes: [6, 5, 3] mode: SYNC optimizer: SGD learning_rate: 0.5 "
      "momentum: 0.5";
  EXPECT_THAT(ShardServer::Start(Options(other, 0, 1, 1, dir)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("shard-0-of-2.ckpt"),
                             HasSubstr("the checkpoint's config -> this "
                                       "shard's: momentum: 0.9 -> 0.5"))));
}

TEST(ShardServerCheckpointTest, CheckpointOfAnotherShardIsRefused) {
  const std::string dir = NewDir("other_shard");
  const std::string path = WriteShardZeroCheckpoint(dir);
  // As if shard 0's volume were mounted into shard 1's pod.
  std::filesystem::copy_file(path, CheckpointPath(dir, 1, 2));
  EXPECT_THAT(ShardServer::Start(Options(kSyncConfig, 1, 2, 1, dir)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("checkpoint is of shard 0 of 2, but this is "
                                 "shard 1 of 2")));
}

TEST(ShardServerCheckpointTest,
     CheckpointWhoseContentsAreOfAnotherShardCountIsRefused) {
  const std::string dir = NewDir("other_count");
  const std::string path = WriteShardZeroCheckpoint(dir);
  std::filesystem::copy_file(path, CheckpointPath(dir, 0, 3));
  EXPECT_THAT(ShardServer::Start(Options(kSyncConfig, 0, 3, 1, dir)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("checkpoint is of shard 0 of 2, but this is "
                                 "shard 0 of 3")));
}

TEST(ShardServerCheckpointTest, FinalCheckpointOfAFinishedRunIsRefused) {
  const std::string dir = NewDir("finished_run");
  for (int shard : {0, 1}) {
    absl::StatusOr<std::unique_ptr<ShardServer>> server =
        ShardServer::Start(Options(kSyncConfig, shard, 2, 1, dir));
    ASSERT_TRUE(server.ok()) << server.status();
    (*server)->state()->FinishRank(0);
    ASSERT_OK((*server)->state()->CloseRun());
    EXPECT_TRUE((*server)->run_closed().HasBeenNotified());
    (*server)->Shutdown();
    ASSERT_OK((*server)->SaveCheckpoint());
  }
  EXPECT_THAT(
      ShardServer::Start(Options(kSyncConfig, 0, 2, 1, dir)),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("the final checkpoint of a finished run (version 0, "
                         "every worker finished and the results were "
                         "collected); a shard does not resume it. To train "
                         "again, start a new run with an empty "
                         "--checkpoint_dir")));
  // Nor at another shard count (from the set of both shards' files).
  EXPECT_THAT(ShardServer::Start(Options(kSyncConfig, 0, 1, 1, dir)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("the final checkpoint of a finished run")));
}

TEST(ShardServerCheckpointTest, CorruptCheckpointIsDataLoss) {
  const std::string dir = NewDir("corrupt");
  testutil::WriteFile(CheckpointPath(dir, 0, 1), "\xff\xff\xff not a proto");
  EXPECT_THAT(
      ShardServer::Start(Options(kSyncConfig, 0, 1, 1, dir)),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("does not parse")));
}

// A shard's checkpoint written by a server that trained a step, as bytes.
std::string GoodCheckpoint(const std::string& dir) {
  const ShardServerOptions options = Options(kSyncConfig, 0, 1, 1, dir);
  absl::StatusOr<std::unique_ptr<ShardServer>> server =
      ShardServer::Start(options);
  EXPECT_OK(server.status());
  if (!server.ok()) return "";
  const size_t size = (*server)->state()->size();
  EXPECT_OK((*server)->rule()->Apply(Gradient(size, 0, 0, 0)).status());
  EXPECT_OK((*server)->SaveCheckpoint());
  server->reset();
  std::string bytes;
  EXPECT_TRUE(testutil::ReadFile(CheckpointPath(dir, 0, 1), &bytes));
  return bytes;
}

TEST(ShardServerCheckpointTest, ACheckpointWithOneBitFlippedIsDataLoss) {
  const std::string dir = NewDir("bit_flip");
  std::string bytes = GoodCheckpoint(dir);
  ASSERT_GT(bytes.size(), 100u);
  // A bit in the middle of the weights: still a valid proto, wrong bytes.
  bytes[bytes.size() / 2] ^= 0x10;
  testutil::WriteFile(CheckpointPath(dir, 0, 1), bytes);
  EXPECT_THAT(ShardServer::Start(Options(kSyncConfig, 0, 1, 1, dir)),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("its CRC-32 does not match; the file is "
                                 "left as it is")));
  // Left for inspection.
  std::string after;
  ASSERT_TRUE(testutil::ReadFile(CheckpointPath(dir, 0, 1), &after));
  EXPECT_EQ(after, bytes);
}

TEST(ShardServerCheckpointTest, ACheckpointHoldingNaNWeightsIsDataLoss) {
  const std::string dir = NewDir("nan_weights");
  const std::string good = GoodCheckpoint(dir);
  ShardCheckpoint checkpoint;
  ASSERT_TRUE(checkpoint.ParseFromString(good));
  std::string weights = checkpoint.weights();
  const float nan = std::nanf("");
  std::memcpy(weights.data() + 3 * sizeof(float), &nan, sizeof(nan));
  checkpoint.set_weights(weights);
  // Written with a good CRC-32: the values themselves are refused.
  ASSERT_OK(WriteCheckpoint(CheckpointPath(dir, 0, 1), checkpoint));
  EXPECT_THAT(
      ShardServer::Start(Options(kSyncConfig, 0, 1, 1, dir)),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("weight 3 is nan")));
}

// Empty weights and optimizer state once made the reader memcpy from a null
// buffer (undefined, reported by UBSan in tests/fuzz/checkpoint_fuzzer): the
// file reads, and the shard refuses it for its size.
TEST(ShardServerCheckpointTest, ACheckpointWithoutWeightsIsRefusedForItsSize) {
  const std::string dir = NewDir("no_weights");
  ShardCheckpoint checkpoint;
  ASSERT_TRUE(checkpoint.ParseFromString(GoodCheckpoint(dir)));
  checkpoint.clear_weights();
  checkpoint.clear_optimizer_state();
  const std::string path = CheckpointPath(dir, 0, 1);
  ASSERT_OK(WriteCheckpoint(path, checkpoint));
  ASSERT_OK_AND_ASSIGN(std::optional<ShardCheckpoint> read,
                       ReadCheckpoint(path));
  ASSERT_TRUE(read.has_value());
  EXPECT_TRUE(read->weights().empty());
  std::string bytes;
  ASSERT_TRUE(testutil::ReadFile(path, &bytes));
  ASSERT_OK_AND_ASSIGN(ShardCheckpoint parsed, ParseCheckpoint(bytes, path));
  EXPECT_EQ(parsed.SerializeAsString(), read->SerializeAsString());
  EXPECT_THAT(ShardServer::Start(Options(kSyncConfig, 0, 1, 1, dir)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("checkpoint holds 0 bytes of weights")));
}

// Trains `from` shards of kDownpourConfig (Adagrad: per-parameter state)
// for a few pushes, checkpoints them, then starts `to` shards on the same
// directory: together they hold the same weights and optimizer state.
void ExpectReshards(int from, int to) {
  const std::string dir = NewDir(absl::StrCat("reshard_", from, "_to_", to));
  std::vector<float> weights, state;
  int64_t version = 0;
  {
    std::vector<std::unique_ptr<ShardServer>> old;
    for (int s = 0; s < from; ++s) {
      ASSERT_OK_AND_ASSIGN(auto server, ShardServer::Start(Options(
                                            kDownpourConfig, s, from, 2, dir)));
      const size_t size = server->state()->size();
      for (int step = 0; step < 3 + s; ++step) {
        ASSERT_OK(
            server->rule()->Apply(Gradient(size, 0, step % 2, step)).status());
      }
      ASSERT_OK(server->SaveCheckpoint());
      const RuleState saved = server->rule()->SaveState();
      weights.insert(weights.end(), saved.weights.begin(), saved.weights.end());
      std::vector<float> part(saved.optimizer_state.size() / sizeof(float));
      std::memcpy(part.data(), saved.optimizer_state.data(),
                  saved.optimizer_state.size());
      state.insert(state.end(), part.begin(), part.end());
      version = std::max(version, saved.version);
      old.push_back(std::move(server));
    }
  }
  std::vector<float> joined_weights, joined_state;
  for (int s = 0; s < to; ++s) {
    ASSERT_OK_AND_ASSIGN(auto server, ShardServer::Start(Options(
                                          kDownpourConfig, s, to, 2, dir)));
    EXPECT_TRUE(server->resharded());
    EXPECT_GE(server->resumed_version(), 3);
    EXPECT_LE(server->resumed_version(), version);
    const RuleState saved = server->rule()->SaveState();
    joined_weights.insert(joined_weights.end(), saved.weights.begin(),
                          saved.weights.end());
    std::vector<float> part(saved.optimizer_state.size() / sizeof(float));
    std::memcpy(part.data(), saved.optimizer_state.data(),
                saved.optimizer_state.size());
    joined_state.insert(joined_state.end(), part.begin(), part.end());
  }
  EXPECT_THAT(joined_weights, ElementsAreArray(weights));  // bit for bit
  EXPECT_THAT(joined_state, ElementsAreArray(state));
}

TEST(ShardServerCheckpointTest, TwoShardsCheckpointsRestoreIntoThree) {
  ExpectReshards(2, 3);
}

TEST(ShardServerCheckpointTest, ThreeShardsCheckpointsRestoreIntoOne) {
  ExpectReshards(3, 1);
}

TEST(ShardServerCheckpointTest, MissingCheckpointDirIsInvalidArgument) {
  EXPECT_THAT(ShardServer::Start(Options(kSyncConfig, 0, 1, 1,
                                         testutil::TempPath("no/such/dir"))),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is not an existing directory")));
}

TEST(ShardServerOptionsTest, ListenPortOutOfRangeIsRefused) {
  for (const char* listen : {"127.0.0.1:99999", "127.0.0.1:-1", "127.0.0.1",
                             ":5000", "127.0.0.1:abc"}) {
    ShardServerOptions options = Options(kSyncConfig, 0, 1, 1, "");
    options.listen_address = listen;
    EXPECT_THAT(ShardServer::Start(options),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("port from 0 to 65535")))
        << listen;
  }
  EXPECT_OK(CheckListenAddress("0.0.0.0:65535"));
  EXPECT_OK(CheckListenAddress("[::1]:0"));
}

TEST(ShardServerOptionsTest, AUnixSocketPathMustFitASocketAddress) {
  EXPECT_OK(CheckListenAddress("unix:/run/monsoon/ps-0.sock"));
  EXPECT_OK(CheckListenAddress("unix:ps.sock"));
  EXPECT_OK(CheckListenAddress(absl::StrCat("unix:/", std::string(106, 'a'))));
  for (const std::string& listen :
       {std::string("unix:"), absl::StrCat("unix:/", std::string(107, 'a'))}) {
    ShardServerOptions options = Options(kSyncConfig, 0, 1, 1, "");
    options.listen_address = listen;
    EXPECT_THAT(ShardServer::Start(options),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("needs a socket path of 1 to 107 bytes")))
        << listen;
  }
  // A file at the path that is not a socket is left alone, and named.
  char dir[] = "/tmp/monsoon-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = absl::StrCat(dir, "/notes.txt");
  std::ofstream(path) << "kept\n";
  ShardServerOptions options = Options(kSyncConfig, 0, 1, 1, "");
  options.listen_address = absl::StrCat("unix:", path);
  EXPECT_THAT(ShardServer::Start(options),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("any other file at the path is left alone")));
  std::string kept;
  std::ifstream(path) >> kept;
  EXPECT_EQ(kept, "kept");
  std::filesystem::remove_all(dir);
}

TEST(ShardServerOptionsTest, AShardLargerThanTheMachineIsRefusedFirst) {
  // 10^12 parameters: 4 TB of weights alone.
  ShardServerOptions options =
      Options("layer_sizes: [1000000, 1000000, 10] mode: SYNC", 0, 1, 1, "");
  EXPECT_THAT(ShardServer::Start(options),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("MiB of memory this process may use: use "
                                 "more shards, a smaller model, or give the "
                                 "shard more memory")));
}

// Options that keep shard-sized arrays per worker are refused where those
// would not fit, with what they keep: 16.8 million parameters (268 MB of
// shard state, which fits) times 100000 workers does not.
TEST(ShardServerOptionsTest, PerWorkerStateThatDoesNotFitIsRefused) {
  ShardServerOptions options = Options(
      "layer_sizes: [4096, 4096] mode: DOWNPOUR delay_compensation: 0.04", 0, 1,
      100000, "");
  EXPECT_THAT(ShardServer::Start(options),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("delay_compensation keeps each worker's last "
                                 "pulled weights: 1 x 100000 x 16781312")));
  options = Options(
      "layer_sizes: [4096, 4096] mode: ONEBIT "
      "pull_compression: COMPRESSION_ONEBIT",
      0, 1, 100000, "");
  EXPECT_THAT(ShardServer::Start(options),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("pull_compression keeps each worker's copy "
                                 "and residual: 2 x 100000")));
}

TEST(ShardServerOptionsTest, BackupWorkersMustBeFewerThanTheWorkers) {
  EXPECT_THAT(
      ShardServer::Start(Options(
          "layer_sizes: [6, 5, 3] mode: SYNC backup_workers: 2", 0, 1, 2, "")),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("backup_workers must be fewer than the "
                         "workers")));
}

TEST(ShardServerCheckpointTest, SaveWithoutCheckpointDirIsFailedPrecondition) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardServer> server,
                       ShardServer::Start(Options(kSyncConfig, 0, 1, 1, "")));
  server->Shutdown();
  EXPECT_THAT(server->SaveCheckpoint(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no checkpoint directory")));
}

// Records the periodic checkpoints' outcomes and lets a test wait for one
// that satisfies a condition.
class CheckpointLog {
 public:
  std::function<void(const absl::Status&, int64_t)> Callback() {
    return [this](const absl::Status& status, int64_t version) {
      absl::MutexLock lock(&mu_);
      outcomes_.emplace_back(status, version);
      changed_.SignalAll();
    };
  }
  // True once an outcome with `ok` and a version >= min_version (ignored
  // for failures) is recorded, after at most 30 s. (A CondVar rather than
  // Mutex::Await: Await's condition runs on the signalling thread, which
  // ThreadSanitizer cannot follow in Debian's Abseil.)
  bool WaitFor(bool ok, int64_t min_version) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    absl::MutexLock lock(&mu_);
    while (true) {
      for (const auto& [status, version] : outcomes_) {
        if (status.ok() == ok && (!ok || version >= min_version)) return true;
      }
      if (changed_.WaitWithDeadline(&mu_, deadline)) return false;
    }
  }
  void Clear() {
    absl::MutexLock lock(&mu_);
    outcomes_.clear();
  }

 private:
  absl::Mutex mu_;
  absl::CondVar changed_;
  std::vector<std::pair<absl::Status, int64_t>> outcomes_ ABSL_GUARDED_BY(mu_);
};

// A downpour shard (0 of 1) that checkpoints into `dir` every millisecond,
// reporting to `log`.
absl::StatusOr<std::unique_ptr<ShardServer>> StartCheckpointingEveryMillisecond(
    const std::string& dir, CheckpointLog* log) {
  ShardServerOptions options = Options(kDownpourConfig, 0, 1, 1, dir);
  options.checkpoint_interval = absl::Milliseconds(1);
  options.on_periodic_checkpoint = log->Callback();
  return ShardServer::Start(options);
}

TEST(ShardServerCheckpointTest, PeriodicCheckpointWhileServingResumes) {
  const std::string dir = NewDir("periodic");
  CheckpointLog log;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardServer> server,
                       StartCheckpointingEveryMillisecond(dir, &log));
  const size_t size = server->state()->size();
  ASSERT_OK(server->rule()->Apply(Gradient(size, 0, 0, 0)).status());
  ASSERT_OK(server->rule()->Apply(Gradient(size, 1, 0, 1)).status());
  ASSERT_TRUE(log.WaitFor(/*ok=*/true, /*min_version=*/2));
  const RuleState serving = server->rule()->SaveState();
  // Stops the checkpoint thread; no checkpoint is written by Shutdown.
  server->Shutdown();

  ASSERT_OK_AND_ASSIGN(std::optional<ShardCheckpoint> on_disk,
                       ReadCheckpoint(server->checkpoint_path()));
  ASSERT_TRUE(on_disk.has_value());
  EXPECT_EQ(on_disk->version(), 2);
  ShardServerOptions again = Options(kDownpourConfig, 0, 1, 1, dir);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardServer> resumed,
                       ShardServer::Start(again));
  EXPECT_EQ(resumed->resumed_version(), 2);
  ExpectSameState(resumed->rule()->SaveState(), serving);
}

TEST(ShardServerCheckpointTest, FailedPeriodicCheckpointKeepsServingAndOld) {
  CheckpointLog log;
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<ShardServer> server,
      StartCheckpointingEveryMillisecond(NewDir("periodic_failure"), &log));
  ASSERT_TRUE(log.WaitFor(/*ok=*/true, /*min_version=*/0));
  // A directory where the temporary file goes makes every write fail.
  const std::string blocker = server->checkpoint_path() + ".tmp";
  std::filesystem::create_directory(blocker);
  log.Clear();
  ASSERT_TRUE(log.WaitFor(/*ok=*/false, 0));
  // The shard still takes pushes, and the last good checkpoint is intact.
  const size_t size = server->state()->size();
  ASSERT_OK_AND_ASSIGN(PushResult result,
                       server->rule()->Apply(Gradient(size, 0, 0, 0)));
  EXPECT_EQ(result.version, 1);
  ASSERT_OK_AND_ASSIGN(std::optional<ShardCheckpoint> on_disk,
                       ReadCheckpoint(server->checkpoint_path()));
  ASSERT_TRUE(on_disk.has_value());
  EXPECT_EQ(on_disk->version(), 0);
  // Once the obstacle is gone, writes succeed again.
  std::filesystem::remove(blocker);
  ASSERT_TRUE(log.WaitFor(/*ok=*/true, /*min_version=*/1));
  server->Shutdown();
}

TEST(ShardServerHealthTest, ServingUntilShutdownBeginsThenNotServing) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardServer> server,
                       ShardServer::Start(Options(kSyncConfig, 0, 1, 1, "")));
  std::unique_ptr<Health::Stub> health = Health::NewStub(grpc::CreateChannel(
      server->address(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    HealthCheckResponse response;
    ASSERT_TRUE(health->Check(&context, HealthCheckRequest(), &response).ok());
    EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  }
  // A Watch opened before the shutdown sees the status change: Shutdown
  // reports NOT_SERVING before it stops the calls (which it gives up to the
  // grace period to finish; the test ends the Watch as soon as it has seen
  // the change).
  grpc::ClientContext watch_context;
  watch_context.set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> watch =
      health->Watch(&watch_context, HealthCheckRequest());
  HealthCheckResponse update;
  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.status(), HealthCheckResponse::SERVING);

  std::thread shutdown([&server] { server->Shutdown(absl::Seconds(60)); });
  const bool read = watch->Read(&update);
  watch_context.TryCancel();
  watch->Finish().IgnoreError();
  shutdown.join();
  ASSERT_TRUE(read);
  EXPECT_EQ(update.status(), HealthCheckResponse::NOT_SERVING);
}

}  // namespace
}  // namespace monsoon::server
