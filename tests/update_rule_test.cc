#include "server/update_rule.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/model_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/optimizer.h"
#include "server/shard_state.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace monsoon::server {
namespace {

using ::monsoon::testutil::ResolvedConfig;
using ::monsoon::testutil::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

// layer_sizes {3, 2}: 8 parameters on one shard.
constexpr size_t kSize = 8;

// A push that owns its values; PushData only points at them, for as long
// as the OwnedPush lives (a temporary: until the end of the statement).
struct OwnedPush {
  std::vector<float> values;
  PushData data;
  operator PushData() const {  // NOLINT: converts where a push is wanted
    PushData push = data;
    push.values = values;
    return push;
  }
};

// Each rank's pushes carry the next examples of its data, as a worker's do
// (a repeat would be a duplicate; see RepeatedExamplesAreNotAppliedTwice).
// Every test begins at example 0 of each rank (ResetOffsets), as a run
// does: a sync step's pushes begin at the same position.
absl::Mutex offsets_mu;
std::map<int, int64_t>& Offsets() ABSL_EXCLUSIVE_LOCKS_REQUIRED(offsets_mu) {
  static auto* next = new std::map<int, int64_t>;
  return *next;
}

int64_t NextOffset(int rank, int64_t samples) {
  absl::MutexLock lock(&offsets_mu);
  const int64_t offset = Offsets()[rank];
  Offsets()[rank] += samples;
  return offset;
}

void ResetOffsets() {
  absl::MutexLock lock(&offsets_mu);
  Offsets().clear();
}

OwnedPush MakePush(int rank, int64_t base_version, std::vector<float> values,
                   int64_t samples = 4) {
  OwnedPush push;
  push.data.worker_rank = rank;
  push.data.base_version = base_version;
  push.data.samples = samples;
  push.data.sample_offset = NextOffset(rank, samples);
  push.data.wire_bytes = 100;
  push.values = std::move(values);
  return push;
}

// A push of the rank's next examples that does not consume them (one the
// shard refuses, whose examples the rank then pushes again).
OwnedPush MakeRefusedPush(int rank, int64_t base_version,
                          std::vector<float> values, int64_t samples = 4) {
  OwnedPush push = MakePush(rank, base_version, std::move(values), samples);
  absl::MutexLock lock(&offsets_mu);
  Offsets()[rank] -= samples;
  return push;
}

std::vector<float> Filled(float value) {
  return std::vector<float>(kSize, value);
}

std::vector<float> Values(const WeightsPtr& weights) {
  return std::vector<float>(weights->values().begin(), weights->values().end());
}

// The rule's current weights.
std::vector<float> Weights(UpdateRule& rule) { return Values(rule.Snapshot()); }

class SyncRuleTest : public testing::Test {
 protected:
  SyncRuleTest()
      : config_(ResolvedConfig("layer_sizes: [3, 2] mode: SYNC optimizer: SGD "
                               "learning_rate: 0.5 momentum: 0")),
        state_(common::ModelLayout::FromConfig(config_), config_.seed(), 0, 1),
        rule_(MakeSyncRule(config_, /*num_workers=*/2, &state_)),
        initial_(Weights(*rule_)) {
    ResetOffsets();
  }

  // initial_ - 0.5 * step, elementwise.
  std::vector<float> InitialMinusHalfOf(const std::vector<float>& step) {
    std::vector<float> expected(kSize);
    for (size_t i = 0; i < kSize; ++i)
      expected[i] = initial_[i] - 0.5f * step[i];
    return expected;
  }

