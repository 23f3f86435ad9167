#include "server/shard_state.h"

#include <atomic>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/model_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace monsoon::server {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::SizeIs;
using ::testing::UnorderedElementsAre;

const common::ModelLayout& Layout() {
  static const common::ModelLayout* layout = new common::ModelLayout({6, 5, 3});
  return *layout;
}

TEST(ShardStateTest, HoldsItsRangeOfTheInitialValues) {
  ShardState state(Layout(), /*seed=*/3, /*shard=*/1, /*num_shards=*/2);
  EXPECT_EQ(state.shard(), 1);
  EXPECT_EQ(state.num_shards(), 2);
  // 53 parameters: shard 1 of 2 owns [26, 53).
  EXPECT_EQ(state.range().begin, 26u);
  EXPECT_EQ(state.range().end, 53u);
  EXPECT_EQ(state.size(), 27u);
  std::vector<float> expected(27);
  common::InitialValues(Layout(), 3, 26, absl::MakeSpan(expected));
  const WeightsPtr initial = state.InitialWeights();
  EXPECT_EQ(
      std::vector<float>(initial->values().begin(), initial->values().end()),
      expected);
  EXPECT_EQ(initial->version(), 0);
  EXPECT_EQ(state.version(), 0);
}

TEST(ShardStateTest, ThreeShardsHoldTheSameInitialWeightsAsOne) {
  ShardState whole(Layout(), /*seed=*/5, 0, 1);
  const absl::Span<const float> all = whole.InitialWeights()->values();
  const std::vector<float> expected(all.begin(), all.end());
  std::vector<float> joined;
  for (int s = 0; s < 3; ++s) {
    ShardState part(Layout(), 5, s, 3);
    const WeightsPtr weights = part.InitialWeights();
    EXPECT_EQ(part.range().begin, joined.size());
    joined.insert(joined.end(), weights->values().begin(),
                  weights->values().end());
  }
  EXPECT_EQ(joined, expected);
}

TEST(ShardStateTest, WaiterForAVersionAlreadyReachedRunsAtOnce) {
  ShardState state(Layout(), 1, 0, 1);
  int runs = 0;
  EXPECT_EQ(state.WhenVersionAtLeast(0, [&] { ++runs; }), 0u);
  EXPECT_EQ(runs, 1);
}

TEST(ShardStateTest, WaiterIsHandedBackOnlyWhenItsVersionIsReached) {
  ShardState state(Layout(), 1, 0, 1);
  int runs = 0;
  const uint64_t id = state.WhenVersionAtLeast(2, [&] { ++runs; });
  EXPECT_NE(id, 0u);
  EXPECT_THAT(state.AdvanceVersion(1), IsEmpty());
  EXPECT_EQ(state.version(), 1);
  std::vector<ShardState::Waiter> ready = state.AdvanceVersion(2);
  ASSERT_THAT(ready, SizeIs(1));
  // AdvanceVersion hands the waiter back; it is the caller who runs it.
  EXPECT_EQ(runs, 0);
  ready[0]();
  EXPECT_EQ(runs, 1);
  EXPECT_FALSE(state.CancelWaiter(id));
  EXPECT_THAT(state.AdvanceVersion(3), IsEmpty());
}

TEST(ShardStateTest, VersionNeverGoesBack) {
  ShardState state(Layout(), 1, 0, 1);
  state.AdvanceVersion(4);
  state.AdvanceVersion(2);
  EXPECT_EQ(state.version(), 4);
  EXPECT_EQ(state.Stats().version(), 4);
}

