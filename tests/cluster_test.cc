// A whole cluster in one process: two ShardServers on 127.0.0.1:0, two
// worker threads (each with its own CpuBackend, Model, PsClient and
// TrainingLoop) and an Evaluator, training on a small synthetic data set in
// each implemented mode.
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/model_layout.h"
#include "common/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/metrics.pb.h"
#include "server/shard_server.h"
#include "tests/blobs.h"
#include "tests/local_shards.h"
#include "tests/running_time.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"
#include "tests/worker_hold.h"
#include "worker/cpu_backend.h"
#include "worker/dataset.h"
#include "worker/evaluator.h"
#include "worker/model/model.h"
#include "worker/ps_client.h"
#include "worker/ring.h"
#include "worker/training_loop.h"
#include "worker/worker_counters.h"

namespace monsoon {
namespace {

using ::monsoon::testutil::ResolvedConfig;
using ::monsoon::testutil::StatusIs;

constexpr int kShards = 2;
constexpr int kWorkers = 2;

using ::monsoon::testutil::Blobs;

class ClusterTest : public testing::Test {
 protected:
  ClusterTest() : train_(Blobs(400, 1)), test_(Blobs(200, 2)) {}

  // Starts the shards for `config`.
  void StartServers(const TrainingConfig& config) {
    servers_ = testutil::StartLocalShards(config, kShards, kWorkers);
    ASSERT_EQ(servers_.size(), static_cast<size_t>(kShards));
    for (const auto& server : servers_) addresses_.push_back(server->address());
  }

  absl::StatusOr<std::unique_ptr<worker::PsClient>> Connect(
      const TrainingConfig& config, int rank) {
    worker::PsClientOptions options;
    options.server_addresses = addresses_;
    options.config = config;
    options.worker_rank = rank;
    options.connect_timeout = absl::Seconds(30);
    return worker::PsClient::Connect(options);
  }

  // Trains with a worker thread for each of `ranks` (all kWorkers if
  // empty); results_[rank] gets each one's result.
  // `customize`, if set, sees each worker's context before its loop runs.
  void Train(
      const TrainingConfig& config, bool resume = false,
      std::vector<int> ranks = {},
      const std::function<void(worker::WorkerContext*)>& customize = nullptr) {
    if (ranks.empty()) {
      for (int w = 0; w < kWorkers; ++w) ranks.push_back(w);
    }
    const common::ModelLayout layout = common::ModelLayout::FromConfig(config);
    struct Worker {
      std::unique_ptr<worker::ComputeBackend> backend;
      std::unique_ptr<worker::Model> model;
      std::unique_ptr<worker::PsClient> client;
      std::unique_ptr<worker::TrainingLoop> loop;
      worker::WorkerContext context;
    };
    std::vector<Worker> workers(kWorkers);
    for (int w : ranks) {
      Worker& worker = workers[w];
      // One OpenBLAS thread; set here, before any worker thread runs.
      worker.backend = worker::MakeCpuBackend(1);
      ASSERT_OK_AND_ASSIGN(worker.model,
                           worker::Model::Create(worker.backend.get(), layout,
                                                 config.batch_size()));
      ASSERT_OK_AND_ASSIGN(worker.client, Connect(config, w));
      worker.loop = worker::MakeTrainingLoop(config.mode());
      ASSERT_NE(worker.loop, nullptr);
      worker.context.config = config;
      worker.context.rank = w;
      worker.context.num_workers = kWorkers;
      worker.context.train = &train_;
      worker.context.model = worker.model.get();
      worker.context.client = worker.client.get();
      worker.context.rendezvous = worker.client.get();
      worker.context.log_interval = absl::ZeroDuration();
      worker.context.counters = &counters_[w];
      worker::PlaceWorker(*worker.client, config, resume, &worker.context);
      if (customize) customize(&worker.context);
    }
    results_.assign(kWorkers, absl::StatusOr<worker::WorkerResult>(
                                  absl::UnknownError("not run")));
    std::vector<std::thread> threads;
    for (int w : ranks) {
      threads.emplace_back([this, &workers, w] {
        results_[w] = workers[w].loop->Run(workers[w].context);
      });
    }
    for (std::thread& thread : threads) thread.join();
    final_params_.assign(kWorkers, {});
    for (int w : ranks) {
      final_params_[w].resize(layout.num_params());
      ASSERT_OK(workers[w].model->GetParams(absl::MakeSpan(final_params_[w])));
    }
  }

  std::vector<StatsResponse> ShardStats() {
    std::vector<StatsResponse> stats;
    for (const auto& server : servers_) {
      stats.push_back(server->state()->Stats());
    }
    return stats;
  }

  const worker::Dataset train_;
  const worker::Dataset test_;
  std::vector<std::unique_ptr<server::ShardServer>> servers_;
  std::vector<std::string> addresses_;
  std::vector<absl::StatusOr<worker::WorkerResult>> results_;
  // Each rank's model parameters when its last Train ended.
  std::vector<std::vector<float>> final_params_;
  // Each rank's counters, over every Train of the test.
  std::array<worker::WorkerCounters, kWorkers> counters_;
};

// How often rank `rank` ran each phase, by name (phases never run left out).
std::map<std::string, uint64_t> PhaseCounts(
    const worker::WorkerCounters& counters) {
  std::map<std::string, uint64_t> counts;
  for (int p = 0; p < worker::kNumPhases; ++p) {
    const uint64_t count = counters.phases[p].Read().count;
    if (count > 0)
      counts[worker::PhaseName(static_cast<worker::Phase>(p))] = count;
  }
  return counts;
}

TEST_F(ClusterTest, SyncTrainingLowersTheTestLossInLockstep) {
  // 200 examples per worker in batches of 20: 10 steps per epoch, 40 in all.
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [20, 16, 10] mode: SYNC batch_size: 20 epochs: 4 "
      "seed: 3 chunk_bytes: 262144 call_timeout_s: 60");
  ASSERT_NO_FATAL_FAILURE(StartServers(config));
  auto backend = worker::MakeCpuBackend(1);
  ASSERT_OK_AND_ASSIGN(
      auto model,
      worker::Model::Create(backend.get(),
                            common::ModelLayout::FromConfig(config), 200));
  ASSERT_OK_AND_ASSIGN(auto eval_client, Connect(config, -1));
  worker::Evaluator evaluator(eval_client.get(), model.get(), &test_,
                              absl::Now());
  ASSERT_OK_AND_ASSIGN(EvalPoint before, evaluator.EvaluateNow());
  EXPECT_EQ(before.version(), 0);
  EXPECT_EQ(before.samples(), 0);

