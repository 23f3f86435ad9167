#include "server/data_queue.h"

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace monsoon::server {
namespace {

using ::monsoon::testutil::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Kind = DataQueue::Kind;

// 43 examples in batches of 4: 10 whole batches per epoch (3 examples
// left out, as a fixed split leaves them), in data shards of 4 batches:
// [0, 4), [4, 8), [8, 10).
constexpr int64_t kExamples = 43;
constexpr int64_t kBatch = 4;
constexpr int kShardBatches = 4;

// The shard's ledger: each rank's position (its examples applied).
class DataQueueTest : public testing::Test {
 protected:
  std::unique_ptr<DataQueue> Make(int epochs,
                                  int shard_batches = kShardBatches) {
    return std::make_unique<DataQueue>(
        epochs, kBatch, shard_batches,
        [this](int rank) { return ledger_[rank]; });
  }

  // Rank `rank` asks, `done` with the shard it held, its next example
  // numbered `next`.
  DataQueue::Answer Take(DataQueue& queue, int rank,
                         std::optional<DataShard> done, int64_t next) {
    absl::StatusOr<DataQueue::Answer> answer =
        queue.Take(rank, done, next, kExamples);
    EXPECT_TRUE(answer.ok()) << answer.status();
    return answer.ok() ? *answer : DataQueue::Answer{};
  }

  std::map<int, int64_t> ledger_;
};

TEST_F(DataQueueTest, HandsOutEachEpochInShardsOfWholeBatchesThenFinishes) {
  auto queue = Make(/*epochs=*/2);
  std::vector<std::vector<int64_t>> seen;  // epoch, index, first, batches
  std::optional<DataShard> done;
  int64_t next = 0;
  for (int i = 0; i < 6; ++i) {
    DataQueue::Answer answer = Take(*queue, 0, done, next);
    ASSERT_EQ(answer.kind, Kind::kShard);
    seen.push_back({answer.shard.epoch, answer.shard.index,
                    answer.shard.first_batch, answer.shard.batches});
    done = answer.shard;
    next += answer.shard.batches * kBatch;
    ledger_[0] = next;  // its pushes applied
  }
  EXPECT_THAT(seen, ElementsAre(ElementsAre(0, 0, 0, 4), ElementsAre(0, 1, 4, 4),
                                ElementsAre(0, 2, 8, 2), ElementsAre(1, 0, 0, 4),
                                ElementsAre(1, 1, 4, 4),
                                ElementsAre(1, 2, 8, 2)));
  EXPECT_FALSE(queue->Finished());
  EXPECT_EQ(Take(*queue, 0, done, next).kind, Kind::kFinished);
  EXPECT_TRUE(queue->Finished());
  const DataQueue::Counts counts = queue->counts();
  EXPECT_EQ(counts.batches_per_epoch, 10);
  EXPECT_EQ(counts.shards_per_epoch, 3);
  EXPECT_THAT(counts.examples_trained, ElementsAre(40, 40));
  EXPECT_EQ(counts.shards_done, 6);
  EXPECT_EQ(counts.shards_requeued, 0);
  EXPECT_EQ(counts.examples_trained_twice, 0);
}

TEST_F(DataQueueTest, AShardIsDoneOnlyOnceTheLedgerHoldsItsExamples) {
  auto queue = Make(1);
  const DataShard first = Take(*queue, 0, std::nullopt, 100).shard;
  // Trained; 2 of its 4 batches applied so far.
  ledger_[0] = 108;
  Take(*queue, 0, first, 116);
  EXPECT_EQ(queue->counts().shards_done, 0);
  ledger_[0] = 116;
  EXPECT_EQ(queue->counts().shards_done, 1);
  EXPECT_THAT(queue->counts().examples_trained, ElementsAre(16));
}

TEST_F(DataQueueTest, AGoneRanksShardsGoFirstToTheNextAskerCountingWhatWasApplied) {
  auto queue = Make(1);
  const DataShard a = Take(*queue, 0, std::nullopt, 100).shard;
  const DataShard b = Take(*queue, 1, std::nullopt, 0).shard;
  EXPECT_EQ(a.index, 0);
  EXPECT_EQ(b.index, 1);
  // Rank 0's pushes of 2 of its 4 batches were applied before it went.
  ledger_[0] = 108;
  EXPECT_TRUE(queue->Release(0));
  EXPECT_FALSE(queue->Release(0));  // nothing left of it
  EXPECT_THAT(queue->Ranks(), ElementsAre(1));
  ledger_[1] = 16;
  DataQueue::Answer next = Take(*queue, 1, b, 16);
  ASSERT_EQ(next.kind, Kind::kShard);
  EXPECT_EQ(next.shard.index, 0);  // put back: before shard 2
  EXPECT_EQ(next.shard.batches, 4);
  ledger_[1] = 32;
  EXPECT_EQ(Take(*queue, 1, next.shard, 32).shard.index, 2);
  const DataQueue::Counts counts = queue->counts();
  EXPECT_EQ(counts.shards_done, 2);
  EXPECT_EQ(counts.shards_requeued, 1);
  EXPECT_EQ(counts.examples_trained_twice, 8);
}

TEST_F(DataQueueTest, ATrainedShardTheLedgerLacksGoesBackWhenItsWorkerGoes) {
  auto queue = Make(1);
  const DataShard first = Take(*queue, 0, std::nullopt, 0).shard;
  ledger_[0] = 12;  // its last batch's push never arrived
  Take(*queue, 0, first, 16);
  EXPECT_TRUE(queue->Release(0));
  EXPECT_EQ(queue->counts().shards_done, 0);
  EXPECT_EQ(queue->counts().examples_trained_twice, 12);
  EXPECT_EQ(Take(*queue, 1, std::nullopt, 0).shard.index, first.index);
}

TEST_F(DataQueueTest, ARepeatedCallWhoseAnswerWasLostGetsTheSameShard) {
  auto queue = Make(1);
  const DataShard first = Take(*queue, 0, std::nullopt, 0).shard;
  ledger_[0] = 16;
  // A worker names the shard it finished by epoch and index alone.
  const DataShard done{first.epoch, first.index, 0, 0};
  const DataShard second = Take(*queue, 0, done, 16).shard;
  // The answer naming `second` was lost; the worker says again that it
  // finished `first`.
  const DataQueue::Answer again = Take(*queue, 0, done, 16);
  ASSERT_EQ(again.kind, Kind::kShard);
  EXPECT_EQ(again.shard.index, second.index);
  EXPECT_EQ(queue->counts().shards_done, 1);
  EXPECT_THAT(queue->counts().examples_trained, ElementsAre(16));
  EXPECT_EQ(queue->counts().examples_trained_twice, 0);
}

TEST_F(DataQueueTest, AShardFinishedAfterItWasPutBackIsDoneAndNotHandedOutAgain) {
  auto queue = Make(1);
  const DataShard first = Take(*queue, 0, std::nullopt, 0).shard;
  queue->Release(0);  // its lease ran out; it was only slow
  ledger_[0] = 16;
  const DataQueue::Answer next = Take(*queue, 0, first, 16);
  ASSERT_EQ(next.kind, Kind::kShard);
  EXPECT_EQ(next.shard.index, 1);
  EXPECT_EQ(queue->counts().shards_done, 1);
}

TEST_F(DataQueueTest, ASlowRankReleasedMidShardThatFinishesItTrainedNothingTwice) {
  auto queue = Make(1);
  const DataShard first = Take(*queue, 0, std::nullopt, 0).shard;
  ledger_[0] = 8;
  queue->Release(0);  // silent too long: 8 of its examples applied so far
  EXPECT_EQ(queue->counts().examples_trained_twice, 8);
  // It was only slow: it finishes the shard, which no one else took.
  ledger_[0] = 16;
  const DataShard next = Take(*queue, 0, first, 16).shard;
  EXPECT_EQ(next.index, 1);
  const DataQueue::Counts counts = queue->counts();
  EXPECT_EQ(counts.shards_done, 1);
  EXPECT_EQ(counts.shards_requeued, 1);
  EXPECT_EQ(counts.examples_trained_twice, 0);
}

TEST_F(DataQueueTest, AShardDoneTwiceCountsItsSecondCopyAsTrainedTwice) {
  auto queue = Make(1);
  const DataShard first = Take(*queue, 0, std::nullopt, 0).shard;
  queue->Release(0);  // rank 0 is slow, not gone
  const DataShard again = Take(*queue, 1, std::nullopt, 0).shard;
  ASSERT_EQ(again.index, first.index);
  ledger_[1] = 16;
  Take(*queue, 1, again, 16);
  ledger_[0] = 16;
  Take(*queue, 0, first, 16);
  const DataQueue::Counts counts = queue->counts();
  EXPECT_EQ(counts.shards_done, 1);
  EXPECT_EQ(counts.examples_trained_twice, 16);
}

TEST_F(DataQueueTest, WithNothingLeftAWorkerWaitsForOthersInTrainingOrFinishes) {
  auto waits = Make(1, /*shard_batches=*/10);
  const DataShard only = Take(*waits, 0, std::nullopt, 0).shard;
  EXPECT_EQ(Take(*waits, 1, std::nullopt, 0).kind, Kind::kWait);
  waits->Release(0);
  EXPECT_EQ(Take(*waits, 1, std::nullopt, 0).shard.index, only.index);
  // Trained, its pushes not all applied yet: its own last pushes follow.
  EXPECT_EQ(Take(*waits, 1, only, 40).kind, Kind::kFinished);
  EXPECT_FALSE(waits->Finished());
  // Another worker waits for them: rank 1 may go before they arrive.
  EXPECT_EQ(Take(*waits, 2, std::nullopt, 0).kind, Kind::kWait);
  ledger_[1] = 40;
  EXPECT_EQ(Take(*waits, 2, std::nullopt, 0).kind, Kind::kFinished);
  EXPECT_TRUE(waits->Finished());
}

// easgd: a worker's last steps reach the centre only once it leaves its
// loop. Two workers whose last shards wait for that must not wait for each
// other.
TEST_F(DataQueueTest, WorkersWaitingForEachOthersLastPushesDoNotWaitForever) {
  auto queue = Make(1, /*shard_batches=*/5);  // 2 shards of 20 examples
  const DataShard a = Take(*queue, 0, std::nullopt, 0).shard;
  const DataShard b = Take(*queue, 1, std::nullopt, 0).shard;
  EXPECT_EQ(Take(*queue, 0, a, 20).kind, Kind::kWait);   // for rank 1's
  EXPECT_EQ(Take(*queue, 1, b, 20).kind, Kind::kFinished);  // 0 waits
  ledger_[1] = 20;  // rank 1's last steps arrive
  EXPECT_EQ(Take(*queue, 0, std::nullopt, 20).kind, Kind::kFinished);
  ledger_[0] = 20;
  EXPECT_TRUE(queue->Finished());
}

// A worker whose last shard waits for its pushes dies: the others, told to
// wait, take it.
TEST_F(DataQueueTest, AWaitingWorkerTakesTheLastShardOfOneThatDied) {
  auto queue = Make(1, /*shard_batches=*/10);
  const DataShard only = Take(*queue, 0, std::nullopt, 0).shard;
  EXPECT_EQ(Take(*queue, 0, only, 40).kind, Kind::kFinished);
  EXPECT_EQ(Take(*queue, 1, std::nullopt, 0).kind, Kind::kWait);
  ledger_[0] = 36;  // its last push never arrived
  EXPECT_TRUE(queue->Release(0));
  const DataQueue::Answer again = Take(*queue, 1, std::nullopt, 0);
  ASSERT_EQ(again.kind, Kind::kShard);
  EXPECT_EQ(again.shard.index, only.index);
  EXPECT_EQ(queue->counts().examples_trained_twice, 36);
}

TEST_F(DataQueueTest, RefusesAnotherTrainingSetAndShardsThatDoNotExist) {
  auto queue = Make(1);
  Take(*queue, 0, std::nullopt, 0);
  EXPECT_THAT(queue->Take(1, std::nullopt, 0, 80),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("give every worker the same data")));
  EXPECT_THAT(queue->Take(0, DataShard{0, 3, 0, 0}, 0, kExamples),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not exist")));
  auto small = Make(1);
  EXPECT_THAT(small->Take(0, std::nullopt, 0, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("less than one batch")));
}

TEST_F(DataQueueTest, ARestoredQueueHandsOutWhatWasInFlightFirstAndKeepsItsCounts) {
  auto queue = Make(2);
  const DataShard a = Take(*queue, 0, std::nullopt, 0).shard;  // 0/0
  ledger_[0] = 16;
  const DataShard b = Take(*queue, 0, a, 16).shard;  // 0/1 held
  Take(*queue, 1, std::nullopt, 0);                  // 0/2 held
  queue->Release(1);                                 // 0/2 back
  const DataQueueState saved = queue->Save();
  EXPECT_EQ(saved.in_flight_size(), 1);
  EXPECT_EQ(saved.put_back_size(), 1);

  auto restored = Make(2);
  ASSERT_TRUE(restored->Restore(saved).ok());
  // Rank 0 finishes the shard it held before the restart: taken as done
  // once applied.
  ledger_[0] = 32;
  const DataQueue::Answer next = Take(*restored, 0, b, 32);
  ASSERT_EQ(next.kind, Kind::kShard);
  EXPECT_EQ(next.shard.epoch, 0);
  EXPECT_EQ(next.shard.index, 2);
  ledger_[0] = 40;
  const DataQueue::Answer after = Take(*restored, 0, next.shard, 40);
  EXPECT_EQ(after.shard.epoch, 1);
  EXPECT_EQ(after.shard.index, 0);
  const DataQueue::Counts counts = restored->counts();
  EXPECT_EQ(counts.shards_done, 3);
  EXPECT_EQ(counts.shards_requeued, 1);
  EXPECT_THAT(counts.examples_trained, ElementsAre(40, 0));

  EXPECT_THAT(Make(3)->Restore(saved),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("2 epochs")));
  DataQueueState damaged = saved;
  damaged.add_done()->set_index(99);
  EXPECT_THAT(Make(2)->Restore(damaged),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not exist")));
}

}  // namespace
}  // namespace monsoon::server