TEST(ShardStateTest, CancelledWaiterNeverRuns) {
  ShardState state(Layout(), 1, 0, 1);
  int runs = 0;
  const uint64_t cancelled = state.WhenVersionAtLeast(1, [&] { runs += 1; });
  const uint64_t kept = state.WhenVersionAtLeast(1, [&] { runs += 10; });
  EXPECT_NE(cancelled, kept);
  EXPECT_TRUE(state.CancelWaiter(cancelled));
  EXPECT_FALSE(state.CancelWaiter(cancelled));
  EXPECT_FALSE(state.CancelWaiter(0));
  for (auto& waiter : state.AdvanceVersion(1)) waiter();
  EXPECT_EQ(runs, 10);
}

TEST(ShardStateTest, AWaiterPastItsDeadlineRunsExpiredInstead) {
  ShardState state(Layout(), 1, 0, 1);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  int ready = 0, expired = 0;
  const uint64_t soon = state.WhenVersionAtLeast(
      1, [&] { ready += 1; }, t0 + absl::Seconds(1), [&] { expired += 1; });
  state.WhenVersionAtLeast(
      1, [&] { ready += 10; }, t0 + absl::Seconds(5), [&] { expired += 10; });
  state.WhenVersionAtLeast(1, [&] { ready += 100; });  // no deadline
  EXPECT_EQ(state.NumWaiting(), 3u);
  state.ExpireWaiters(t0);  // none is due
  EXPECT_EQ(expired, 0);
  state.ExpireWaiters(t0 + absl::Seconds(2));
  EXPECT_EQ(expired, 1);
  EXPECT_EQ(state.NumWaiting(), 2u);
  // Expired: it can be neither cancelled nor run any more.
  EXPECT_FALSE(state.CancelWaiter(soon));
  for (auto& waiter : state.AdvanceVersion(1)) waiter();
  EXPECT_EQ(ready, 110);
  state.ExpireWaiters(t0 + absl::Seconds(10));
  EXPECT_EQ(expired, 1);
  EXPECT_EQ(state.NumWaiting(), 0u);
}

TEST(ShardStateTest, StatsCountPushesSamplesBytesAndStaleness) {
  ShardState state(Layout(), 1, 1, 3);
  state.RecordPush(/*staleness=*/0, /*samples=*/10, /*bytes=*/100);
  state.RecordPush(3, 5, 50);
  state.RecordPush(0, 1, 1);
  state.RecordRejectedPush(absl::StatusCode::kInvalidArgument);
  state.RecordRejectedPush(absl::StatusCode::kPermissionDenied);
  state.RecordRejectedPush(absl::StatusCode::kInvalidArgument);
  state.RecordPulledBytes(70);
  state.RecordPulledBytes(7);
  const StatsResponse stats = state.Stats();
  EXPECT_EQ(stats.shard(), 1);
  EXPECT_EQ(stats.version(), 0);
  EXPECT_EQ(stats.pushes(), 3);
  EXPECT_EQ(stats.samples(), 16);
  EXPECT_EQ(stats.bytes_pushed(), 151);
  EXPECT_EQ(stats.bytes_pulled(), 77);
  EXPECT_EQ(stats.rejected_pushes(), 3);
  EXPECT_THAT(stats.rejected_pushes_by_code(),
              UnorderedElementsAre(Pair("INVALID_ARGUMENT", 2),
                                   Pair("PERMISSION_DENIED", 1)));
  EXPECT_EQ(stats.staleness_max(), 3);
  // Trailing empty buckets are trimmed.
  EXPECT_THAT(stats.staleness_counts(), ElementsAre(2, 0, 0, 1));
}

TEST(ShardStateTest, AppliedSamplesPerWorkerSurviveARestoreOfTheStats) {
  ShardState state(Layout(), 1, 0, 1);
  state.RecordAppliedSamples(0, 10);
  state.RecordAppliedSamples(2, 5);
  state.RecordAppliedSamples(0, 3);
  EXPECT_EQ(state.AppliedSamples(0), 13);
  EXPECT_EQ(state.AppliedSamples(1), 0);
  const StatsResponse stats = state.Stats();
  EXPECT_THAT(stats.samples_applied_by_worker(),
              UnorderedElementsAre(Pair(0, 13), Pair(2, 5)));

  ShardState restored(Layout(), 1, 0, 1);
  restored.RecordAppliedSamples(1, 99);  // replaced, not added to
  restored.RestoreStats(stats);
  EXPECT_EQ(restored.AppliedSamples(0), 13);
  EXPECT_EQ(restored.AppliedSamples(1), 0);
  EXPECT_EQ(restored.AppliedSamples(2), 5);
}