  ASSERT_NO_FATAL_FAILURE(Train(config));
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_OK(results_[w].status()) << "worker " << w;
    EXPECT_EQ(results_[w]->steps, 40) << "worker " << w;
    EXPECT_EQ(results_[w]->samples, 800) << "worker " << w;
    // Each step computes, then pushes and pulls in one round trip.
    EXPECT_EQ(
        PhaseCounts(counters_[w]),
        (std::map<std::string, uint64_t>{{"compute", 40}, {"push_pull", 40}}))
        << "worker " << w;
  }

  ASSERT_OK_AND_ASSIGN(EvalPoint after, evaluator.EvaluateNow());
  EXPECT_LT(after.test_loss(), 0.7 * before.test_loss())
      << "before " << before.test_loss() << ", after " << after.test_loss();
  EXPECT_GT(after.test_accuracy(), 0.8);
  // One version per barrier: as many as each worker's steps.
  EXPECT_EQ(after.version(), 40);
  EXPECT_EQ(after.samples(), 2 * 800);
  for (const StatsResponse& stats : ShardStats()) {
    SCOPED_TRACE(stats.shard());
    EXPECT_EQ(stats.version(), 40);
    EXPECT_EQ(stats.pushes(), kWorkers * 40);
    EXPECT_EQ(stats.samples(), kWorkers * 800);
    EXPECT_EQ(stats.rejected_pushes(), 0);
    EXPECT_EQ(stats.staleness_max(), 0);
  }
  for (const auto& server : servers_) {
    // Every push-pull waited at its barrier once; every step applied once.
    EXPECT_EQ(server->state()->barrier_wait_seconds().Read().count,
              static_cast<uint64_t>(kWorkers * 40));
    EXPECT_EQ(server->state()->apply_seconds().Read().count, 40u);
  }
}

// allreduce: the ring's sum of two gradients is the same bits in either
// order, and each worker applies sync's update of the average: the run is
// sync's, bit for bit, on every worker and in the weights rank 0 publishes.
TEST_F(ClusterTest, AllreduceWithTwoWorkersIsSyncBitForBit) {
  const std::string common_config =
      "layer_sizes: [20, 16, 10] batch_size: 20 epochs: 2 seed: 3 "
      "call_timeout_s: 60 weight_decay: 0.001 lr_decay_epochs: 1 "
      "lr_decay_factor: 0.5 mode: ";
  const TrainingConfig sync = ResolvedConfig(common_config + "SYNC");
  ASSERT_NO_FATAL_FAILURE(StartServers(sync));
  ASSERT_NO_FATAL_FAILURE(Train(sync));
  for (int w = 0; w < kWorkers; ++w) ASSERT_OK(results_[w].status());
  const std::vector<float> synced = final_params_[0];
  servers_.clear();
  addresses_.clear();

  const TrainingConfig allreduce = ResolvedConfig(common_config + "ALLREDUCE");
  ASSERT_NO_FATAL_FAILURE(StartServers(allreduce));
  ASSERT_NO_FATAL_FAILURE(Train(allreduce));
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_OK(results_[w].status()) << "worker " << w;
    EXPECT_EQ(results_[w]->steps, 20) << "worker " << w;
    EXPECT_EQ(PhaseCounts(counters_[w]).at("allreduce"), 20) << "worker " << w;
    // 2(N-1)/N of the gradient each step, each way.
    EXPECT_EQ(counters_[w].ring_bytes_sent.load(), 20 * 4 * 506)
        << "worker " << w;
    EXPECT_EQ(final_params_[w].size(), synced.size());
    EXPECT_TRUE(final_params_[w] == synced)
        << "worker " << w << " differs from sync";
  }
  // Rank 0 published the final weights, with every worker's examples.
  ASSERT_OK_AND_ASSIGN(auto reader, Connect(allreduce, -1));
  std::vector<float> published(synced.size());
  std::vector<int64_t> versions;
  ASSERT_OK(reader->Pull(0, absl::Seconds(30), absl::MakeSpan(published),
                         &versions));
  EXPECT_TRUE(published == synced);
  for (const StatsResponse& stats : ShardStats()) {
    SCOPED_TRACE(stats.shard());
    EXPECT_EQ(stats.samples(), kWorkers * 400);
    EXPECT_EQ(stats.rejected_pushes(), 0);
    EXPECT_GE(stats.version(), 1);
    // Only rank 0 publishes.
    EXPECT_EQ(stats.samples_applied_by_worker().size(), 1);
  }
}