  TrainingConfig config_;
  ShardState state_;
  std::unique_ptr<UpdateRule> rule_;
  const std::vector<float> initial_;
};

TEST_F(SyncRuleTest, AveragesBothWorkersPushesAndAppliesThemOnce) {
  // Worker 0 pushes 1, 2, ..., worker 1 pushes 7, 6, ...: the mean is 4.
  std::vector<float> g0(kSize), g1(kSize);
  for (size_t i = 0; i < kSize; ++i) {
    g0[i] = static_cast<float>(i);
    g1[i] = static_cast<float>(8 - i);
  }
  absl::StatusOr<PushResult> first = rule_->Apply(MakePush(0, 0, g0));
  ASSERT_OK(first.status());
  EXPECT_EQ(first->version, 0);
  EXPECT_EQ(first->staleness, 0);
  EXPECT_EQ(state_.version(), 0);
  EXPECT_EQ(Weights(*rule_), initial_);

  absl::StatusOr<PushResult> second = rule_->Apply(MakePush(1, 0, g1));
  ASSERT_OK(second.status());
  EXPECT_EQ(second->version, 1);
  EXPECT_EQ(state_.version(), 1);
  EXPECT_EQ(Weights(*rule_), InitialMinusHalfOf(Filled(4.0f)));

  const WeightsPtr snapshot = rule_->Snapshot();
  EXPECT_EQ(snapshot->version(), 1);
  EXPECT_EQ(Values(snapshot), Weights(*rule_));
  // Pulls of one version share its weights: no copy per pull.
  EXPECT_EQ(rule_->Snapshot(), snapshot);

  const StatsResponse stats = state_.Stats();
  EXPECT_EQ(stats.pushes(), 2);
  EXPECT_EQ(stats.samples(), 8);
  EXPECT_EQ(stats.bytes_pushed(), 200);
  EXPECT_THAT(stats.staleness_counts(), ElementsAre(2));
}

TEST_F(SyncRuleTest, AStepWhoseUpdateWouldOverflowIsRefusedAndPassedOver) {
  // Each push is finite; their sum (6e38) is not.
  ASSERT_OK(rule_->Apply(MakePush(0, 0, Filled(3e38f), 4)).status());
  absl::StatusOr<PushResult> closing =
      rule_->Apply(MakePush(1, 0, Filled(3e38f), 4));
  ASSERT_OK(closing.status());
  // The step closes (its workers wait for its version) with the weights as
  // they were, and its examples passed over, not applied.
  EXPECT_EQ(closing->version, 1);
  EXPECT_EQ(Weights(*rule_), initial_);
  StatsResponse stats = state_.Stats();
  EXPECT_EQ(stats.refused_updates(), 1);
  EXPECT_THAT(stats.samples_applied_by_worker(), testing::IsEmpty());
  EXPECT_THAT(stats.samples_skipped_by_worker(),
              UnorderedElementsAre(Pair(0, 4), Pair(1, 4)));
  EXPECT_EQ(state_.SamplePosition(0), NextOffset(0, 0));
  // The next step applies as usual.
  ASSERT_OK(rule_->Apply(MakePush(0, 1, Filled(1.0f))).status());
  ASSERT_OK(rule_->Apply(MakePush(1, 1, Filled(3.0f))).status());
  EXPECT_EQ(Weights(*rule_), InitialMinusHalfOf(Filled(2.0f)));
  EXPECT_EQ(state_.Stats().refused_updates(), 1);
}

// A shard restarted from an older checkpoint (this one: nothing applied)
// while worker 0 was a step ahead of worker 1, both past what it lost:
// worker 1 repeats its step (examples 100-104, which the shard that did not
// go back has applied: its resume point is 104), worker 0 repeats its next
// one (104-108). The shard passes over worker 1's lost step, as it lost
// worker 0's, and its step pairs the two workers' batches at 104; taken
// into the step, worker 1's would have paired 100 with 104, and the two
// would have stayed a step apart on this shard to the end of the run.
TEST_F(SyncRuleTest, ARepeatedStepThatTheShardLostIsPassedOverNotPaired) {
  auto push = [](int rank, int64_t offset, bool repeat, float value) {
    OwnedPush p = MakePush(rank, 0, Filled(value), 4);
    p.data.sample_offset = offset;
    p.data.repeat = repeat;
    p.data.resume_point = repeat ? 104 : 0;
    return p;
  };
  ASSERT_OK_AND_ASSIGN(PushResult lost, rule_->Apply(push(1, 100, true, 9.0f)));
  EXPECT_TRUE(lost.duplicate);
  EXPECT_EQ(lost.version, 0);
  EXPECT_EQ(state_.SamplePosition(1), 104);
  ASSERT_OK_AND_ASSIGN(PushResult ahead,
                       rule_->Apply(push(0, 104, true, 1.0f)));
  EXPECT_FALSE(ahead.duplicate);
  EXPECT_EQ(ahead.version, 0);  // collecting
  ASSERT_OK_AND_ASSIGN(PushResult next,
                       rule_->Apply(push(1, 104, false, 3.0f)));
  EXPECT_EQ(next.version, 1);
  EXPECT_EQ(Weights(*rule_), InitialMinusHalfOf(Filled(2.0f)));
  EXPECT_EQ(state_.SamplePosition(0), 108);
  EXPECT_EQ(state_.SamplePosition(1), 108);
  EXPECT_THAT(state_.Stats().samples_skipped_by_worker(),
              UnorderedElementsAre(Pair(1, 4)));
  // A repeat at a shard that did not go back is not passed over: it holds
  // the rank's earlier examples, and takes this one into the step.
  OwnedPush again = push(0, 108, true, 1.0f);
  again.data.base_version = 1;
  again.data.resume_point = 112;
  ASSERT_OK_AND_ASSIGN(PushResult kept, rule_->Apply(again));
  EXPECT_FALSE(kept.duplicate);
  EXPECT_EQ(state_.SamplePosition(0), 108);  // collecting, not passed over
}

// The race the resume point alone lost (a sync shard restart in
// cluster_test, once): worker 0 read the shard that did not go back before
// worker 1's push closed the step there (its resume point: 100), worker 1
// after (104). Both repeat their examples from 100 at the restarted shard.
// Taken alone, worker 1's resume point would pass its batch over while
// worker 0's is in the step, and the two would stay a step apart here to
// the end of the run; the step's pushes decide instead: the same position,
// one step.
TEST_F(SyncRuleTest, RepeatsOfTheSamePositionMeetInOneStepWhateverTheyResume) {
  auto push = [](int rank, int64_t offset, int64_t resume, float value) {
    OwnedPush p = MakePush(rank, 0, Filled(value), 4);
    p.data.sample_offset = offset;
    p.data.repeat = true;
    p.data.resume_point = resume;
    return p;
  };
  ASSERT_OK_AND_ASSIGN(PushResult first, rule_->Apply(push(0, 100, 100, 1.0f)));
  EXPECT_FALSE(first.duplicate);
  ASSERT_OK_AND_ASSIGN(PushResult second,
                       rule_->Apply(push(1, 100, 104, 3.0f)));
  EXPECT_FALSE(second.duplicate);
  EXPECT_EQ(second.version, 1);
  EXPECT_EQ(Weights(*rule_), InitialMinusHalfOf(Filled(2.0f)));
  EXPECT_EQ(state_.SamplePosition(0), 104);
  EXPECT_EQ(state_.SamplePosition(1), 104);
  EXPECT_THAT(state_.Stats().samples_skipped_by_worker(), testing::IsEmpty());
}

// A push of examples behind the step's, at a shard that went back: another
// rank went past them, so the shard passes them over (a duplicate, answered
// at once) and the rank's next batch meets the step.
TEST_F(SyncRuleTest, APushBehindTheStepIsPassedOver) {
  auto push = [](int rank, int64_t offset, float value) {
    OwnedPush p = MakePush(rank, 0, Filled(value), 4);
    p.data.sample_offset = offset;
    return p;
  };
  ASSERT_OK(rule_->Apply(push(0, 104, 1.0f)).status());
  ASSERT_OK_AND_ASSIGN(PushResult behind, rule_->Apply(push(1, 100, 9.0f)));
  EXPECT_TRUE(behind.duplicate);
  EXPECT_EQ(behind.version, 0);
  EXPECT_EQ(behind.await_version, 0);
  EXPECT_EQ(state_.SamplePosition(1), 104);
  EXPECT_EQ(Weights(*rule_), initial_);
  ASSERT_OK_AND_ASSIGN(PushResult next, rule_->Apply(push(1, 104, 3.0f)));
  EXPECT_EQ(next.version, 1);
  EXPECT_EQ(Weights(*rule_), InitialMinusHalfOf(Filled(2.0f)));
  EXPECT_THAT(state_.Stats().samples_skipped_by_worker(),
              UnorderedElementsAre(Pair(1, 4)));
}

// A push of examples ahead of the step's: the step so far holds examples
// its rank went past. The step closes without an update (its workers get
// the unchanged weights as the next version and go on), and the push
// begins the next step, whose version answers it.
TEST_F(SyncRuleTest, APushAheadOfTheStepClosesItWithoutAnUpdate) {
  auto push = [](int rank, int64_t base, int64_t offset, float value) {
    OwnedPush p = MakePush(rank, base, Filled(value), 4);
    p.data.sample_offset = offset;
    return p;
  };
  ASSERT_OK_AND_ASSIGN(PushResult behind, rule_->Apply(push(1, 0, 100, 9.0f)));
  EXPECT_EQ(behind.version, 0);
  bool released = false;
  state_.WhenVersionAtLeast(1, [&] { released = true; });
  ASSERT_OK_AND_ASSIGN(PushResult ahead, rule_->Apply(push(0, 0, 104, 1.0f)));
  EXPECT_TRUE(released);  // worker 1's push-pull is answered
  EXPECT_FALSE(ahead.duplicate);
  EXPECT_EQ(ahead.version, 1);
  EXPECT_EQ(ahead.await_version, 2);
  EXPECT_EQ(state_.version(), 1);
  EXPECT_EQ(Weights(*rule_), initial_);
  EXPECT_EQ(state_.SamplePosition(1), 104);
  EXPECT_EQ(state_.Stats().refused_updates(), 0);
  // Worker 1's next batch, from version 1, closes the step with worker 0's.
  ASSERT_OK_AND_ASSIGN(PushResult next, rule_->Apply(push(1, 1, 104, 3.0f)));
  EXPECT_EQ(next.version, 2);
  EXPECT_EQ(Weights(*rule_), InitialMinusHalfOf(Filled(2.0f)));
  EXPECT_EQ(state_.SamplePosition(0), 108);
  EXPECT_EQ(state_.SamplePosition(1), 108);
  EXPECT_THAT(state_.Stats().samples_skipped_by_worker(),
              UnorderedElementsAre(Pair(1, 4)));
}

TEST_F(SyncRuleTest, ExamplesCountAsAppliedOnlyOnceTheStepIsApplied) {
  ASSERT_OK(rule_->Apply(MakePush(0, 0, Filled(1.0f), 20)).status());
  // Collected, not applied: a worker restarted now must push it again.
  EXPECT_EQ(state_.AppliedSamples(0), 0);
  ASSERT_OK(rule_->Apply(MakePush(1, 0, Filled(1.0f), 30)).status());
  EXPECT_EQ(state_.AppliedSamples(0), 20);
  EXPECT_EQ(state_.AppliedSamples(1), 30);
  ASSERT_OK(rule_->Apply(MakePush(1, 1, Filled(1.0f), 30)).status());
  EXPECT_THAT(state_.Stats().samples_applied_by_worker(),
              UnorderedElementsAre(Pair(0, 20), Pair(1, 30)));
}

TEST_F(SyncRuleTest, ARepeatOfAClosedStepIsADuplicate) {
  OwnedPush a = MakePush(0, 0, Filled(2.0f), 8);
  OwnedPush b = MakePush(1, 0, Filled(2.0f), 8);
  ASSERT_OK(rule_->Apply(a).status());
  ASSERT_OK(rule_->Apply(b).status());
  const std::vector<float> after = Weights(*rule_);
  // Worker 0, restarted, pushes its step-0 batch again.
  ASSERT_OK_AND_ASSIGN(PushResult repeat, rule_->Apply(a));
  EXPECT_TRUE(repeat.duplicate);
  EXPECT_EQ(repeat.version, 1);
  EXPECT_EQ(Weights(*rule_), after);
  EXPECT_EQ(state_.Stats().duplicate_pushes(), 1);
  EXPECT_EQ(state_.SamplePosition(0), a.data.sample_offset + 8);
}

TEST_F(SyncRuleTest, AStepClosesWithoutAWorkerWhoseLeaseRanOut) {
  state_.set_lease(absl::Seconds(10));
  state_.Touch(0);
  state_.Touch(1);
  // Each worker's first batch: examples [0, 8) of its data.
  OwnedPush push0 = MakePush(0, 0, Filled(3.0f), 8);
  push0.data.sample_offset = 0;
  OwnedPush late1 = MakePush(1, 0, Filled(5.0f), 8);
  late1.data.sample_offset = 0;
  ASSERT_OK(rule_->Apply(push0).status());
  // Worker 1 called 5 s ago: still alive, the step waits for it.
  rule_->Tick(absl::Now() + absl::Seconds(5), absl::ZeroDuration());
  EXPECT_EQ(state_.version(), 0);
  EXPECT_EQ(Weights(*rule_), initial_);
  // 11 s: its lease has run out; the step closes with worker 0's gradient
  // alone (the mean of one) and skips worker 1's batch.
  rule_->Tick(absl::Now() + absl::Seconds(11), absl::ZeroDuration());
  EXPECT_EQ(state_.version(), 1);
  EXPECT_EQ(Weights(*rule_), InitialMinusHalfOf(Filled(3.0f)));
  const StatsResponse stats = state_.Stats();
  EXPECT_THAT(stats.samples_applied_by_worker(),
              UnorderedElementsAre(Pair(0, 8)));
  EXPECT_THAT(stats.samples_skipped_by_worker(),
              UnorderedElementsAre(Pair(1, 8)));
  EXPECT_THAT(stats.sample_position_by_worker(),
              UnorderedElementsAre(Pair(0, 8), Pair(1, 8)));
  // Worker 1, back, pushes the batch the step skipped: acknowledged as a
  // repeat, nothing applied.
  ASSERT_OK_AND_ASSIGN(PushResult late, rule_->Apply(late1));
  EXPECT_TRUE(late.duplicate);
  EXPECT_EQ(Weights(*rule_), InitialMinusHalfOf(Filled(3.0f)));
}

TEST_F(SyncRuleTest, AWorkerThatLeftNoLongerHoldsTheStep) {
  state_.set_lease(absl::Seconds(10));
  ASSERT_OK(state_.OpenSession(0, /*session=*/7));
  ASSERT_OK(state_.OpenSession(1, /*session=*/9));
  // A wrong session's goodbye changes nothing.
  state_.EndSession(1, /*session=*/8);
  ASSERT_OK(rule_->Apply(MakePush(0, 0, Filled(3.0f), 8)).status());
  rule_->Tick(absl::Now(), absl::ZeroDuration());
  EXPECT_EQ(state_.version(), 0);
  // Worker 1 is done: the step closes at the next tick, well inside its
  // lease, and the next step at worker 0's push.
  state_.EndSession(1, /*session=*/9);
  EXPECT_TRUE(state_.HasLeft(1));
  rule_->Tick(absl::Now(), absl::ZeroDuration());
  EXPECT_EQ(state_.version(), 1);
  EXPECT_EQ(Weights(*rule_), InitialMinusHalfOf(Filled(3.0f)));
  ASSERT_OK_AND_ASSIGN(PushResult next,
                       rule_->Apply(MakePush(0, 1, Filled(1.0f), 8)));
  EXPECT_EQ(next.version, 2);
  // A call still under way from the process that left does not bring it
  // back; a new process of the rank does.
  state_.Touch(1);
  EXPECT_FALSE(state_.Alive(1, absl::Now()));
  ASSERT_OK(state_.OpenSession(1, /*session=*/11));
  EXPECT_TRUE(state_.Alive(1, absl::Now()));
  EXPECT_FALSE(state_.HasLeft(1));
}

TEST_F(SyncRuleTest, AWorkerThatNeverCalledHoldsTheStep) {
  state_.set_lease(absl::Seconds(10));
  state_.Touch(0);
  ASSERT_OK(rule_->Apply(MakePush(0, 0, Filled(3.0f), 8)).status());
  // Worker 1 is still starting: no lease has run out.
  rule_->Tick(absl::Now() + absl::Hours(1), absl::ZeroDuration());
  EXPECT_EQ(state_.version(), 0);
}

// Backup workers (Chen et al. 2016): with 3 workers and 1 backup, each step
// closes with the first 2 gradients; the third's push for it is dropped.
TEST(SyncBackupTest, AStepClosesWithAllButTheBackupsAndDropsTheLatePush) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [3, 2] mode: SYNC optimizer: SGD learning_rate: 0.5 "
      "momentum: 0 backup_workers: 1");
  ShardState state(common::ModelLayout::FromConfig(config), config.seed(), 0,
                   1);
  std::unique_ptr<UpdateRule> rule =
      MakeSyncRule(config, /*num_workers=*/3, &state);
  std::vector<float> expected = Weights(*rule);
  ASSERT_OK(rule->Apply(MakePush(0, 0, Filled(1.0f))).status());
  EXPECT_EQ(state.version(), 0);
  absl::StatusOr<PushResult> second = rule->Apply(MakePush(1, 0, Filled(3.0f)));
  ASSERT_OK(second.status());
  // Closed with two of three: the mean of 1 and 3.
  EXPECT_EQ(second->version, 1);
  for (float& v : expected) v -= 0.5f * 2.0f;
  EXPECT_EQ(Weights(*rule), expected);
  // Worker 2's push for step 0 comes late: dropped, answered as stale with
  // the current version, the weights unchanged.
  absl::StatusOr<PushResult> late = rule->Apply(MakePush(2, 0, Filled(100.0f)));
  ASSERT_OK(late.status());
  EXPECT_TRUE(late->stale);
  EXPECT_FALSE(late->duplicate);
  EXPECT_EQ(late->version, 1);
  EXPECT_EQ(Weights(*rule), expected);
  StatsResponse stats = state.Stats();
  EXPECT_EQ(stats.backup_dropped_pushes(), 1);
  // Its bytes crossed the wire: counted with the pushed ones (100 each).
  EXPECT_EQ(stats.bytes_pushed(), 300);
  EXPECT_EQ(stats.duplicate_pushes(), 0);
  EXPECT_THAT(stats.samples_skipped_by_worker(),
              UnorderedElementsAre(Pair(2, 4)));
  EXPECT_THAT(stats.samples_applied_by_worker(),
              UnorderedElementsAre(Pair(0, 4), Pair(1, 4)));
  // Step 1: worker 2 is among the first two this time.
  ASSERT_OK(rule->Apply(MakePush(2, 1, Filled(2.0f))).status());
  ASSERT_OK(rule->Apply(MakePush(0, 1, Filled(4.0f))).status());
  EXPECT_EQ(state.version(), 2);
  for (float& v : expected) v -= 0.5f * 3.0f;
  EXPECT_EQ(Weights(*rule), expected);
  // And worker 1's late push for step 1 is dropped too.
  absl::StatusOr<PushResult> late1 = rule->Apply(MakePush(1, 1, Filled(9.0f)));
  ASSERT_OK(late1.status());
  EXPECT_TRUE(late1->stale);
  EXPECT_EQ(state.Stats().backup_dropped_pushes(), 2);
  EXPECT_EQ(Weights(*rule), expected);
}