// Rejections by code come back from a checkpoint for status codes' names
// only; what an older or damaged file leaves out counts as UNKNOWN.
TEST(ShardStateTest, RejectionsByCodeRestoreOnlyStatusCodes) {
  StatsResponse saved;
  saved.set_rejected_pushes(9);
  (*saved.mutable_rejected_pushes_by_code())["INVALID_ARGUMENT"] = 2;
  (*saved.mutable_rejected_pushes_by_code())["RESOURCE_EXHAUSTED"] = 3;
  (*saved.mutable_rejected_pushes_by_code())["a label of anything"] = 1;
  (*saved.mutable_rejected_pushes_by_code())["PERMISSION_DENIED"] = -4;
  ShardState state(Layout(), 1, 0, 1);
  state.RestoreStats(saved);
  state.RecordRejectedPush(absl::StatusCode::kInvalidArgument);
  const StatsResponse stats = state.Stats();
  EXPECT_EQ(stats.rejected_pushes(), 10);
  EXPECT_THAT(
      stats.rejected_pushes_by_code(),
      UnorderedElementsAre(Pair("INVALID_ARGUMENT", 3),
                           Pair("RESOURCE_EXHAUSTED", 3), Pair("UNKNOWN", 4)));
}

TEST(ShardStateTest, VeryStalePushesShareTheLastBucket) {
  ShardState state(Layout(), 1, 0, 1);
  state.RecordPush(ShardState::kStalenessBuckets - 1, 1, 1);
  state.RecordPush(5000, 1, 1);
  const StatsResponse stats = state.Stats();
  EXPECT_EQ(stats.staleness_max(), 5000);
  ASSERT_EQ(stats.staleness_counts_size(), ShardState::kStalenessBuckets);
  EXPECT_EQ(stats.staleness_counts(ShardState::kStalenessBuckets - 1), 2);
  EXPECT_EQ(stats.staleness_counts(0), 0);
}

TEST(ShardStateTest, NoPushesMeansNoStalenessBuckets) {
  ShardState state(Layout(), 1, 0, 1);
  const StatsResponse stats = state.Stats();
  EXPECT_THAT(stats.staleness_counts(), IsEmpty());
  EXPECT_EQ(stats.pushes(), 0);
}

TEST(ShardStateTest, RunWaitersRunsEveryWaiterBeforeReturning) {
  ShardState state(Layout(), 1, 0, 1);
  for (int round = 0; round < 20; ++round) {
    std::atomic<int> ran{0};
    std::vector<ShardState::Waiter> ready;
    for (int i = 0; i < 5; ++i) ready.push_back([&ran] { ran.fetch_add(1); });
    state.RunWaiters(std::move(ready));
    EXPECT_EQ(ran.load(), 5);
  }
  state.RunWaiters({});  // nothing to run
}

TEST(ShardStateTest, CountersSaturateInsteadOfOverflowing) {
  ShardState state(Layout(), /*seed=*/3, /*shard=*/0, /*num_shards=*/1);
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  state.RecordPush(0, kMax - 1, kMax - 1);
  state.RecordPush(0, 5, 5);
  state.RecordAppliedSamples(0, kMax);
  state.RecordAppliedSamples(0, kMax);
  state.SkipSamples(1, kMax);
  state.SkipSamples(1, 1);
  const StatsResponse stats = state.Stats();
  EXPECT_EQ(stats.pushes(), 2);
  EXPECT_EQ(stats.samples(), kMax);
  EXPECT_EQ(stats.bytes_pushed(), kMax);
  EXPECT_EQ(stats.samples_applied_by_worker().at(0), kMax);
  EXPECT_EQ(stats.samples_skipped_by_worker().at(1), kMax);
  EXPECT_EQ(stats.sample_position_by_worker().at(1), kMax);
}