// Sync workers push each shard's part as soon as backward has made its
// range final. On [20, 8, 30, 10] (748 parameters) shard 1 holds [374,
// 748), final once the middle layer (from 168) is done: it leaves while
// the first layer's backward runs, every step. The same values go either
// way, so training comes out bit for bit as with pushes after backward.
TEST_F(ClusterTest, SyncPushesDuringBackwardTrainBitForBitAsAfterIt) {
  const std::string common_config =
      "layer_sizes: [20, 8, 30, 10] batch_size: 20 epochs: 2 seed: 3 "
      "call_timeout_s: 60 weight_decay: 0.001 lr_decay_epochs: 1 "
      "lr_decay_factor: 0.5 mode: SYNC ";
  const TrainingConfig after =
      ResolvedConfig(common_config + "push_after_backward: true");
  ASSERT_NO_FATAL_FAILURE(StartServers(after));
  ASSERT_NO_FATAL_FAILURE(Train(after));
  for (int w = 0; w < kWorkers; ++w) ASSERT_OK(results_[w].status());
  const std::vector<float> pushed_after = final_params_[0];
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_EQ(counters_[w].shard_pushes_during_backward.load(), 0);
  }
  servers_.clear();
  addresses_.clear();

  const TrainingConfig during = ResolvedConfig(common_config);
  EXPECT_FALSE(during.has_push_after_backward());
  ASSERT_NO_FATAL_FAILURE(StartServers(during));
  ASSERT_NO_FATAL_FAILURE(Train(during));
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_OK(results_[w].status()) << "worker " << w;
    EXPECT_EQ(results_[w]->steps, 20) << "worker " << w;
    // Shard 1's part, each of the 20 steps.
    EXPECT_EQ(counters_[w].shard_pushes_during_backward.load(), 20)
        << "worker " << w;
    EXPECT_TRUE(final_params_[w] == pushed_after)
        << "worker " << w << " differs from pushes after backward";
  }
  // And training moved the weights.
  const common::ModelLayout layout = common::ModelLayout::FromConfig(during);
  std::vector<float> initial(layout.num_params());
  common::InitialValues(layout, 3, 0, absl::MakeSpan(initial));
  EXPECT_NE(pushed_after, initial);
}

// Downpour (n_push = n_fetch = 1: a push-pull a step) sends each shard's
// part during backward too; with one worker its run is deterministic, and
// the same bit for bit either way.
TEST_F(ClusterTest, DownpourPushesDuringBackwardTrainBitForBitAsAfterIt) {
  const std::string common_config =
      "layer_sizes: [20, 8, 30, 10] batch_size: 20 epochs: 2 seed: 3 "
      "call_timeout_s: 60 weight_decay: 0.001 mode: DOWNPOUR ";
  const TrainingConfig after =
      ResolvedConfig(common_config + "push_after_backward: true");
  ASSERT_NO_FATAL_FAILURE(StartServers(after));
  ASSERT_NO_FATAL_FAILURE(Train(after, /*resume=*/false, /*ranks=*/{0}));
  ASSERT_OK(results_[0].status());
  const std::vector<float> pushed_after = final_params_[0];
  EXPECT_EQ(counters_[0].shard_pushes_during_backward.load(), 0);
  servers_.clear();
  addresses_.clear();

  const TrainingConfig during = ResolvedConfig(common_config);
  ASSERT_NO_FATAL_FAILURE(StartServers(during));
  ASSERT_NO_FATAL_FAILURE(Train(during, /*resume=*/false, /*ranks=*/{0}));
  ASSERT_OK(results_[0].status());
  EXPECT_EQ(results_[0]->steps, 20);
  EXPECT_EQ(counters_[0].shard_pushes_during_backward.load(), 20);
  EXPECT_TRUE(final_params_[0] == pushed_after)
      << "differs from pushes after backward";
}

// A ring member that stops breaks the ring: its peer's next all-reduce
// fails with UNAVAILABLE (not a hang), naming the ring.
TEST_F(ClusterTest, AllreduceEndsWithAnErrorWhenAWorkerStops) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [20, 16, 10] batch_size: 20 epochs: 2 seed: 3 "
      "call_timeout_s: 60 mode: ALLREDUCE");
  ASSERT_NO_FATAL_FAILURE(StartServers(config));
  ASSERT_OK_AND_ASSIGN(auto client0, Connect(config, 0));
  ASSERT_OK_AND_ASSIGN(auto client1, Connect(config, 1));
  std::vector<float> buffer(1000, 1.0f);
  absl::StatusOr<std::unique_ptr<worker::Ring>> ring1;
  std::thread second([&] {
    worker::RingOptions options;
    options.rank = 1;
    options.size = 2;
    options.timeout = absl::Seconds(30);
    ring1 = worker::Ring::Connect(options, client1.get());
  });
  worker::RingOptions options;
  options.rank = 0;
  options.size = 2;
  options.timeout = absl::Seconds(30);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<worker::Ring> ring0,
                       worker::Ring::Connect(options, client0.get()));
  second.join();
  ASSERT_OK(ring1.status());
  ring1->reset();  // worker 1 stops: its sockets close
  testutil::RunningTime allreduce;
  absl::Status status = ring0->Allreduce(absl::MakeSpan(buffer));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable,
                               testing::HasSubstr("breaks the ring")));
  EXPECT_LT(allreduce.Elapsed(), absl::Seconds(20));
}