// Elastic: the backup count is of the live members (a rank that never
// registered is none), and a late push's examples are passed over when it
// comes (not when the step closes, which cannot know them), so that its
// data shard is done.
TEST(SyncBackupTest, ElasticBackupsCountTheLiveMembers) {
  ResetOffsets();
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [3, 2] mode: SYNC optimizer: SGD learning_rate: 0.5 "
      "momentum: 0 backup_workers: 1 elastic: true");
  ShardState state(common::ModelLayout::FromConfig(config), config.seed(), 0,
                   1);
  state.set_lease(absl::Seconds(10));
  state.SetNumWorkers(4);
  state.SetElastic(nullptr);
  std::unique_ptr<UpdateRule> rule =
      MakeSyncRule(config, /*num_workers=*/4, &state);
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_OK(state.OpenSession(rank, /*session=*/rank + 1));
  }
  std::vector<float> expected = Weights(*rule);
  ASSERT_OK(rule->Apply(MakePush(0, 0, Filled(1.0f))).status());
  EXPECT_EQ(state.version(), 0);
  // Three members (rank 3 never came): two of them close the step.
  ASSERT_OK_AND_ASSIGN(PushResult second,
                       rule->Apply(MakePush(1, 0, Filled(3.0f))));
  EXPECT_EQ(second.version, 1);
  for (float& v : expected) v -= 0.5f * 2.0f;
  EXPECT_EQ(Weights(*rule), expected);
  EXPECT_EQ(state.SamplePosition(2), 0);
  ASSERT_OK_AND_ASSIGN(PushResult late,
                       rule->Apply(MakePush(2, 0, Filled(100.0f))));
  EXPECT_TRUE(late.stale);
  EXPECT_EQ(Weights(*rule), expected);
  // Its examples [0, 4) are behind the rank's position now, counted as
  // skipped (not applied) when the push came.
  EXPECT_EQ(state.SamplePosition(2), 4);
  StatsResponse stats = state.Stats();
  EXPECT_EQ(stats.backup_dropped_pushes(), 1);
  EXPECT_THAT(stats.samples_skipped_by_worker(),
              UnorderedElementsAre(Pair(2, 4)));
  EXPECT_THAT(stats.samples_applied_by_worker(),
              UnorderedElementsAre(Pair(0, 4), Pair(1, 4)));
  // Rank 2 leaves: two members, and all but one close a step.
  state.EndSession(2, /*session=*/3);
  ASSERT_OK_AND_ASSIGN(PushResult alone,
                       rule->Apply(MakePush(1, 1, Filled(2.0f))));
  EXPECT_EQ(alone.version, 2);
  for (float& v : expected) v -= 0.5f * 2.0f;
  EXPECT_EQ(Weights(*rule), expected);
  // Rank 0's push for step 1 is dropped; rank 2, gone, was not waited for
  // and has no step to drop.
  ASSERT_OK_AND_ASSIGN(PushResult late0,
                       rule->Apply(MakePush(0, 1, Filled(9.0f))));
  EXPECT_TRUE(late0.stale);
  EXPECT_EQ(state.SamplePosition(0), 8);
  EXPECT_EQ(state.Stats().backup_dropped_pushes(), 2);
}

