// The shard's decisions without sockets: registration checks, leaving,
// finishing, closing the run, pull admission, the sync barrier and the
// answer to a repeated push.
#include "server/shard.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "common/config.h"
#include "common/model_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard_state.h"
#include "server/update_rule.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace monsoon::server {
namespace {

using ::monsoon::testutil::ResolvedConfig;
using ::monsoon::testutil::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// layer_sizes {3, 2}: 8 parameters on one shard; two workers.
constexpr size_t kSize = 8;
constexpr int kWorkers = 2;

class ShardTest : public testing::Test {
 protected:
  explicit ShardTest(const char* config =
                         "layer_sizes: [3, 2] mode: SYNC optimizer: SGD "
                         "learning_rate: 0.5 momentum: 0")
      : config_(ResolvedConfig(config)),
        state_(common::ModelLayout::FromConfig(config_), config_.seed(), 0, 1),
        rule_(MakeUpdateRule(config_, kWorkers, &state_)),
        shard_(config_, kWorkers, &state_, rule_.get(), absl::Seconds(30)) {
    state_.SetNumWorkers(kWorkers);  // as ShardServer does
  }

  RegisterRequest Registration(int rank, uint64_t session) const {
    RegisterRequest request;
    request.set_worker_rank(rank);
    request.set_config_fingerprint(common::ConfigFingerprint(config_));
    request.set_num_workers(kWorkers);
    request.set_num_shards(1);
    request.set_session(session);
    return request;
  }

  LeaveRequest Leaving(int rank, uint64_t session) const {
    LeaveRequest request;
    request.set_worker_rank(rank);
    request.set_config_fingerprint(common::ConfigFingerprint(config_));
    request.set_session(session);
    return request;
  }

  CloseRunRequest Closing() const {
    CloseRunRequest request;
    request.set_config_fingerprint(common::ConfigFingerprint(config_));
    return request;
  }

  // A push of `value` everywhere from `rank`, holding `session`, of 4
  // examples starting at `offset`. Its values live in `values_`.
  PushData Push(int rank, uint64_t session, float value, int64_t offset = 0,
                int64_t base_version = 0) {
    values_.push_back(std::make_unique<std::vector<float>>(kSize, value));
    PushData push;
    push.worker_rank = rank;
    push.session = session;
    push.base_version = base_version;
    push.samples = 4;
    push.sample_offset = offset;
    push.values = *values_.back();
    return push;
  }

  std::vector<float> Weights() const {
    const WeightsPtr weights = rule_->Snapshot();
    return std::vector<float>(weights->values().begin(),
                              weights->values().end());
  }

  TrainingConfig config_;
  ShardState state_;
  std::unique_ptr<UpdateRule> rule_;
  Shard shard_;
  std::vector<std::unique_ptr<std::vector<float>>> values_;
};

TEST_F(ShardTest, RegistrationAnswersTheShardsRangeAndResumePoint) {
  ASSERT_OK_AND_ASSIGN(RegisterResponse response,
                       shard_.Register(Registration(0, 7)));
  EXPECT_EQ(response.shard(), 0);
  EXPECT_EQ(response.num_shards(), 1);
  EXPECT_EQ(response.offset(), 0u);
  EXPECT_EQ(response.length(), kSize);
  EXPECT_EQ(response.version(), 0);
  EXPECT_EQ(response.samples_applied(), 0);
}

TEST_F(ShardTest, ACallerOfAnotherRunIsRefusedSayingWhy) {
  RegisterRequest other_config = Registration(0, 7);
  other_config.set_config_fingerprint(other_config.config_fingerprint() + 1);
  EXPECT_THAT(shard_.Register(other_config).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("config fingerprint")));
  RegisterRequest other_shard = Registration(0, 7);
  other_shard.set_shard(1);
  EXPECT_THAT(shard_.Register(other_shard).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("this is shard 0, not shard 1")));
  RegisterRequest other_count = Registration(0, 7);
  other_count.set_num_workers(3);
  EXPECT_THAT(shard_.Register(other_count).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("--num_workers=3")));
  EXPECT_THAT(shard_.Register(Registration(2, 7)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("worker rank 2 is outside [0, 2)")));
  // None of them took the rank: a real worker registers it.
  EXPECT_OK(shard_.Register(Registration(0, 9)).status());
}