// A registered rank whose lease runs out is reported once, and again only
// after it called in between; ranks that left or never registered are not.
TEST(ShardStateTest, ALapsedLeaseIsReportedOnceUntilTheRankCallsAgain) {
  ShardState state(Layout(), 1, 0, 1);
  state.set_lease(absl::Seconds(10));
  ASSERT_TRUE(state.OpenSession(0, 11).ok());
  ASSERT_TRUE(state.OpenSession(1, 12).ok());
  ASSERT_TRUE(state.OpenSession(2, 13).ok());
  state.EndSession(2, 13);
  state.Touch(3);  // calls without registering
  const absl::Time now = absl::Now();
  EXPECT_THAT(state.NewlyLapsed(now), IsEmpty());
  const auto lapsed = state.NewlyLapsed(now + absl::Seconds(60));
  ASSERT_THAT(lapsed, SizeIs(2));
  EXPECT_EQ(lapsed[0].first, 0);
  EXPECT_EQ(lapsed[1].first, 1);
  // Silent for at least the 60 s ahead less the time the test took.
  EXPECT_GE(lapsed[0].second, absl::Seconds(50));
  EXPECT_THAT(state.NewlyLapsed(now + absl::Seconds(70)), IsEmpty());
  state.Touch(1);
  const auto again = state.NewlyLapsed(absl::Now() + absl::Seconds(60));
  ASSERT_THAT(again, SizeIs(1));
  EXPECT_EQ(again[0].first, 1);
}

// Time the shard's process did not run (ForgiveStall) does not count
// against a lease: a rank silent for 60 s of which the shard ran 5 is live
// (lease 10 s), and lapses once the shard has run 10 s since its call.
TEST(ShardStateTest, TimeTheShardDidNotRunDoesNotCountAgainstALease) {
  ShardState state(Layout(), 1, 0, 1);
  state.set_lease(absl::Seconds(10));
  ASSERT_TRUE(state.OpenSession(0, 11).ok());
  state.Touch(0);
  const absl::Time now = absl::Now();
  state.ForgiveStall(absl::Seconds(55));
  EXPECT_TRUE(state.Alive(0, now + absl::Seconds(60)));
  EXPECT_THAT(state.NewlyLapsed(now + absl::Seconds(60)), IsEmpty());
  EXPECT_LT(state.SinceContact(0, now + absl::Seconds(60)), absl::Seconds(6));
  EXPECT_FALSE(state.Alive(0, now + absl::Seconds(66)));
  EXPECT_THAT(state.NewlyLapsed(now + absl::Seconds(66)), SizeIs(1));
}