// A rendezvous in memory, for rings without shards.
class MemoryRendezvous : public worker::RingRendezvous {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    absl::MutexLock lock(&mu_);
    values_[key] = value;
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<std::string>> Get(
      const std::string& key) override {
    absl::MutexLock lock(&mu_);
    auto it = values_.find(key);
    if (it == values_.end()) return std::optional<std::string>();
    return std::optional<std::string>(it->second);
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

// Three members, each with values of its own over several of gloo's
// segments: every member ends with the same bits, the sum (exact here: small
// integers), and counts 2(N-1)/N of the buffer sent.
TEST(RingTest, EveryMemberGetsTheSameSum) {
  constexpr int kMembers = 3;
  constexpr size_t kValues = 300001;  // not a multiple of 3
  MemoryRendezvous rendezvous;
  std::vector<std::vector<float>> values(kMembers);
  std::vector<absl::Status> statuses(kMembers);
  std::vector<int64_t> sent(kMembers);
  std::vector<std::thread> threads;
  for (int r = 0; r < kMembers; ++r) {
    values[r].resize(kValues);
    for (size_t i = 0; i < kValues; ++i) {
      values[r][i] = static_cast<float>((i % 97) * (r + 1));
    }
    threads.emplace_back([&, r] {
      worker::RingOptions options;
      options.rank = r;
      options.size = kMembers;
      options.timeout = absl::Seconds(60);
      absl::StatusOr<std::unique_ptr<worker::Ring>> ring =
          worker::Ring::Connect(options, &rendezvous);
      if (!ring.ok()) {
        statuses[r] = ring.status();
        return;
      }
      statuses[r] = (*ring)->Allreduce(absl::MakeSpan(values[r]));
      sent[r] = (*ring)->bytes_sent();
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int r = 0; r < kMembers; ++r) {
    ASSERT_OK(statuses[r]) << "member " << r;
    EXPECT_TRUE(values[r] == values[0]) << "member " << r;
    EXPECT_EQ(sent[r], 2 * 2 * ((4 * kValues + 2) / 3)) << "member " << r;
  }
  for (size_t i = 0; i < kValues; i += 1009) {
    EXPECT_EQ(values[0][i], static_cast<float>((i % 97) * 6)) << i;
  }
}

// The rendezvous: shard 0 of an allreduce run only, and a key whose worker
// has left reads as unset (a restarted peer must not find an old address).
TEST_F(ClusterTest, RendezvousHidesTheKeysOfWorkersThatLeft) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [20, 16, 10] batch_size: 20 epochs: 1 mode: ALLREDUCE");
  ASSERT_NO_FATAL_FAILURE(StartServers(config));
  ASSERT_OK_AND_ASSIGN(auto client0, Connect(config, 0));
  ASSERT_OK_AND_ASSIGN(auto client1, Connect(config, 1));
  ASSERT_OK(client0->Set("ring/0", "address of 0"));
  ASSERT_OK_AND_ASSIGN(std::optional<std::string> value,
                       client1->Get("ring/0"));
  EXPECT_EQ(value, std::optional<std::string>("address of 0"));
  ASSERT_OK_AND_ASSIGN(value, client1->Get("ring/1"));
  EXPECT_EQ(value, std::nullopt);
  EXPECT_THAT(client0->Set(std::string(300, 'k'), "x"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK(client0->Leave(absl::Seconds(10)));
  ASSERT_OK_AND_ASSIGN(value, client1->Get("ring/0"));
  EXPECT_EQ(value, std::nullopt);

  servers_.clear();
  addresses_.clear();
  const TrainingConfig sync = ResolvedConfig(
      "layer_sizes: [20, 16, 10] batch_size: 20 epochs: 1 mode: SYNC");
  ASSERT_NO_FATAL_FAILURE(StartServers(sync));
  ASSERT_OK_AND_ASSIGN(auto sync_client, Connect(sync, 0));
  EXPECT_THAT(sync_client->Set("ring/0", "x"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       testing::HasSubstr("mode allreduce")));
}

TEST_F(ClusterTest, SyncWorkersRestartedAfterTheirStepsResumeWithNothingLeft) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [20, 16, 10] mode: SYNC batch_size: 20 epochs: 4 "
      "seed: 3 chunk_bytes: 262144 call_timeout_s: 60");
  ASSERT_NO_FATAL_FAILURE(StartServers(config));
  ASSERT_NO_FATAL_FAILURE(Train(config));
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_OK(results_[w].status()) << "worker " << w;
    ASSERT_EQ(results_[w]->steps, 40) << "worker " << w;
  }
  // New processes of the same ranks: the shards have applied all 40 steps
  // (800 examples) of each, so they have nothing left to do.
  ASSERT_NO_FATAL_FAILURE(Train(config, /*resume=*/true));
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_OK(results_[w].status()) << "worker " << w;
    EXPECT_EQ(results_[w]->steps, 0) << "worker " << w;
  }
  for (const StatsResponse& stats : ShardStats()) {
    EXPECT_EQ(stats.version(), 40);
    EXPECT_EQ(stats.samples_applied_by_worker().at(0), 800);
    EXPECT_EQ(stats.samples_applied_by_worker().at(1), 800);
  }
  // Without resuming (--noresume) they train the whole run again.
  ASSERT_NO_FATAL_FAILURE(Train(config, /*resume=*/false));
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_OK(results_[w].status()) << "worker " << w;
    EXPECT_EQ(results_[w]->steps, 40) << "worker " << w;
  }
  for (const StatsResponse& stats : ShardStats()) {
    EXPECT_EQ(stats.version(), 80);
  }
}