TEST_F(SyncRuleTest, NextStepStartsFromAnEmptySum) {
  ASSERT_OK(rule_->Apply(MakePush(0, 0, Filled(2.0f))).status());
  ASSERT_OK(rule_->Apply(MakePush(1, 0, Filled(2.0f))).status());
  const std::vector<float> after_one = Weights(*rule_);
  ASSERT_OK(rule_->Apply(MakePush(1, 1, Filled(1.0f))).status());
  absl::StatusOr<PushResult> result =
      rule_->Apply(MakePush(0, 1, Filled(3.0f)));
  ASSERT_OK(result.status());
  EXPECT_EQ(result->version, 2);
  // Step 1's mean is 2 again: the step-0 gradients are not counted twice.
  std::vector<float> expected(kSize);
  for (size_t i = 0; i < kSize; ++i) expected[i] = after_one[i] - 0.5f * 2.0f;
  EXPECT_EQ(Weights(*rule_), expected);
}

TEST_F(SyncRuleTest, PullWaiterFiresOnlyAtTheSecondPush) {
  absl::Notification fired;
  std::vector<float> seen;
  int64_t seen_version = -1;
  // As a pull does: snapshot through the rule once the version is reached.
  // The rule must have released its lock by then.
  const uint64_t id = state_.WhenVersionAtLeast(1, [&] {
    const WeightsPtr snapshot = rule_->Snapshot();
    seen = Values(snapshot);
    seen_version = snapshot->version();
    fired.Notify();
  });
  EXPECT_NE(id, 0u);
  ASSERT_OK(rule_->Apply(MakePush(1, 0, Filled(1.0f))).status());
  EXPECT_FALSE(fired.HasBeenNotified());
  ASSERT_OK(rule_->Apply(MakePush(0, 0, Filled(3.0f))).status());
  // The pushing thread runs the waiter before Apply returns.
  ASSERT_TRUE(fired.HasBeenNotified());
  EXPECT_EQ(seen_version, 1);
  EXPECT_EQ(seen, InitialMinusHalfOf(Filled(2.0f)));
}

TEST_F(SyncRuleTest, DuplicatePushIsAlreadyExistsAndNotCounted) {
  OwnedPush push = MakePush(0, 0, Filled(2.0f));
  push.data.digest = 77;
  ASSERT_OK(rule_->Apply(push).status());
  EXPECT_THAT(rule_->Apply(push),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       HasSubstr("worker 0 already pushed step 0")));
  EXPECT_EQ(Weights(*rule_), initial_);
  EXPECT_EQ(state_.version(), 0);
  EXPECT_EQ(state_.Stats().pushes(), 1);
  ASSERT_OK(rule_->Apply(MakePush(1, 0, Filled(4.0f))).status());
  EXPECT_EQ(Weights(*rule_), InitialMinusHalfOf(Filled(3.0f)));
}

TEST_F(SyncRuleTest, ASecondPushWithOtherValuesOrExamplesIsRefused) {
  OwnedPush first = MakePush(0, 0, Filled(2.0f));
  first.data.digest = 77;
  first.data.session = 5;
  ASSERT_OK(rule_->Apply(first).status());
  // The same examples, other values, from the same process.
  OwnedPush other_values = first;
  other_values.values = Filled(100.0f);
  other_values.data.digest = 78;
  EXPECT_THAT(rule_->Apply(other_values),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("twice with different values")));
  // Other examples.
  OwnedPush other_examples = MakePush(0, 0, Filled(2.0f));
  other_examples.data.digest = 77;
  other_examples.data.session = 5;
  EXPECT_THAT(rule_->Apply(other_examples),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("twice with different examples")));
  // Other examples are refused also in a repeat after a lost shard.
  OwnedPush other_examples_repeat = other_examples;
  other_examples_repeat.data.repeat = true;
  EXPECT_THAT(rule_->Apply(other_examples_repeat),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("twice with different examples")));
  // The same examples computed again by this process after it lost another
  // shard (PushHeader.repeat), on the weights the shards have now: the step
  // has them; the first push stays.
  OwnedPush repeat = other_values;
  repeat.data.repeat = true;
  EXPECT_THAT(rule_->Apply(repeat), StatusIs(absl::StatusCode::kAlreadyExists));
  // The same examples from a restarted process (a new session), computed
  // again: the step has them; the first push stays.
  OwnedPush restarted = other_values;
  restarted.data.session = 6;
  EXPECT_THAT(rule_->Apply(restarted),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_EQ(state_.Stats().pushes(), 1);
  ASSERT_OK(rule_->Apply(MakePush(1, 0, Filled(4.0f))).status());
  // Mean of 2 and 4: none of the refused pushes is in it.
  EXPECT_EQ(Weights(*rule_), InitialMinusHalfOf(Filled(3.0f)));
}

