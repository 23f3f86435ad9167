// Elastic workers (TrainingConfig.elastic): a cluster in one process whose
// workers join and leave while it trains, in every mode; the data handed
// out by shard 0's queue is all trained, and what the shards' ledgers
// applied adds up.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/model_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard_server.h"
#include "tests/blobs.h"
#include "tests/local_shards.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"
#include "tests/worker_hold.h"
#include "worker/cpu_backend.h"
#include "worker/dataset.h"
#include "worker/model/model.h"
#include "worker/ps_client.h"
#include "worker/training_loop.h"
#include "worker/worker_counters.h"

namespace monsoon {
namespace {

using ::monsoon::testutil::ResolvedConfig;
using ::monsoon::testutil::StatusIs;
using ::testing::Each;
using ::testing::HasSubstr;

constexpr int kShards = 2;
constexpr int kMaxWorkers = 4;
// 400 examples in batches of 20: 20 batches per epoch, in data shards of 2.
constexpr int kExamples = 400;
constexpr int kBatch = 20;
constexpr int kEpochs = 10;

// One worker thread: its own backend, model, client and loop.
struct Worker {
  std::unique_ptr<worker::ComputeBackend> backend;
  std::unique_ptr<worker::Model> model;
  std::unique_ptr<worker::PsClient> client;
  std::unique_ptr<worker::TrainingLoop> loop;
  worker::WorkerContext context;
  worker::WorkerCounters counters;
  absl::Notification stop;
  absl::once_flag stop_once;
  absl::StatusOr<worker::WorkerResult> result =
      absl::UnknownError("not run");
  std::thread thread;

  int64_t steps() const { return counters.steps.load(); }
  // Notifies `stop`, once whoever calls first.
  void Stop() {
    absl::call_once(stop_once, [this] { stop.Notify(); });
  }
};

// A mode and the options it runs with.
struct Variant {
  Mode mode;
  const char* options;
  const char* name;
};

class ElasticTest : public testing::TestWithParam<Variant> {
 protected:
  ElasticTest() : train_(testutil::Blobs(kExamples, 1)) {}
  // A test that failed half-way leaves no worker's thread running.
  ~ElasticTest() override {
    for (Worker& w : workers_) {
      w.Stop();
      if (w.thread.joinable()) w.thread.join();
    }
  }

  TrainingConfig Config() const {
    return ResolvedConfig(absl::StrCat(
        "layer_sizes: [20, 16, 10] mode: ", Mode_Name(GetParam().mode),
        " batch_size: ", kBatch, " epochs: ", kEpochs,
        " seed: 3 chunk_bytes: 262144 call_timeout_s: 60 elastic: true "
        "data_shard_batches: 2 ",
        GetParam().options));
  }

  void StartServers(const TrainingConfig& config) {
    servers_ = testutil::StartLocalShards(config, kShards, kMaxWorkers);
    ASSERT_EQ(servers_.size(), static_cast<size_t>(kShards));
  }

  // Connects rank `rank` and starts its loop on a thread; `customize`, if
  // set, sees its context first.
  void Start(
      const TrainingConfig& config, int rank,
      const std::function<void(worker::WorkerContext*)>& customize = nullptr) {
    Worker& w = workers_[rank];
    w.backend = worker::MakeCpuBackend(1);
    ASSERT_OK_AND_ASSIGN(
        w.model, worker::Model::Create(w.backend.get(),
                                       common::ModelLayout::FromConfig(config),
                                       config.batch_size()));
    worker::PsClientOptions options =
        testutil::ClientOptions(servers_, config, rank);
    options.num_workers = kMaxWorkers;
    ASSERT_OK_AND_ASSIGN(w.client, worker::PsClient::Connect(options));
    w.loop = worker::MakeTrainingLoop(config.mode());
    ASSERT_NE(w.loop, nullptr);
    w.context.config = config;
    w.context.rank = rank;
    w.context.num_workers = kMaxWorkers;
    w.context.train = &train_;
    w.context.model = w.model.get();
    w.context.client = w.client.get();
    w.context.log_interval = absl::ZeroDuration();
    w.context.counters = &w.counters;
    w.context.stop = &w.stop;
    worker::PlaceWorker(*w.client, config, /*resume=*/true, &w.context);
    if (customize) customize(&w.context);
    w.thread = std::thread([&w] { w.result = w.loop->Run(w.context); });
  }

  // Waits (up to a minute) until `done` holds; a test failure if not.
  static void AwaitUntil(const std::function<bool()>& done,
                         const std::string& what) {
    const absl::Time deadline = absl::Now() + absl::Minutes(1);
    while (!done()) {
      ASSERT_LT(absl::Now(), deadline) << "waited a minute for " << what;
      absl::SleepFor(absl::Milliseconds(1));
    }
  }