TEST_F(ClusterTest, SyncWorkersRestartedMidStepRejoinIt) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [20, 16, 10] mode: SYNC batch_size: 20 epochs: 4 "
      "seed: 3 chunk_bytes: 262144 call_timeout_s: 60");
  ASSERT_NO_FATAL_FAILURE(StartServers(config));
  {
    // Worker 0's step-0 push reaches shard 0 only, then worker 0 dies.
    // Worker 1 pushes step 0 to both shards, which closes the step on
    // shard 0 (version 1) but not on shard 1 (still waiting for worker 0);
    // then worker 1 dies too.
    ASSERT_OK_AND_ASSIGN(auto dying0, Connect(config, 0));
    ASSERT_OK_AND_ASSIGN(auto dying1, Connect(config, 1));
    const std::vector<float> zeros(
        common::ModelLayout::FromConfig(config).num_params(), 0.0f);
    common::BufferLease lease;
    std::unique_ptr<worker::ShardedPush> push =
        dying0->StartPush({0, 0}, 20, /*sample_offset=*/0, &lease, nullptr);
    worker::ShardPayload payload;
    payload.values = dying0->ranges()[0].size();
    payload.data =
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(zeros.data()),
                            payload.values * sizeof(float));
    push->Send(0, payload);
    EXPECT_THAT(push->Wait(), StatusIs(absl::StatusCode::kFailedPrecondition));
    ASSERT_OK(dying1->Push(zeros, {0, 0}, 20));
    const std::vector<StatsResponse> stats = ShardStats();
    ASSERT_EQ(stats[0].version(), 1);
    ASSERT_EQ(stats[1].version(), 0);
  }
  // Worker 0 makes no call for the lease (kTestLease): shard 1 closes step 0
  // with worker 1's gradient alone and skips worker 0's batch for it.
  const absl::Time deadline = absl::Now() + 20 * testutil::kTestLease;
  while (ShardStats()[1].version() == 0) {
    ASSERT_LT(absl::Now(), deadline) << "shard 1 never closed step 0";
    absl::SleepFor(absl::Milliseconds(20));
  }
  {
    const StatsResponse stats = ShardStats()[1];
    EXPECT_EQ(stats.version(), 1);
    EXPECT_EQ(stats.samples_applied_by_worker().at(1), 20);
    EXPECT_EQ(stats.samples_skipped_by_worker().at(0), 20);
    EXPECT_EQ(stats.sample_position_by_worker().at(0), 20);
  }
  // Their replacements find step 0 behind both on every shard and train
  // steps 1 to 39 in lockstep.
  ASSERT_NO_FATAL_FAILURE(Train(config, /*resume=*/true));
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_OK(results_[w].status()) << "worker " << w;
    EXPECT_EQ(results_[w]->steps, 39) << "worker " << w;
  }
  const std::vector<StatsResponse> stats = ShardStats();
  for (const StatsResponse& shard : stats) {
    EXPECT_EQ(shard.version(), 40);
    EXPECT_EQ(shard.samples_applied_by_worker().at(1), 800);
  }
  EXPECT_EQ(stats[0].samples_applied_by_worker().at(0), 800);
  EXPECT_EQ(stats[1].samples_applied_by_worker().at(0), 780);
  EXPECT_EQ(stats[1].samples_skipped_by_worker().at(0), 20);
}

TEST_F(ClusterTest, SyncStepsGoOnWithoutAWorkerWhoseLeaseRanOut) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [20, 16, 10] mode: SYNC batch_size: 20 epochs: 4 "
      "seed: 3 chunk_bytes: 262144 call_timeout_s: 60");
  ASSERT_NO_FATAL_FAILURE(StartServers(config));
  {
    // Worker 0 pushes step 0 to both shards and dies.
    ASSERT_OK_AND_ASSIGN(auto dying, Connect(config, 0));
    const std::vector<float> zeros(
        common::ModelLayout::FromConfig(config).num_params(), 0.0f);
    ASSERT_OK(dying->Push(zeros, {0, 0}, 20));
  }
  // Worker 1 alone: step 0 closes with both gradients, step 1 once worker
  // 0's lease has run out, and the rest as soon as worker 1 pushes them.
  ASSERT_NO_FATAL_FAILURE(Train(config, /*resume=*/false, {1}));
  ASSERT_OK(results_[1].status());
  EXPECT_EQ(results_[1]->steps, 40);
  for (const StatsResponse& stats : ShardStats()) {
    EXPECT_EQ(stats.version(), 40);
    EXPECT_EQ(stats.samples_applied_by_worker().at(0), 20);
    EXPECT_EQ(stats.samples_skipped_by_worker().at(0), 780);
    EXPECT_EQ(stats.sample_position_by_worker().at(0), 800);
    EXPECT_EQ(stats.samples_applied_by_worker().at(1), 800);
    EXPECT_EQ(stats.samples_skipped_by_worker().count(1), 0);
  }
}

TEST_F(ClusterTest, DownpourTrainingLowersTheTestLossWithoutABarrier) {
  // 40 steps per worker; a pull every 2 steps and a push of the gradient
  // summed over 2 steps: 20 pushes per worker.
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [20, 16, 10] mode: DOWNPOUR batch_size: 20 epochs: 4 "
      "n_fetch: 2 n_push: 2 seed: 3 chunk_bytes: 262144");
  ASSERT_NO_FATAL_FAILURE(StartServers(config));
  auto backend = worker::MakeCpuBackend(1);
  ASSERT_OK_AND_ASSIGN(
      auto model,
      worker::Model::Create(backend.get(),
                            common::ModelLayout::FromConfig(config), 200));
  ASSERT_OK_AND_ASSIGN(auto eval_client, Connect(config, -1));
  worker::Evaluator evaluator(eval_client.get(), model.get(), &test_,
                              absl::Now());
  ASSERT_OK_AND_ASSIGN(EvalPoint before, evaluator.EvaluateNow());

  ASSERT_NO_FATAL_FAILURE(Train(config));
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_OK(results_[w].status()) << "worker " << w;
    EXPECT_EQ(results_[w]->steps, 40) << "worker " << w;
    // 40 computations (each with its local step), a pull and a push every
    // 2 steps.
    EXPECT_EQ(PhaseCounts(counters_[w]),
              (std::map<std::string, uint64_t>{
                  {"compute", 40}, {"pull", 20}, {"push", 20}}))
        << "worker " << w;
  }

  ASSERT_OK_AND_ASSIGN(EvalPoint after, evaluator.EvaluateNow());
  EXPECT_LT(after.test_loss(), 0.7 * before.test_loss())
      << "before " << before.test_loss() << ", after " << after.test_loss();
  EXPECT_GT(after.test_accuracy(), 0.8);
  // Every push is applied at once: the version counts the pushes.
  EXPECT_EQ(after.version(), kWorkers * 20);
  EXPECT_EQ(after.samples(), kWorkers * 800);
  for (const StatsResponse& stats : ShardStats()) {
    SCOPED_TRACE(stats.shard());
    EXPECT_EQ(stats.version(), kWorkers * 20);
    EXPECT_EQ(stats.pushes(), kWorkers * 20);
    EXPECT_EQ(stats.samples(), kWorkers * 800);
    EXPECT_EQ(stats.rejected_pushes(), 0);
    int64_t counted = 0;
    for (int64_t count : stats.staleness_counts()) counted += count;
    EXPECT_EQ(counted, kWorkers * 20);
  }
  for (const auto& server : servers_) {
    // No barrier; every push applied by itself.
    EXPECT_EQ(server->state()->barrier_wait_seconds().Read().count, 0u);
    EXPECT_EQ(server->state()->apply_seconds().Read().count,
              static_cast<uint64_t>(kWorkers * 20));
  }
}