TEST_F(SyncRuleTest, StalePushIsAbortedAndLeavesWeightsUnchanged) {
  ASSERT_OK(rule_->Apply(MakePush(0, 0, Filled(2.0f))).status());
  ASSERT_OK(rule_->Apply(MakePush(1, 0, Filled(2.0f))).status());
  const std::vector<float> before = Weights(*rule_);
  EXPECT_THAT(
      rule_->Apply(MakeRefusedPush(0, 0, Filled(100.0f))),
      StatusIs(absl::StatusCode::kAborted, HasSubstr("pull and retry")));
  EXPECT_EQ(Weights(*rule_), before);
  EXPECT_EQ(state_.version(), 1);
  // The refused push is not part of step 1.
  ASSERT_OK(rule_->Apply(MakePush(0, 1, Filled(0.0f))).status());
  ASSERT_OK(rule_->Apply(MakePush(1, 1, Filled(0.0f))).status());
  EXPECT_EQ(Weights(*rule_), before);
  EXPECT_EQ(state_.version(), 2);
}

TEST_F(SyncRuleTest, PushFromAFutureVersionIsAbortedAndLeavesWeightsUnchanged) {
  EXPECT_THAT(
      rule_->Apply(MakeRefusedPush(0, 5, Filled(100.0f))),
      StatusIs(absl::StatusCode::kAborted, HasSubstr("only at version 0")));
  EXPECT_EQ(Weights(*rule_), initial_);
  EXPECT_EQ(state_.version(), 0);
  EXPECT_EQ(state_.Stats().pushes(), 0);
  // Worker 0 may still push step 0.
  ASSERT_OK(rule_->Apply(MakePush(0, 0, Filled(1.0f))).status());
  ASSERT_OK(rule_->Apply(MakePush(1, 0, Filled(1.0f))).status());
  EXPECT_EQ(Weights(*rule_), InitialMinusHalfOf(Filled(1.0f)));
}

TEST_F(SyncRuleTest, ConcurrentWorkersStepInLockstep) {
  constexpr int kWorkers = 4;
  constexpr int kSteps = 20;
  ShardState state(common::ModelLayout::FromConfig(config_), 1, 0, 1);
  std::unique_ptr<UpdateRule> rule = MakeSyncRule(config_, kWorkers, &state);
  const std::vector<float> initial = Weights(*rule);
  std::vector<absl::Status> errors(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      for (int step = 0; step < kSteps; ++step) {
        absl::StatusOr<PushResult> result =
            rule->Apply(MakePush(w, step, Filled(0.25f * (w + 1))));
        if (!result.ok()) {
          errors[w] = result.status();
          return;
        }
        // Wait for the barrier, as a sync pull does.
        absl::Notification next;
        state.WhenVersionAtLeast(step + 1, [&next] { next.Notify(); });
        next.WaitForNotification();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int w = 0; w < kWorkers; ++w) EXPECT_OK(errors[w]) << "worker " << w;
  EXPECT_EQ(state.version(), kSteps);
  EXPECT_EQ(state.Stats().pushes(), kWorkers * kSteps);
  // The rule applies one step at a time.
  EXPECT_EQ(state.Stats().max_concurrent_applies(), 1);
  // Each step's mean is (0.25 + 0.5 + 0.75 + 1) / 4 = 0.625.
  std::vector<float> expected = initial;
  for (int step = 0; step < kSteps; ++step) {
    for (float& v : expected) v -= 0.5f * 0.625f;
  }
  EXPECT_EQ(Weights(*rule), expected);
}

class DownpourRuleTest : public testing::Test {
 protected:
  DownpourRuleTest()
      : config_(ResolvedConfig(
            "layer_sizes: [3, 2] mode: DOWNPOUR learning_rate: 0.1 "
            "adagrad_initial_accumulator: 0.1")),
        state_(common::ModelLayout::FromConfig(config_), config_.seed(), 0, 1),
        rule_(MakeDownpourRule(config_, /*num_workers=*/2, &state_)),
        initial_(Weights(*rule_)) {}

  TrainingConfig config_;
  ShardState state_;
  std::unique_ptr<UpdateRule> rule_;
  const std::vector<float> initial_;
};

TEST_F(DownpourRuleTest, AppliesEachPushAtOnceWithAdagrad) {
  absl::StatusOr<PushResult> result =
      rule_->Apply(MakePush(0, 0, Filled(1.0f)));
  ASSERT_OK(result.status());
  EXPECT_EQ(result->version, 1);
  EXPECT_EQ(result->staleness, 0);
  EXPECT_EQ(state_.version(), 1);
  // h = 0.1 + 1 = 1.1; w -= 0.1 * 1 / sqrt(1.1).
  std::vector<float> expected = initial_;
  for (float& v : expected) v -= 0.1f * 1.0f / std::sqrt(1.1f);
  EXPECT_EQ(Weights(*rule_), expected);

  result = rule_->Apply(MakePush(0, 1, Filled(-2.0f)));
  ASSERT_OK(result.status());
  EXPECT_EQ(result->version, 2);
  // h = 1.1 + 4 = 5.1; w -= 0.1 * -2 / sqrt(5.1).
  for (float& v : expected) v -= 0.1f * -2.0f / std::sqrt(5.1f);
  const std::vector<float> weights = Weights(*rule_);
  for (size_t i = 0; i < kSize; ++i) EXPECT_FLOAT_EQ(weights[i], expected[i]);
}

TEST_F(DownpourRuleTest, APushThatWouldOverflowIsRefusedAndChangesNothing) {
  // 3e38 is finite, its square (Adagrad's accumulator) is not.
  OwnedPush poison = MakePush(0, 0, Filled(3e38f));
  EXPECT_THAT(rule_->Apply(poison), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("infinite or NaN")));
  EXPECT_EQ(Weights(*rule_), initial_);
  EXPECT_EQ(state_.version(), 0);
  EXPECT_EQ(state_.Stats().refused_updates(), 1);
  EXPECT_EQ(state_.Stats().pushes(), 0);
  // Its examples are not claimed: the same examples with a sound gradient
  // are applied, not taken for a repeat, and the accumulator is as before
  // (h = 0.1 + 1).
  poison.values = Filled(1.0f);
  absl::StatusOr<PushResult> result = rule_->Apply(poison);
  ASSERT_OK(result.status());
  EXPECT_FALSE(result->duplicate);
  std::vector<float> expected = initial_;
  for (float& v : expected) v -= 0.1f * 1.0f / std::sqrt(1.1f);
  EXPECT_EQ(Weights(*rule_), expected);
}

TEST_F(DownpourRuleTest, APushWhoseLargestValueIsKnownIsStillRefusedIfItWould) {
  // With max_abs given (as PushDecoder gives it) the bounds decide: small
  // values are applied without the pass, an overflow is still refused.
  OwnedPush small = MakePush(0, 0, Filled(1.0f));
  small.data.max_abs = 1.0f;
  ASSERT_OK(rule_->Apply(small).status());
  OwnedPush poison = MakePush(0, 1, Filled(3e38f));
  poison.data.max_abs = 3e38f;
  EXPECT_THAT(rule_->Apply(poison), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("infinite or NaN")));
  std::vector<float> expected = initial_;
  for (float& v : expected) v -= 0.1f * 1.0f / std::sqrt(1.1f);
  EXPECT_EQ(Weights(*rule_), expected);
  EXPECT_EQ(state_.version(), 1);
}