// Bounded staleness (SSP): with max_staleness 1 and batches of 4, a pull
// of a worker more than 1 step ahead of the slowest live worker waits, and
// goes when the slowest advances, leaves, or stops calling for its lease.
TEST(ShardStateTest, TheStalenessBoundHoldsExactlyTheWorkerAheadOfIt) {
  ShardState state(Layout(), 1, 0, 1);
  state.set_lease(absl::Seconds(10));
  state.SetStalenessBound(StalenessBound(/*max_staleness=*/1,
                                         /*num_workers=*/3, /*batch_size=*/4));
  ASSERT_TRUE(state.OpenSession(0, 1).ok());
  ASSERT_TRUE(state.OpenSession(1, 2).ok());
  ASSERT_TRUE(state.OpenSession(2, 3).ok());
  // Clocks: rank 0 at 2 steps, rank 1 at 1, rank 2 at 0.
  state.RecordAppliedSamples(0, 8);
  state.RecordAppliedSamples(1, 4);
  int ran0 = 0, ran1 = 0, ran2 = 0;
  // Rank 0 is 2 ahead of rank 2: it waits; rank 1 (1 ahead) and rank 2
  // (the slowest) go at once; a pull of no rank (the evaluator) too.
  EXPECT_NE(state.WhenVersionAtLeast(
                0, [&] { ++ran0; }, absl::InfiniteFuture(), nullptr,
                /*clock_rank=*/0),
            0u);
  EXPECT_EQ(state.WhenVersionAtLeast(
                0, [&] { ++ran1; }, absl::InfiniteFuture(), nullptr, 1),
            0u);
  EXPECT_EQ(state.WhenVersionAtLeast(
                0, [&] { ++ran2; }, absl::InfiniteFuture(), nullptr, 2),
            0u);
  EXPECT_EQ(state.WhenVersionAtLeast(
                0, [] {}, absl::InfiniteFuture(), nullptr, -1),
            0u);
  EXPECT_EQ(ran0, 0);
  EXPECT_EQ(ran1, 1);
  EXPECT_EQ(ran2, 1);
  EXPECT_THAT(state.DescribeClockWaits(absl::Now()),
              ElementsAre("rank 0 at step 2 waits for rank 2 at step 0"));
  // Another push of rank 1 does not release it: rank 2 is still the
  // slowest.
  state.RecordAppliedSamples(1, 4);
  EXPECT_THAT(state.AdvanceVersion(1), IsEmpty());
  // Rank 2 advances one step: rank 0 is 1 ahead, within the bound.
  state.RecordAppliedSamples(2, 4);
  std::vector<ShardState::Waiter> ready = state.AdvanceVersion(2);
  ASSERT_THAT(ready, SizeIs(1));
  ready[0]();
  EXPECT_EQ(ran0, 1);
  EXPECT_THAT(state.DescribeClockWaits(absl::Now()), IsEmpty());
}

// A rank whose call waits for a version (a sync barrier's pull) is in
// touch however long it waits; one that only pushed, or whose waiting call
// was cancelled (its client went away), lets its lease run out.
TEST(ShardStateTest, ARankWhoseCallWaitsKeepsItsLease) {
  ShardState state(Layout(), 1, 0, 1);
  state.set_lease(absl::Milliseconds(200));
  state.SetNumWorkers(2);
  ASSERT_TRUE(state.OpenSession(0, 1).ok());
  ASSERT_TRUE(state.OpenSession(1, 2).ok());
  const uint64_t id = state.WhenVersionAtLeast(
      1, [] {}, absl::InfiniteFuture(), nullptr, /*clock_rank=*/1);
  ASSERT_NE(id, 0u);
  absl::Time touched;
  for (int i = 0; i < 3; ++i) {
    absl::SleepFor(absl::Milliseconds(150));
    touched = absl::Now();
    state.TouchWaitingRanks();
  }
  // Asked as of the last touch, not of whenever this thread runs next (a
  // thread held off the cores for a lease would otherwise fail the test).
  EXPECT_TRUE(state.Alive(1, touched));
  EXPECT_FALSE(state.Alive(0, touched));
  ASSERT_TRUE(state.CancelWaiter(id));
  absl::SleepFor(absl::Milliseconds(300));
  state.TouchWaitingRanks();
  EXPECT_FALSE(state.Alive(1, absl::Now()));
}