// Bounded staleness 0 in downpour: a worker's pull waits until the other has
// pushed the same number of steps, so between a worker's pull and its push
// at most the other worker's push of that step is applied: no push is more
// than 1 version stale. Both finish every step.
TEST_F(ClusterTest, DownpourWithStalenessBoundZeroKeepsPushesAtMostOneStale) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [20, 16, 10] mode: DOWNPOUR batch_size: 20 epochs: 4 "
      "seed: 3 chunk_bytes: 262144 max_staleness: 0");
  ASSERT_NO_FATAL_FAILURE(StartServers(config));
  ASSERT_NO_FATAL_FAILURE(Train(config));
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_OK(results_[w].status()) << "worker " << w;
    EXPECT_EQ(results_[w]->steps, 40) << "worker " << w;
  }
  for (const auto& server : servers_) {
    const StatsResponse stats = server->state()->Stats();
    SCOPED_TRACE(stats.shard());
    EXPECT_EQ(stats.pushes(), kWorkers * 40);
    EXPECT_LE(stats.staleness_max(), 1);
    // Every worker call that waits for the bound is timed: each worker's
    // first pull and its 40 push-pulls.
    EXPECT_EQ(server->state()->staleness_wait_seconds().Read().count,
              static_cast<uint64_t>(kWorkers * 41));
  }
}

// Two-way 1-bit sync (push and pull compression): every worker ends with
// exactly the shards' weights, trained, and pulled a fraction of the bytes
// of a float32 run.
TEST_F(ClusterTest, SyncWithPullCompressionKeepsWorkersEqualToTheShards) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [20, 16, 10] mode: SYNC batch_size: 20 epochs: 4 "
      "seed: 3 chunk_bytes: 262144 call_timeout_s: 60 "
      "compression: COMPRESSION_ONEBIT pull_compression: COMPRESSION_ONEBIT "
      "onebit_bucket_size: 64");
  ASSERT_NO_FATAL_FAILURE(StartServers(config));
  auto backend = worker::MakeCpuBackend(1);
  ASSERT_OK_AND_ASSIGN(
      auto model,
      worker::Model::Create(backend.get(),
                            common::ModelLayout::FromConfig(config), 200));
  ASSERT_OK_AND_ASSIGN(auto eval_client, Connect(config, -1));
  worker::Evaluator evaluator(eval_client.get(), model.get(), &test_,
                              absl::Now());
  ASSERT_OK_AND_ASSIGN(EvalPoint before, evaluator.EvaluateNow());
  ASSERT_NO_FATAL_FAILURE(Train(config));
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_OK(results_[w].status()) << "worker " << w;
    EXPECT_EQ(results_[w]->steps, 40) << "worker " << w;
  }
  ASSERT_OK_AND_ASSIGN(EvalPoint after, evaluator.EvaluateNow());
  EXPECT_LT(after.test_loss(), 0.8 * before.test_loss());
  EXPECT_EQ(after.version(), 40);
  // The shards' weights, pulled in full.
  ASSERT_OK_AND_ASSIGN(auto reader, Connect(config, -1));
  std::vector<float> shards(
      common::ModelLayout::FromConfig(config).num_params());
  std::vector<int64_t> versions;
  ASSERT_OK(
      reader->Pull(40, absl::Seconds(30), absl::MakeSpan(shards), &versions));
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_EQ(final_params_[w], shards) << "worker " << w;
  }
  // Per worker and shard: one full pull and 40 answers of 1-bit
  // differences, far less than 41 float32 ones.
  for (const StatsResponse& stats : ShardStats()) {
    const int64_t float32_pulls =
        kWorkers * 41 * static_cast<int64_t>(shards.size() / 2 * sizeof(float));
    EXPECT_LT(stats.bytes_pulled(), float32_pulls / 4) << stats.shard();
  }
}

// Two-way 1-bit onebit: every pull after the first is a difference from the
// worker's copy; training still lowers the test loss, and the pulled bytes
// are a fraction of float32 pulls'.
TEST_F(ClusterTest, OnebitWithPullCompressionTrainsOnCompressedPulls) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [20, 16, 10] mode: ONEBIT batch_size: 20 epochs: 4 "
      "seed: 3 chunk_bytes: 262144 pull_compression: COMPRESSION_ONEBIT "
      "onebit_bucket_size: 64");
  ASSERT_NO_FATAL_FAILURE(StartServers(config));
  auto backend = worker::MakeCpuBackend(1);
  ASSERT_OK_AND_ASSIGN(
      auto model,
      worker::Model::Create(backend.get(),
                            common::ModelLayout::FromConfig(config), 200));
  ASSERT_OK_AND_ASSIGN(auto eval_client, Connect(config, -1));
  worker::Evaluator evaluator(eval_client.get(), model.get(), &test_,
                              absl::Now());
  ASSERT_OK_AND_ASSIGN(EvalPoint before, evaluator.EvaluateNow());
  ASSERT_NO_FATAL_FAILURE(Train(config));
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_OK(results_[w].status()) << "worker " << w;
    EXPECT_EQ(results_[w]->steps, 40) << "worker " << w;
  }
  ASSERT_OK_AND_ASSIGN(EvalPoint after, evaluator.EvaluateNow());
  EXPECT_LT(after.test_loss(), 0.8 * before.test_loss());
  const size_t params = common::ModelLayout::FromConfig(config).num_params();
  for (const StatsResponse& stats : ShardStats()) {
    EXPECT_EQ(stats.pushes(), kWorkers * 40);
    const int64_t float32_pulls =
        kWorkers * 41 * static_cast<int64_t>(params / 2 * sizeof(float));
    EXPECT_LT(stats.bytes_pulled(), float32_pulls / 4) << stats.shard();
  }
}