// A rank held by a live process is refused to another, unless that one
// names the holder's session as the one it replaces (a launcher starting a
// worker in place of one it saw die): it takes the rank at once, and the
// old session may act for the rank no more.
TEST_F(ShardTest, AProcessThatReplacesTheHoldersSessionTakesTheRankAtOnce) {
  ASSERT_OK(shard_.Register(Registration(0, 7)).status());
  EXPECT_THAT(shard_.Register(Registration(0, 9)).status(),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       HasSubstr("two workers started with --rank=0")));
  RegisterRequest replaces_another = Registration(0, 9);
  replaces_another.set_replaces_session(8);
  EXPECT_THAT(shard_.Register(replaces_another).status(),
              StatusIs(absl::StatusCode::kAlreadyExists));
  RegisterRequest replacement = Registration(0, 9);
  replacement.set_replaces_session(7);
  EXPECT_OK(shard_.Register(replacement).status());
  EXPECT_THAT(state_.CheckSession(0, 7),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_OK(state_.CheckSession(0, 9));
  // The dead session's name takes the rank from the replacement no more.
  RegisterRequest back = Registration(0, 7);
  back.set_replaces_session(7);
  EXPECT_THAT(shard_.Register(back).status(),
              StatusIs(absl::StatusCode::kAlreadyExists));
}

// A client of an older build left through Register; taken as a
// registration, its leave would bind the rank again.
TEST_F(ShardTest, ALeaveSentAsARegistrationIsRefusedAndChangesNothing) {
  ASSERT_OK(shard_.Register(Registration(0, 7)).status());
  RegisterRequest old_leave = Registration(0, 7);
  old_leave.set_leaving(true);
  EXPECT_THAT(shard_.Register(old_leave).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("older build")));
  EXPECT_FALSE(state_.HasLeft(0));
  EXPECT_OK(state_.CheckSession(0, 7));
}