// Elastic runs: a rank that joins starts at the slowest live member's
// clock, not at its own 0 steps (which would hold every member back until
// it caught up).
TEST(ShardStateTest, AJoinerStartsAtTheSlowestMembersClock) {
  ShardState state(Layout(), 1, 0, 1);
  state.set_lease(absl::Seconds(10));
  state.SetNumWorkers(3);
  state.SetElastic(nullptr);
  state.SetStalenessBound(StalenessBound(/*max_staleness=*/1,
                                         /*num_workers=*/3, /*batch_size=*/4));
  ASSERT_TRUE(state.OpenSession(0, 1).ok());
  ASSERT_TRUE(state.OpenSession(1, 2).ok());
  state.RecordAppliedSamples(0, 40);  // step 10
  state.RecordAppliedSamples(1, 32);  // step 8
  ASSERT_TRUE(state.OpenSession(2, 3).ok());  // joins at step 8
  int ran = 0;
  ASSERT_NE(state.WhenVersionAtLeast(
                0, [&] { ++ran; }, absl::InfiniteFuture(), nullptr,
                /*clock_rank=*/0),
            0u);
  // Rank 1 moves to step 10 and the joiner one step, to 9: rank 0 is
  // within 1 step of the slowest. (At its own count the joiner would be
  // at step 1, and rank 0 would wait 8 of its steps more.)
  state.RecordAppliedSamples(1, 8);
  state.RecordAppliedSamples(2, 4);
  std::vector<ShardState::Waiter> ready = state.AdvanceVersion(1);
  ASSERT_THAT(ready, SizeIs(1));
  ready[0]();
  EXPECT_EQ(ran, 1);
  // The joiner's own pulls go at once: it is the slowest.
  EXPECT_EQ(state.WhenVersionAtLeast(
                0, [&] { ++ran; }, absl::InfiniteFuture(), nullptr, 2),
            0u);
  EXPECT_EQ(ran, 2);
}

TEST(ShardStateTest, ASlowWorkerThatLeftOrWentSilentNoLongerHoldsOthers) {
  ShardState state(Layout(), 1, 0, 1);
  state.set_lease(absl::Seconds(10));
  state.SetStalenessBound(StalenessBound(/*max_staleness=*/0,
                                         /*num_workers=*/2, /*batch_size=*/4));
  ASSERT_TRUE(state.OpenSession(0, 1).ok());
  ASSERT_TRUE(state.OpenSession(1, 2).ok());
  state.RecordAppliedSamples(0, 4);
  int ran = 0;
  ASSERT_NE(state.WhenVersionAtLeast(
                0, [&] { ++ran; }, absl::InfiniteFuture(), nullptr, 0),
            0u);
  // Nothing changed: the ticker lets nothing go.
  EXPECT_THAT(state.ReleaseWaiters(absl::Now()), IsEmpty());
  // Rank 1's lease runs out: rank 0 goes.
  std::vector<ShardState::Waiter> ready =
      state.ReleaseWaiters(absl::Now() + absl::Seconds(60));
  ASSERT_THAT(ready, SizeIs(1));
  ready[0]();
  EXPECT_EQ(ran, 1);
  // Rank 1 leaves: rank 0 never waits for it again.
  state.EndSession(1, 2);
  state.RecordAppliedSamples(0, 40);
  EXPECT_EQ(state.WhenVersionAtLeast(
                0, [&] { ++ran; }, absl::InfiniteFuture(), nullptr, 0),
            0u);
  EXPECT_EQ(ran, 2);
}

// Without a bound, a clock rank changes nothing.
TEST(ShardStateTest, WithoutABoundNoPullWaitsForClocks) {
  ShardState state(Layout(), 1, 0, 1);
  state.RecordAppliedSamples(0, 400);
  int ran = 0;
  EXPECT_EQ(state.WhenVersionAtLeast(
                0, [&] { ++ran; }, absl::InfiniteFuture(), nullptr, 0),
            0u);
  EXPECT_EQ(ran, 1);
}