// The staleness options compose with 1-bit pushes: onebit with a bound of 2,
// the staleness-aware rate and delay compensation trains every step, lowers
// the test loss, and no push is staler than the bound allows: between a
// worker's pull and its push the other can push at most 2 * 2 + 1 times.
TEST_F(ClusterTest, OnebitComposesWithEveryStalenessOption) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [20, 16, 10] mode: ONEBIT batch_size: 20 epochs: 4 "
      "seed: 3 chunk_bytes: 262144 max_staleness: 2 staleness_lr: true "
      "delay_compensation: 0.04");
  ASSERT_NO_FATAL_FAILURE(StartServers(config));
  auto backend = worker::MakeCpuBackend(1);
  ASSERT_OK_AND_ASSIGN(
      auto model,
      worker::Model::Create(backend.get(),
                            common::ModelLayout::FromConfig(config), 200));
  ASSERT_OK_AND_ASSIGN(auto eval_client, Connect(config, -1));
  worker::Evaluator evaluator(eval_client.get(), model.get(), &test_,
                              absl::Now());
  ASSERT_OK_AND_ASSIGN(EvalPoint before, evaluator.EvaluateNow());
  ASSERT_NO_FATAL_FAILURE(Train(config));
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_OK(results_[w].status()) << "worker " << w;
    EXPECT_EQ(results_[w]->steps, 40) << "worker " << w;
  }
  ASSERT_OK_AND_ASSIGN(EvalPoint after, evaluator.EvaluateNow());
  EXPECT_LT(after.test_loss(), before.test_loss());
  for (const auto& server : servers_) {
    const StatsResponse stats = server->state()->Stats();
    SCOPED_TRACE(stats.shard());
    EXPECT_EQ(stats.pushes(), kWorkers * 40);
    EXPECT_LE(stats.staleness_max(), 5);
    EXPECT_EQ(stats.rejected_pushes(), 0);
  }
}

// A shard dies mid-run (no checkpoint at exit, as under SIGKILL) and comes
// back on its port from its last periodic checkpoint. The workers wait for
// it and finish their run, and no shard applies any batch twice: the shard
// that stayed up counts every example exactly once.
class ShardRestartTest : public ClusterTest,
                         public testing::WithParamInterface<const char*> {};

TEST_P(ShardRestartTest, WorkersRideOutAShardRestartWithNoBatchAppliedTwice) {
  const TrainingConfig config = ResolvedConfig(absl::StrCat(
      "layer_sizes: [20, 16, 10] batch_size: 20 epochs: 200 seed: 3 "
      "chunk_bytes: 262144 call_timeout_s: 60 mode: ",
      GetParam()));
  const std::string dir =
      testutil::TempPath(absl::StrCat("shard_restart_", GetParam()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // The version of shard 1's last periodic checkpoint (-1: none yet),
  // shared with the servers' checkpoint threads, which outlive this body.
  auto checkpointed = std::make_shared<std::atomic<int64_t>>(-1);
  auto start = [&](int s, const std::string& listen)
      -> absl::StatusOr<std::unique_ptr<server::ShardServer>> {
    server::ShardServerOptions options;
    options.config = config;
    options.shard = s;
    options.num_shards = kShards;
    options.num_workers = kWorkers;
    options.listen_address = listen;
    options.checkpoint_dir = dir;
    options.checkpoint_interval = absl::Milliseconds(20);
    if (s == 1) {
      options.on_periodic_checkpoint =
          [checkpointed](const absl::Status& status, int64_t version) {
            if (status.ok()) checkpointed->store(version);
          };
    }
    // No live worker's lease runs out while it waits for the restarted
    // shard, however slow the machine (ThreadSanitizer): a sync step would
    // pass over its batch, which is not what this test is about.
    options.lease = absl::Seconds(60);
    return server::ShardServer::Start(options);
  };
  for (int s = 0; s < kShards; ++s) {
    ASSERT_OK_AND_ASSIGN(auto server, start(s, "127.0.0.1:0"));
    addresses_.push_back(server->address());
    servers_.push_back(std::move(server));
  }
  // Each worker holds at the end of its 300th step until shard 1 has died,
  // so that the workers are still training when it comes back: with the
  // kill left to timing, a fast machine's workers finished first (40
  // epochs once; 200 epochs of sync in 0.5 s, once, with this thread kept
  // off the cores that long), and what the shard took after its
  // checkpoint was lost with nobody left to push it again.
  auto killed = std::make_shared<absl::Notification>();
  auto hold = [killed](worker::WorkerContext* context) {
    testutil::HoldAtStep(context, 300, [killed, rank = context->rank] {
      EXPECT_TRUE(killed->WaitForNotificationWithTimeout(absl::Seconds(60)))
          << "worker " << rank << " waited 60 s at step 300 for shard 1 "
          << "to be killed";
    });
  };
  std::thread training([&] { Train(config, false, {}, hold); });
  // Once shard 1 has taken a part of the run and checkpointed it, it dies
  // (by step 300 of each worker the shard is at version 300 or more, and
  // its checkpoint thread goes on while they hold).
  // (The checkpoint's own version counts, not the file's existence: under
  // ThreadSanitizer on a busy machine the checkpoint thread once had not
  // written again since version 0 when the shard reached 150.)
  while (servers_[1]->state()->version() < 150 || checkpointed->load() < 100) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  const std::string address = servers_[1]->address();
  servers_[1].reset();
  killed->Notify();
  absl::SleepFor(absl::Milliseconds(300));
  absl::StatusOr<std::unique_ptr<server::ShardServer>> back = start(1, address);
  ASSERT_OK(back.status());
  EXPECT_GT((*back)->resumed_version(), 0);
  servers_[1] = *std::move(back);
  training.join();

  // 400 examples, 2 workers: 200 each, 10 steps an epoch, 2000 steps.
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_OK(results_[w].status()) << "worker " << w;
    EXPECT_EQ(results_[w]->steps, 2000) << "worker " << w;
  }
  const std::vector<StatsResponse> stats = ShardStats();
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_EQ(stats[0].samples_applied_by_worker().at(w), 40000) << w;
    EXPECT_EQ(stats[0].sample_position_by_worker().at(w), 40000) << w;
    // The restarted shard lost what came after its checkpoint, and has
    // every example after its return: its count is the truth of its
    // weights.
    EXPECT_LE(stats[1].samples_applied_by_worker().at(w), 40000) << w;
    EXPECT_EQ(stats[1].sample_position_by_worker().at(w), 40000) << w;
  }
  EXPECT_EQ(stats[0].rejected_pushes(), 0);
  // (The codes as a std::map: gtest prints a protobuf Map as raw bytes. The
  // shard's log says why it refused each push.)
  EXPECT_THAT((std::map<std::string, int64_t>(
                  stats[0].rejected_pushes_by_code().begin(),
                  stats[0].rejected_pushes_by_code().end())),
              testing::IsEmpty());

  // And the model trained as well as without the failure.
  auto backend = worker::MakeCpuBackend(1);
  ASSERT_OK_AND_ASSIGN(
      auto model,
      worker::Model::Create(backend.get(),
                            common::ModelLayout::FromConfig(config), 200));
  ASSERT_OK_AND_ASSIGN(auto eval_client, Connect(config, -1));
  worker::Evaluator evaluator(eval_client.get(), model.get(), &test_,
                              absl::Now());
  ASSERT_OK_AND_ASSIGN(EvalPoint after, evaluator.EvaluateNow());
  EXPECT_GE(after.test_accuracy(), 0.85);
}