TEST_F(ShardTest, OnlyTheRanksSessionMayLeaveOrFinishIt) {
  ASSERT_OK(shard_.Register(Registration(0, 7)).status());
  EXPECT_THAT(shard_.Leave(Leaving(0, 8)),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(shard_.FinishRank(Leaving(0, 0)),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_FALSE(state_.HasLeft(0));
  EXPECT_THAT(shard_.Stats().finished_ranks(), IsEmpty());
  EXPECT_OK(shard_.Leave(Leaving(0, 7)));
  EXPECT_TRUE(state_.HasLeft(0));
  EXPECT_THAT(shard_.Stats().finished_ranks(), IsEmpty());
}

TEST_F(ShardTest, TheRunClosesOnlyOnceEveryRankHasFinished) {
  ASSERT_OK(shard_.Register(Registration(0, 7)).status());
  ASSERT_OK(shard_.Register(Registration(1, 9)).status());
  EXPECT_OK(shard_.FinishRank(Leaving(0, 7)));
  EXPECT_THAT(shard_.Stats().finished_ranks(), ElementsAre(0));
  EXPECT_THAT(shard_.CloseRun(Closing()),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_FALSE(shard_.Stats().run_closed());
  EXPECT_OK(shard_.FinishRank(Leaving(1, 9)));
  EXPECT_TRUE(shard_.Stats().workers_finished());
  CloseRunRequest wrong_shard = Closing();
  wrong_shard.set_shard(1);
  EXPECT_THAT(shard_.CloseRun(wrong_shard),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_OK(shard_.CloseRun(Closing()));
  EXPECT_TRUE(shard_.Stats().run_closed());
}

TEST_F(ShardTest, APullIsAdmittedOnlyWithItsRanksSession) {
  ASSERT_OK(shard_.Register(Registration(0, 7)).status());
  PullRequest pull;
  pull.set_worker_rank(0);
  pull.set_session(8);
  EXPECT_THAT(shard_.AdmitPull(pull),
              StatusIs(absl::StatusCode::kPermissionDenied));
  pull.set_session(7);
  EXPECT_OK(shard_.AdmitPull(pull));
  pull.set_min_version(-1);
  EXPECT_THAT(shard_.AdmitPull(pull),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("min_version must not be negative")));
  PullRequest evaluator;
  evaluator.set_worker_rank(-1);  // needs no session
  EXPECT_OK(shard_.AdmitPull(evaluator));
  evaluator.set_worker_rank(-2);
  EXPECT_THAT(shard_.AdmitPull(evaluator),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// The sync barrier: a step closes once every rank has pushed, applying the
// mean of the pushes once; a push sent again while its step collects is
// answered as a duplicate that waits for the step.
TEST_F(ShardTest, ASyncStepClosesWithEveryRankAndAnswersARepeat) {
  ASSERT_OK(shard_.Register(Registration(0, 7)).status());
  ASSERT_OK(shard_.Register(Registration(1, 9)).status());
  const std::vector<float> initial = Weights();

  ASSERT_OK_AND_ASSIGN(AppliedPush first,
                       shard_.ApplyPush(Push(0, 7, 1.0f), false));
  EXPECT_EQ(first.result.version, 0);
  EXPECT_EQ(Shard::VersionToAwait(first), 1);
  EXPECT_EQ(state_.version(), 0);
  // Sent again: refused as a push, answered as a push-pull's.
  EXPECT_THAT(shard_.ApplyPush(Push(0, 7, 1.0f), false).status(),
              StatusIs(absl::StatusCode::kAlreadyExists));
  ASSERT_OK_AND_ASSIGN(AppliedPush repeat,
                       shard_.ApplyPush(Push(0, 7, 1.0f), true));
  EXPECT_TRUE(repeat.result.duplicate);
  EXPECT_TRUE(repeat.repeat_in_step);
  EXPECT_EQ(Shard::VersionToAwait(repeat), 1);
  // Another process's push for rank 0 is refused and counted.
  EXPECT_THAT(shard_.ApplyPush(Push(0, 8, 100.0f), false).status(),
              StatusIs(absl::StatusCode::kPermissionDenied));

  ASSERT_OK_AND_ASSIGN(AppliedPush second,
                       shard_.ApplyPush(Push(1, 9, 3.0f), false));
  EXPECT_EQ(state_.version(), 1);
  EXPECT_EQ(Shard::VersionToAwait(second), 1);
  const std::vector<float> weights = Weights();
  for (size_t i = 0; i < kSize; ++i) {
    EXPECT_EQ(weights[i], initial[i] - 0.5f * 2.0f) << i;  // mean of 1, 3
  }
  // The step has closed: its repeat is stale now, and gets the weights as
  // they are.
  ASSERT_OK_AND_ASSIGN(AppliedPush late,
                       shard_.ApplyPush(Push(0, 7, 1.0f), true));
  EXPECT_TRUE(late.result.stale || late.result.duplicate);
  EXPECT_EQ(Shard::VersionToAwait(late), 0);
  const StatsResponse stats = shard_.Stats();
  EXPECT_EQ(stats.rejected_pushes_by_code().at("PERMISSION_DENIED"), 1);
}

// A push that began a later step than its base (a sync shard that went
// back passed the step over: sync_rule.cc) waits for the step it is in.
TEST_F(ShardTest, APushThatBeganALaterStepWaitsForIt) {
  AppliedPush push;
  push.base_version = 4;
  push.result.version = 5;
  EXPECT_EQ(Shard::VersionToAwait(push), 5);
  push.result.await_version = 6;
  EXPECT_EQ(Shard::VersionToAwait(push), 6);
}

TEST_F(ShardTest, AWaitThatOutlastsItsBoundSaysWhatItWaitedFor) {
  EXPECT_THAT(shard_.WaitExpired("pull", 5),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("pull waited 30s for version 5 of shard 0, "
                                 "which is at version 0")));
}

}  // namespace
}  // namespace monsoon::server