TEST(ShardStateTest, TheRunClosesOnlyOnceEveryRankHasFinished) {
  ShardState state(Layout(), /*seed=*/3, /*shard=*/0, /*num_shards=*/1);
  state.SetNumWorkers(2);
  EXPECT_EQ(state.CloseRun().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(state.FinishRank(1));
  const absl::Status early = state.CloseRun();
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(early.message(),
            "shard 0: the run cannot be closed before every worker has "
            "finished; rank(s) 0 have not");
  EXPECT_FALSE(state.run_closed().HasBeenNotified());
  EXPECT_FALSE(state.Stats().workers_finished());
  EXPECT_EQ(state.Stats().workers_finished_unix_s(), 0);

  EXPECT_TRUE(state.FinishRank(0));   // the last one
  EXPECT_FALSE(state.FinishRank(0));  // again: already counted
  const StatsResponse finished = state.Stats();
  EXPECT_THAT(finished.finished_ranks(), ElementsAre(0, 1));
  EXPECT_TRUE(finished.workers_finished());
  EXPECT_GT(finished.workers_finished_unix_s(), 0);
  EXPECT_FALSE(finished.run_closed());

  EXPECT_TRUE(state.CloseRun().ok());
  EXPECT_TRUE(state.CloseRun().ok());  // idempotent
  EXPECT_TRUE(state.run_closed().HasBeenNotified());
  EXPECT_TRUE(state.Stats().run_closed());
}

// Elastic: a finishing rank's session ends before it is counted
// (Shard::FinishRank), so the last rank's finish finds every other live
// rank finished already; the time the workers finished is still taken
// then, once.
TEST(ShardStateTest, AnElasticRunNotesWhenItsLastRankFinished) {
  ShardState state(Layout(), /*seed=*/3, /*shard=*/0, /*num_shards=*/1);
  state.set_lease(absl::Seconds(10));
  state.SetNumWorkers(3);
  state.SetElastic(nullptr);
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(state.OpenSession(rank, rank + 1).ok());
  }
  state.EndSession(2, 3);  // rank 2 left the run (scaled down)
  state.EndSession(0, 1);
  EXPECT_FALSE(state.FinishRank(0));  // rank 1 is live and has not finished
  EXPECT_EQ(state.Stats().workers_finished_unix_s(), 0);
  state.EndSession(1, 2);
  EXPECT_TRUE(state.FinishRank(1));  // the last one
  EXPECT_FALSE(state.FinishRank(1));
  const StatsResponse finished = state.Stats();
  EXPECT_TRUE(finished.workers_finished());
  EXPECT_GT(finished.workers_finished_unix_s(), 0);
}

TEST(ShardStateTest, FirstPushTimeIsKeptFromTheFirstPush) {
  ShardState state(Layout(), /*seed=*/3, /*shard=*/0, /*num_shards=*/1);
  EXPECT_EQ(state.Stats().first_push_unix_s(), 0);
  state.RecordPush(/*staleness=*/0, /*samples=*/8, /*bytes=*/100);
  const double first = state.Stats().first_push_unix_s();
  EXPECT_GT(first, 0);
  state.RecordPush(/*staleness=*/0, /*samples=*/8, /*bytes=*/100);
  EXPECT_EQ(state.Stats().first_push_unix_s(), first);
}

TEST(ShardStateTest, RestoreKeepsOnlyTheFinishedRanksOfThisRun) {
  ShardState state(Layout(), /*seed=*/3, /*shard=*/0, /*num_shards=*/1);
  state.SetNumWorkers(2);
  StatsResponse saved;
  for (int rank : {-1, 0, 1, 7}) saved.add_finished_ranks(rank);
  saved.set_first_push_unix_s(1000);
  saved.set_workers_finished_unix_s(1040);
  state.RestoreStats(saved);
  const StatsResponse restored = state.Stats();
  EXPECT_THAT(restored.finished_ranks(), ElementsAre(0, 1));
  EXPECT_TRUE(restored.workers_finished());
  EXPECT_EQ(restored.first_push_unix_s(), 1000);
  EXPECT_EQ(restored.workers_finished_unix_s(), 1040);
  EXPECT_FALSE(restored.run_closed());
}

}  // namespace
}  // namespace monsoon::server