INSTANTIATE_TEST_SUITE_P(Modes, ShardRestartTest,
                         testing::Values("DOWNPOUR", "SYNC", "ONEBIT"));

// The three other modes, more briefly: each must train, and its shards'
// versions must count what the mode says they count.
struct ModeCase {
  const char* name;
  const char* config;
  int64_t versions;  // per shard after training
  int64_t pushes;    // per shard
};

void PrintTo(const ModeCase& mode, std::ostream* os) { *os << mode.name; }

class OtherModesTest : public ClusterTest,
                       public testing::WithParamInterface<ModeCase> {};

TEST_P(OtherModesTest, TrainingLowersTheTestLoss) {
  const TrainingConfig config = ResolvedConfig(
      absl::StrCat("layer_sizes: [20, 16, 10] batch_size: 20 epochs: 4 "
                   "seed: 3 chunk_bytes: 262144 ",
                   GetParam().config));
  ASSERT_NO_FATAL_FAILURE(StartServers(config));
  auto backend = worker::MakeCpuBackend(1);
  ASSERT_OK_AND_ASSIGN(
      auto model,
      worker::Model::Create(backend.get(),
                            common::ModelLayout::FromConfig(config), 200));
  ASSERT_OK_AND_ASSIGN(auto eval_client, Connect(config, -1));
  worker::Evaluator evaluator(eval_client.get(), model.get(), &test_,
                              absl::Now());
  ASSERT_OK_AND_ASSIGN(EvalPoint before, evaluator.EvaluateNow());

  ASSERT_NO_FATAL_FAILURE(Train(config));
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_OK(results_[w].status()) << "worker " << w;
    EXPECT_EQ(results_[w]->steps, 40) << "worker " << w;
    EXPECT_EQ(results_[w]->samples, 800) << "worker " << w;
  }
  ASSERT_OK_AND_ASSIGN(EvalPoint after, evaluator.EvaluateNow());
  EXPECT_LT(after.test_loss(), 0.7 * before.test_loss())
      << "before " << before.test_loss() << ", after " << after.test_loss();
  EXPECT_GT(after.test_accuracy(), 0.8);
  EXPECT_EQ(after.version(), GetParam().versions);
  EXPECT_EQ(after.samples(), kWorkers * 800);
  for (const StatsResponse& stats : ShardStats()) {
    SCOPED_TRACE(stats.shard());
    EXPECT_EQ(stats.version(), GetParam().versions);
    EXPECT_EQ(stats.pushes(), GetParam().pushes);
    EXPECT_EQ(stats.samples(), kWorkers * 800);
    EXPECT_EQ(stats.rejected_pushes(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, OtherModesTest,
    testing::Values(
        // An exchange with the center every tau = 4 steps: 10 per worker.
        // (The default local rate, 0.01, needs more than 40 steps here.)
        ModeCase{"Easgd", "mode: EASGD local_learning_rate: 0.05",
                 kWorkers * 10, kWorkers * 10},
        // A push per step, applied at once.
        ModeCase{"Hogwild", "mode: HOGWILD", kWorkers * 40, kWorkers * 40},
        // Downpour's loop with 1-bit pushes: a push per step.
        ModeCase{"Onebit", "mode: ONEBIT", kWorkers * 40, kWorkers * 40}),
    [](const testing::TestParamInfo<ModeCase>& info) {
      return std::string(info.param.name);
    });

}  // namespace
}  // namespace monsoon