  void Join(int rank) {
    if (workers_[rank].thread.joinable()) workers_[rank].thread.join();
  }

  const worker::Dataset train_;
  std::vector<std::unique_ptr<server::ShardServer>> servers_;
  Worker workers_[kMaxWorkers];
};

TEST_P(ElasticTest, EveryExampleIsTrainedWhileWorkersJoinLeaveAndDie) {
  const TrainingConfig config = Config();
  ASSERT_NO_FATAL_FAILURE(StartServers(config));
  // Rank 2 joins once ranks 0 and 1 have made 10 steps; rank 1 leaves
  // cleanly once rank 2 has made 5, and rank 0 dies once rank 2 has made
  // 10 (it stops calling: its lease runs out, as a SIGKILLed worker's
  // does). The two decide at the end of each step, and wait there, so that
  // timing cannot reorder these events: left to it, ranks 0 and 1 once
  // trained all 200 batches in 0.2 s while this thread started rank 2,
  // which found the queue empty; and with rank 2 held up 0.3 s after its
  // second step they trained all the rest before it made its fifth.
  // - At step 10, each waits until rank 2 holds a data shard.
  // - After it, each waits while it is more than kLead steps ahead of
  //   rank 2, until rank 2 has made the steps that end its part: in sync
  //   they are about 10 apart (the barrier), so only the asynchronous
  //   modes wait there.
  constexpr int kLead = 20;
  auto part = [this](worker::WorkerContext* context, int64_t rank2_steps) {
    Worker* self = &workers_[context->rank];
    testutil::AtEachStep(context, [this, self, rank = context->rank,
                                   rank2_steps](int step) {
      if (step < 10 || self->stop.HasBeenNotified()) return;
      const absl::Time deadline = absl::Now() + absl::Minutes(1);
      while (true) {
        const int64_t rank2 = workers_[2].steps();
        if (step == 10) {
          const StatsResponse stats = servers_[0]->state()->Stats();
          for (const DataShardRef& shard : stats.data_queue().in_flight()) {
            if (shard.rank() == 2) return;
          }
        } else if (rank2 >= rank2_steps) {
          self->Stop();
          return;
        } else if (step <= rank2 + kLead) {
          return;
        }
        if (absl::Now() > deadline) {
          ADD_FAILURE() << "rank " << rank << " waited a minute at its step "
                        << step << " for rank 2, at step " << rank2;
          return;
        }
        absl::SleepFor(absl::Milliseconds(1));
      }
    });
  };
  ASSERT_NO_FATAL_FAILURE(Start(config, 0, [&](worker::WorkerContext* c) {
    part(c, /*rank2_steps=*/10);
  }));
  ASSERT_NO_FATAL_FAILURE(Start(config, 1, [&](worker::WorkerContext* c) {
    part(c, /*rank2_steps=*/5);
  }));
  ASSERT_NO_FATAL_FAILURE(AwaitUntil(
      [&] { return workers_[0].steps() + workers_[1].steps() >= 10; },
      "10 steps of ranks 0 and 1"));
  ASSERT_NO_FATAL_FAILURE(Start(config, 2));
  Join(1);
  ASSERT_OK(workers_[1].client->Leave(absl::Seconds(10)));
  Join(0);
  Join(2);
  EXPECT_GE(workers_[2].steps(), 10);

  EXPECT_THAT(workers_[0].result, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT(workers_[1].result, StatusIs(absl::StatusCode::kCancelled));
  ASSERT_OK(workers_[2].result.status());
  ASSERT_OK(workers_[2].client->Leave(absl::Seconds(10), /*finished=*/true));

  const StatsResponse first = servers_[0]->state()->Stats();
  const DataQueueState& queue = first.data_queue();
  EXPECT_EQ(queue.batches_per_epoch(), kExamples / kBatch);
  // Every epoch's examples, each data shard done once.
  EXPECT_EQ(queue.done_size(), kEpochs * kExamples / kBatch / 2);
  EXPECT_THAT(queue.examples_trained(), Each(kExamples));
  EXPECT_EQ(queue.examples_trained().size(), kEpochs);
  EXPECT_TRUE(queue.in_flight().empty());
  EXPECT_TRUE(queue.put_back().empty());
  // Rank 1's shards (it left) and rank 0's (its lease ran out) that the
  // ledger did not hold went back to the queue: what they held, and in
  // easgd what they trained since their last exchange.
  EXPECT_GE(queue.shards_requeued(), 1);
  // The ledger applied every done shard's examples once, and those of the
  // shards put back that their first workers had pushed (trained twice):
  // no more, no less. With backup workers, the examples of a push whose
  // step closed without it are skipped instead (as in a fixed run).
  int64_t applied = 0;
  for (const auto& [rank, samples] : first.samples_applied_by_worker()) {
    applied += samples;
  }
  int64_t skipped = 0;
  for (const auto& [rank, samples] : first.samples_skipped_by_worker()) {
    skipped += samples;
  }
  EXPECT_EQ(applied + skipped,
            int64_t{kEpochs} * kExamples + queue.examples_trained_twice())
      << first.DebugString();
  if (config.backup_workers() == 0) {
    EXPECT_EQ(skipped, 0);
  } else {
    // Two members close a step with the first push: there are late ones.
    EXPECT_GT(first.backup_dropped_pushes(), 0);
    EXPECT_EQ(skipped, first.backup_dropped_pushes() * kBatch);
  }
  // Membership: 3 joins, and a leave, a lease run out and a finish (a
  // live rank waiting at the other shard's barrier for the dead one may
  // also let its lease here run out, and join again when it calls).
  EXPECT_GE(first.joins(), 3);
  EXPECT_EQ(first.leaves(), first.joins());
  EXPECT_EQ(first.membership_epoch(), first.joins() + first.leaves());
  EXPECT_TRUE(first.live_ranks().empty());
  EXPECT_TRUE(first.workers_finished());
  for (const auto& server : servers_) {
    EXPECT_TRUE(server->state()->WorkersFinished()) << server->address();
  }

  // The run is over: a new rank may not join it.
  worker::PsClientOptions options =
      testutil::ClientOptions(servers_, config, /*rank=*/3);
  options.num_workers = kMaxWorkers;
  EXPECT_THAT(worker::PsClient::Connect(options),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("cannot join")));
}

// hogwild runs under bounded staleness: its joiner's clock starts at the
// slowest member's. Backup workers count the live members; compressed
// pulls keep a copy per worker from its first pull until it leaves.
INSTANTIATE_TEST_SUITE_P(
    Modes, ElasticTest,
    testing::Values(Variant{SYNC, "", "sync"},
                    Variant{DOWNPOUR, "", "downpour"},
                    Variant{ONEBIT, "", "onebit"},
                    Variant{HOGWILD, "max_staleness: 2", "hogwild"},
                    Variant{EASGD, "", "easgd"},
                    Variant{SYNC, "backup_workers: 1", "sync_backup_workers"},
                    Variant{DOWNPOUR, "pull_compression: COMPRESSION_ONEBIT",
                            "downpour_compressed_pulls"},
                    Variant{SYNC, "pull_compression: COMPRESSION_ONEBIT",
                            "sync_compressed_pulls"}),
    [](const testing::TestParamInfo<Variant>& info) {
      return std::string(info.param.name);
    });

TEST(ElasticQueueTest, ARunThatIsNotElasticHasNoQueue) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [20, 16, 10] mode: DOWNPOUR batch_size: 20 epochs: 1 "
      "seed: 3");
  testutil::LocalCluster cluster(config, kShards, /*num_workers=*/1);
  ASSERT_NE(cluster.client, nullptr);
  EXPECT_THAT(cluster.client->TakeData(kExamples, std::nullopt, 0,
                                       absl::Seconds(10)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("split the data by rank")));
}

TEST(ElasticQueueTest, AWorkerWithAnotherTrainingSetIsRefused) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [20, 16, 10] mode: DOWNPOUR batch_size: 20 epochs: 1 "
      "seed: 3 elastic: true");
  testutil::LocalCluster cluster(config, kShards, /*num_workers=*/2);
  ASSERT_NE(cluster.client, nullptr);
  ASSERT_OK_AND_ASSIGN(TakeDataResponse first,
                       cluster.client->TakeData(kExamples, std::nullopt, 0,
                                                absl::Seconds(10)));
  EXPECT_EQ(first.kind(), TakeDataResponse::SHARD);
  EXPECT_EQ(first.batches(), 8);  // the default data shard
  EXPECT_EQ(first.batches_per_epoch(), 20);
  worker::PsClientOptions options =
      testutil::ClientOptions(cluster.servers, config, /*rank=*/1);
  options.num_workers = 2;
  ASSERT_OK_AND_ASSIGN(auto other, worker::PsClient::Connect(options));
  EXPECT_THAT(other->TakeData(kExamples - 40, std::nullopt, 0,
                              absl::Seconds(10)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("give every worker the same data")));
}

}  // namespace
}  // namespace monsoon