TEST_F(DownpourRuleTest, RecordsTheStalenessOfEachPush) {
  ASSERT_OK(rule_->Apply(MakePush(0, 0, Filled(1.0f))).status());
  ASSERT_OK(rule_->Apply(MakePush(0, 1, Filled(1.0f))).status());
  // Worker 1 computed from version 0; two pushes have been applied since.
  absl::StatusOr<PushResult> stale = rule_->Apply(MakePush(1, 0, Filled(1.0f)));
  ASSERT_OK(stale.status());
  EXPECT_EQ(stale->staleness, 2);
  EXPECT_EQ(stale->version, 3);
  const StatsResponse stats = state_.Stats();
  EXPECT_EQ(stats.version(), 3);
  EXPECT_EQ(stats.pushes(), 3);
  EXPECT_EQ(stats.samples(), 12);
  EXPECT_EQ(stats.staleness_max(), 2);
  EXPECT_THAT(stats.staleness_counts(), ElementsAre(2, 0, 1));
  // Each push's examples are applied with it.
  EXPECT_THAT(stats.samples_applied_by_worker(),
              UnorderedElementsAre(Pair(0, 8), Pair(1, 4)));
}

// staleness_lr (Zhang et al. 2016) on SGD: a push of staleness s moves the
// weights by lr / max(1, s) times its gradient.
TEST(DownpourStalenessTest, TheStalenessAwareRateDividesTheRateByTheStaleness) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [3, 2] mode: DOWNPOUR optimizer: SGD learning_rate: 0.5 "
      "staleness_lr: true");
  ShardState state(common::ModelLayout::FromConfig(config), config.seed(), 0,
                   1);
  std::unique_ptr<UpdateRule> rule =
      MakeDownpourRule(config, /*num_workers=*/2, &state);
  std::vector<float> expected = Weights(*rule);
  ASSERT_OK(rule->Apply(MakePush(0, 0, Filled(1.0f))).status());  // s = 0
  ASSERT_OK(rule->Apply(MakePush(0, 1, Filled(1.0f))).status());  // s = 0
  ASSERT_OK(rule->Apply(MakePush(1, 1, Filled(2.0f))).status());  // s = 1
  ASSERT_OK(rule->Apply(MakePush(1, 0, Filled(4.0f))).status());  // s = 3
  for (float& v : expected) {
    v -= 0.5f * 1.0f;
    v -= 0.5f * 1.0f;
    v -= 0.5f * 2.0f;
    v -= 0.5f * (1.0f / 3.0f) * 4.0f;
  }
  EXPECT_EQ(Weights(*rule), expected);
}

// On Adagrad the accumulator takes the push's gradient as it is; only the
// step is divided.
TEST(DownpourStalenessTest, TheStalenessAwareRateLeavesAdagradsSumAsItIs) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [3, 2] mode: DOWNPOUR learning_rate: 0.1 "
      "adagrad_initial_accumulator: 0.1 staleness_lr: true");
  ShardState state(common::ModelLayout::FromConfig(config), config.seed(), 0,
                   1);
  std::unique_ptr<UpdateRule> rule =
      MakeDownpourRule(config, /*num_workers=*/2, &state);
  std::vector<float> expected = Weights(*rule);
  ASSERT_OK(rule->Apply(MakePush(0, 0, Filled(1.0f))).status());
  ASSERT_OK(rule->Apply(MakePush(0, 1, Filled(1.0f))).status());
  ASSERT_OK(rule->Apply(MakePush(1, 0, Filled(1.0f))).status());  // s = 2
  for (float& v : expected) {
    v -= 0.1f * 1.0f / std::sqrt(1.1f);
    v -= 0.1f * 1.0f / std::sqrt(2.1f);
    v -= (0.1f * 0.5f) * 1.0f / std::sqrt(3.1f);
  }
  EXPECT_EQ(Weights(*rule), expected);
}

// DC-ASGD (Zheng et al. 2017): worker 1's gradient, computed on what it
// pulled, is applied as g + lambda * g * g * (w_now - w_pulled).
TEST(DownpourStalenessTest, DelayCompensationUsesWhatTheWorkerLastPulled) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [3, 2] mode: DOWNPOUR optimizer: SGD learning_rate: 0.5 "
      "delay_compensation: 0.25");
  ShardState state(common::ModelLayout::FromConfig(config), config.seed(), 0,
                   1);
  std::unique_ptr<UpdateRule> rule =
      MakeDownpourRule(config, /*num_workers=*/2, &state);
  const std::vector<float> w0 = Weights(*rule);
  // Both workers pull version 0.
  rule->Pulled(0, rule->Snapshot());
  rule->Pulled(1, rule->Snapshot());
  // Worker 0 pushes g = 1 computed on w0: nothing moved since, so no
  // compensation: w1 = w0 - 0.5.
  ASSERT_OK(rule->Apply(MakePush(0, 0, Filled(1.0f))).status());
  std::vector<float> w1 = w0;
  for (float& v : w1) v -= 0.5f;
  EXPECT_EQ(Weights(*rule), w1);
  // Worker 1 pushes g = 2 computed on w0 while the shard is at w1:
  // g' = 2 + 0.25 * 2 * 2 * (w1 - w0) = 2 + 1 * (-0.5) = 1.5 (as the rule
  // computes it, in float), w2 = w1 - 0.5 * g'.
  ASSERT_OK(rule->Apply(MakePush(1, 0, Filled(2.0f))).status());
  std::vector<float> w2 = w1;
  for (size_t i = 0; i < kSize; ++i) {
    const float g = 2.0f + 0.25f * 2.0f * 2.0f * (w1[i] - w0[i]);
    w2[i] = w1[i] - 0.5f * g;
  }
  EXPECT_EQ(Weights(*rule), w2);
  for (size_t i = 0; i < kSize; ++i) EXPECT_NEAR(w1[i] - w2[i], 0.75f, 1e-5);
  // A worker whose pull the shard never saw (it restarted since) is applied
  // as pushed.
  ASSERT_OK(rule->Apply(MakePush(2, 2, Filled(1.0f))).status());
  std::vector<float> w3 = w2;
  for (float& v : w3) v -= 0.5f;
  EXPECT_EQ(Weights(*rule), w3);
}

// The compensated gradient can overflow where the pushed one does not: the
// push is refused and nothing changes.
TEST(DownpourStalenessTest, ACompensationThatWouldOverflowIsRefused) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [3, 2] mode: DOWNPOUR optimizer: SGD learning_rate: 0.5 "
      "delay_compensation: 1");
  ShardState state(common::ModelLayout::FromConfig(config), config.seed(), 0,
                   1);
  std::unique_ptr<UpdateRule> rule =
      MakeDownpourRule(config, /*num_workers=*/2, &state);
  rule->Pulled(1, rule->Snapshot());
  ASSERT_OK(rule->Apply(MakePush(0, 0, Filled(1.0f))).status());
  const std::vector<float> before = Weights(*rule);
  // g = 1e20: g * g overflows float.
  OwnedPush huge = MakePush(1, 0, Filled(1e20f));
  huge.data.max_abs = 1e20f;
  EXPECT_THAT(rule->Apply(huge), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("infinite or NaN")));
  EXPECT_EQ(Weights(*rule), before);
  EXPECT_EQ(state.version(), 1);
}

TEST_F(DownpourRuleTest,
       PushFromAFutureVersionIsAbortedAndLeavesWeightsUnchanged) {
  ASSERT_OK(rule_->Apply(MakePush(0, 0, Filled(1.0f))).status());
  const std::vector<float> before = Weights(*rule_);
  EXPECT_THAT(
      rule_->Apply(MakePush(1, 2, Filled(1.0f))),
      StatusIs(absl::StatusCode::kAborted, HasSubstr("only at version 1")));
  EXPECT_EQ(Weights(*rule_), before);
  EXPECT_EQ(state_.version(), 1);
  EXPECT_EQ(state_.Stats().pushes(), 1);
}

TEST_F(DownpourRuleTest, WeightsAPullHoldsStayAsTheyWere) {
  // A pull sending version 0 still holds it when a push arrives: the push
  // writes version 1 beside it, and version 0 is unchanged.
  const WeightsPtr held = rule_->Snapshot();
  ASSERT_OK(rule_->Apply(MakePush(0, 0, Filled(1.0f))).status());
  EXPECT_EQ(held->version(), 0);
  EXPECT_EQ(Values(held), initial_);
  const WeightsPtr after = rule_->Snapshot();
  EXPECT_EQ(after->version(), 1);
  EXPECT_NE(after->values().data(), held->values().data());
  EXPECT_NE(Values(after), initial_);
}

TEST_F(DownpourRuleTest, WeightsNoPullHoldsAreUpdatedInPlace) {
  const float* before = rule_->Snapshot()->values().data();  // released
  ASSERT_OK(rule_->Apply(MakePush(0, 0, Filled(1.0f))).status());
  const WeightsPtr after = rule_->Snapshot();
  EXPECT_EQ(after->values().data(), before);
  EXPECT_EQ(after->version(), 1);
}

TEST_F(DownpourRuleTest, SteadyStateTakesNoNewBuffers) {
  // Pushes with a pull holding each version, as in a run: the pool grows
  // to the versions held at once, then reuses them.
  WeightsPtr held = rule_->Snapshot();
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(rule_->Apply(MakePush(0, i, Filled(0.5f))).status());
    held = rule_->Snapshot();
  }
  const int64_t warm = state_.buffers().allocations();
  for (int i = 3; i < 50; ++i) {
    ASSERT_OK(rule_->Apply(MakePush(0, i, Filled(0.5f))).status());
    held = rule_->Snapshot();
  }
  EXPECT_EQ(state_.buffers().allocations(), warm);
  EXPECT_LE(warm, 3);
}

TEST_F(DownpourRuleTest, RepeatedExamplesAreNotAppliedTwice) {
  OwnedPush push = MakePush(0, 0, Filled(1.0f), 10);
  ASSERT_OK_AND_ASSIGN(PushResult first, rule_->Apply(push));
  EXPECT_FALSE(first.duplicate);
  const std::vector<float> once = Weights(*rule_);
  // The same examples again (a worker repeating its step after a lost
  // connection): acknowledged, not applied, counted as a duplicate.
  ASSERT_OK_AND_ASSIGN(PushResult again, rule_->Apply(push));
  EXPECT_TRUE(again.duplicate);
  EXPECT_EQ(again.version, 1);
  EXPECT_EQ(Weights(*rule_), once);
  // Part of them: not applied either.
  OwnedPush part = push;
  part.data.sample_offset += 4;
  part.data.samples = 6;
  ASSERT_OK_AND_ASSIGN(PushResult inside, rule_->Apply(part));
  EXPECT_TRUE(inside.duplicate);
  const StatsResponse stats = state_.Stats();
  EXPECT_EQ(stats.pushes(), 1);
  EXPECT_EQ(stats.samples(), 10);
  EXPECT_EQ(stats.duplicate_pushes(), 2);
  EXPECT_EQ(stats.sample_position_by_worker().at(0),
            push.data.sample_offset + 10);
  // Examples past them are new.
  OwnedPush next = MakePush(0, 1, Filled(1.0f), 10);
  ASSERT_OK_AND_ASSIGN(PushResult later, rule_->Apply(next));
  EXPECT_FALSE(later.duplicate);
  EXPECT_EQ(later.version, 2);
}

TEST_F(DownpourRuleTest, WakesPullWaitersAfterEachPush) {
  int woken_at = -1;
  state_.WhenVersionAtLeast(
      2, [&] { woken_at = static_cast<int>(rule_->Snapshot()->version()); });
  ASSERT_OK(rule_->Apply(MakePush(0, 0, Filled(1.0f))).status());
  EXPECT_EQ(woken_at, -1);
  ASSERT_OK(rule_->Apply(MakePush(1, 0, Filled(1.0f))).status());
  EXPECT_EQ(woken_at, 2);
}

TEST_F(DownpourRuleTest, ConcurrentPushesAreEachAppliedOnce) {
  constexpr int kThreads = 4;
  constexpr int kPushes = 25;
  std::vector<std::thread> threads;
  std::vector<absl::Status> errors(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPushes; ++i) {
        absl::StatusOr<PushResult> result =
            rule_->Apply(MakePush(t, 0, Filled(0.5f)));
        if (!result.ok()) {
          errors[t] = result.status();
          return;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_OK(errors[t]);
  EXPECT_EQ(state_.version(), kThreads * kPushes);
  const StatsResponse stats = state_.Stats();
  EXPECT_EQ(stats.pushes(), kThreads * kPushes);
  EXPECT_EQ(stats.staleness_max(), kThreads * kPushes - 1);
  // Pushes are applied one at a time.
  EXPECT_EQ(stats.max_concurrent_applies(), 1);
  // Identical gradients: the result does not depend on the order, so it
  // equals the same pushes applied one by one.
  std::vector<float> reference = initial_;
  std::vector<float> next(kSize);
  AdagradOptimizer adagrad(kSize, 0.1f, 0.1f);
  for (int i = 0; i < kThreads * kPushes; ++i) {
    const std::vector<float> g = Filled(0.5f);
    adagrad.Apply({g}, reference.data(), next.data());
    reference.swap(next);
  }
  EXPECT_EQ(Weights(*rule_), reference);
}

class EasgdRuleTest : public testing::Test {
 protected:
  EasgdRuleTest()
      : config_(ResolvedConfig("layer_sizes: [3, 2] mode: EASGD")),
        state_(common::ModelLayout::FromConfig(config_), config_.seed(), 0, 1),
        rule_(MakeEasgdRule(config_, /*num_workers=*/2, &state_)),
        initial_(Weights(*rule_)) {}

  TrainingConfig config_;
  ShardState state_;
  std::unique_ptr<UpdateRule> rule_;
  const std::vector<float> initial_;
};

TEST_F(EasgdRuleTest, AddsEachElasticDifferenceToTheCenter) {
  absl::StatusOr<PushResult> result =
      rule_->Apply(MakePush(0, 0, Filled(0.5f)));
  ASSERT_OK(result.status());
  EXPECT_EQ(result->version, 1);
  EXPECT_EQ(result->staleness, 0);
  // A difference computed from version 0, one push later.
  result = rule_->Apply(MakePush(1, 0, Filled(-0.25f)));
  ASSERT_OK(result.status());
  EXPECT_EQ(result->version, 2);
  EXPECT_EQ(result->staleness, 1);
  std::vector<float> expected = initial_;
  for (float& v : expected) v = v + 0.5f + -0.25f;
  EXPECT_EQ(Weights(*rule_), expected);

  EXPECT_THAT(
      rule_->Apply(MakePush(0, 3, Filled(1.0f))),
      StatusIs(absl::StatusCode::kAborted, HasSubstr("only at version 2")));
  EXPECT_EQ(Weights(*rule_), expected);
  EXPECT_THAT(state_.Stats().staleness_counts(), ElementsAre(1, 1));
}

TEST_F(EasgdRuleTest, ADifferenceThatWouldOverflowTheCenterIsRefused) {
  ASSERT_OK(rule_->Apply(MakePush(0, 0, Filled(3e38f))).status());
  const std::vector<float> before = Weights(*rule_);
  EXPECT_THAT(rule_->Apply(MakePush(0, 1, Filled(3e38f))),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("infinite or NaN")));
  EXPECT_EQ(Weights(*rule_), before);
  EXPECT_EQ(state_.version(), 1);
  EXPECT_EQ(state_.Stats().refused_updates(), 1);
}

class HogwildRuleTest : public testing::Test {
 protected:
  HogwildRuleTest()
      : config_(ResolvedConfig(
            "layer_sizes: [3, 2] mode: HOGWILD learning_rate: 0.5")),
        state_(common::ModelLayout::FromConfig(config_), config_.seed(), 0, 1),
        rule_(MakeHogwildRule(config_, /*num_workers=*/2, &state_)),
        initial_(Weights(*rule_)) {}

  TrainingConfig config_;
  ShardState state_;
  std::unique_ptr<UpdateRule> rule_;
  const std::vector<float> initial_;
};

TEST_F(HogwildRuleTest, AppliesPlainSgdAtOnce) {
  absl::StatusOr<PushResult> result =
      rule_->Apply(MakePush(0, 0, Filled(2.0f)));
  ASSERT_OK(result.status());
  EXPECT_EQ(result->version, 1);
  EXPECT_EQ(result->staleness, 0);
  EXPECT_EQ(state_.version(), 1);
  std::vector<float> expected = initial_;
  for (float& v : expected) v -= 0.5f * 2.0f;
  EXPECT_EQ(Weights(*rule_), expected);

  EXPECT_THAT(
      rule_->Apply(MakePush(1, 2, Filled(1.0f))),
      StatusIs(absl::StatusCode::kAborted, HasSubstr("only at version 1")));
  EXPECT_EQ(Weights(*rule_), expected);

  const WeightsPtr snapshot = rule_->Snapshot();
  EXPECT_EQ(snapshot->version(), 1);
  EXPECT_EQ(Values(snapshot), expected);
}

TEST_F(HogwildRuleTest, TheStalenessAwareRateDividesTheRateByTheStaleness) {
  TrainingConfig config = config_;
  config.set_staleness_lr(true);
  ShardState state(common::ModelLayout::FromConfig(config), config.seed(), 0,
                   1);
  std::unique_ptr<UpdateRule> rule =
      MakeHogwildRule(config, /*num_workers=*/2, &state);
  std::vector<float> expected = Weights(*rule);
  ASSERT_OK(rule->Apply(MakePush(0, 0, Filled(1.0f))).status());
  ASSERT_OK(rule->Apply(MakePush(0, 1, Filled(1.0f))).status());
  ASSERT_OK(rule->Apply(MakePush(0, 2, Filled(1.0f))).status());
  // Staleness 0, 0, 0: the full rate 0.5; then staleness 3: 0.5 / 3.
  ASSERT_OK(rule->Apply(MakePush(1, 0, Filled(1.0f))).status());
  for (float& v : expected) {
    v -= 0.5f * 1.0f;
    v -= 0.5f * 1.0f;
    v -= 0.5f * 1.0f;
    v -= 0.5f / 3.0f * 1.0f;
  }
  EXPECT_EQ(Weights(*rule), expected);
}

TEST_F(HogwildRuleTest, APushThatWouldOverflowAWeightIsRefused) {
  // w - 0.5 * -3e38 twice stays finite (about 3e38); a third time it would
  // not.
  ASSERT_OK(rule_->Apply(MakePush(0, 0, Filled(-3e38f))).status());
  ASSERT_OK(rule_->Apply(MakePush(0, 1, Filled(-3e38f))).status());
  const std::vector<float> before = Weights(*rule_);
  EXPECT_THAT(rule_->Apply(MakePush(0, 2, Filled(-3e38f))),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("infinite or NaN")));
  EXPECT_EQ(Weights(*rule_), before);
  EXPECT_EQ(state_.version(), 2);
  EXPECT_EQ(state_.Stats().refused_updates(), 1);
}

TEST_F(HogwildRuleTest, ConcurrentPushesAreEachCounted) {
  constexpr int kThreads = 4;
  constexpr int kPushes = 25;
  std::vector<std::thread> threads;
  std::vector<absl::Status> errors(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPushes; ++i) {
        // Zero gradients: whatever the interleaving, the weights stay put.
        absl::StatusOr<PushResult> result =
            rule_->Apply(MakePush(t, 0, Filled(0.0f)));
        if (!result.ok()) {
          errors[t] = result.status();
          return;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_OK(errors[t]);
  EXPECT_EQ(state_.version(), kThreads * kPushes);
  const StatsResponse stats = state_.Stats();
  EXPECT_EQ(stats.pushes(), kThreads * kPushes);
  EXPECT_EQ(stats.staleness_max(), kThreads * kPushes - 1);
  EXPECT_GE(stats.max_concurrent_applies(), 1);
  EXPECT_EQ(Weights(*rule_), initial_);
}

TEST(MakeUpdateRuleTest, BuildsTheRuleOfEachImplementedMode) {
  const TrainingConfig sync = ResolvedConfig("layer_sizes: [3, 2] mode: SYNC");
  ShardState state(common::ModelLayout::FromConfig(sync), 1, 0, 1);
  // Sync with two workers waits for the second push; downpour does not.
  std::unique_ptr<UpdateRule> sync_rule = MakeUpdateRule(sync, 2, &state);
  ASSERT_NE(sync_rule, nullptr);
  absl::StatusOr<PushResult> result =
      sync_rule->Apply(MakePush(0, 0, Filled(1.0f)));
  ASSERT_OK(result.status());
  EXPECT_EQ(result->version, 0);

  const TrainingConfig downpour =
      ResolvedConfig("layer_sizes: [3, 2] mode: DOWNPOUR");
  ShardState other(common::ModelLayout::FromConfig(downpour), 1, 0, 1);
  std::unique_ptr<UpdateRule> downpour_rule =
      MakeUpdateRule(downpour, 2, &other);
  ASSERT_NE(downpour_rule, nullptr);
  result = downpour_rule->Apply(MakePush(0, 0, Filled(1.0f)));
  ASSERT_OK(result.status());
  EXPECT_EQ(result->version, 1);
}

TEST(MakeUpdateRuleTest, EveryModeHasARule) {
  for (const char* mode : {"SYNC", "DOWNPOUR", "EASGD", "HOGWILD", "ONEBIT"}) {
    SCOPED_TRACE(mode);
    const TrainingConfig config =
        ResolvedConfig(absl::StrCat("layer_sizes: [3, 2] mode: ", mode));
    ShardState state(common::ModelLayout::FromConfig(config), 1, 0, 1);
    EXPECT_NE(MakeUpdateRule(config, 2, &state), nullptr);
  }
  const common::ModelLayout layout({3, 2});
  ShardState state(layout, 1, 0, 1);
  TrainingConfig unspecified;
  unspecified.set_mode(MODE_UNSPECIFIED);
  EXPECT_EQ(MakeUpdateRule(unspecified, 2, &state), nullptr);
}

TEST(MakeUpdateRuleTest, OnebitShardsApplyDecodedPushesLikeDownpour) {
  const TrainingConfig config = ResolvedConfig(
      "layer_sizes: [3, 2] mode: ONEBIT learning_rate: 0.1 "
      "adagrad_initial_accumulator: 0.1");
  ShardState state(common::ModelLayout::FromConfig(config), 1, 0, 1);
  std::unique_ptr<UpdateRule> rule = MakeUpdateRule(config, 2, &state);
  ASSERT_NE(rule, nullptr);
  const std::vector<float> initial = Weights(*rule);
  absl::StatusOr<PushResult> result = rule->Apply(MakePush(0, 0, Filled(1.0f)));
  ASSERT_OK(result.status());
  EXPECT_EQ(result->version, 1);
  std::vector<float> expected = initial;
  for (float& v : expected) v -= 0.1f * 1.0f / std::sqrt(1.1f);
  EXPECT_EQ(Weights(*rule), expected);
}

}  // namespace
}  // namespace monsoon::server
