// sync: a barrier per step. Every worker pushes its step-t gradient (computed
// from version t); when all have arrived the shard averages them, applies the
// optimizer once and becomes version t+1, which wakes the pulls waiting for it.

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/optimizer.h"
#include "server/update_rule.h"

namespace monsoon::server {
namespace {

class SyncRule : public UpdateRule {
 public:
  SyncRule(const TrainingConfig& resolved, int num_workers, ShardState* state)
      : num_workers_(num_workers),
        state_(state),
        optimizer_(MakeOptimizer(resolved, state->size())),
        sum_(state->size(), 0.0f),
        arrived_(num_workers, false),
        step_samples_(num_workers, 0) {}

  absl::StatusOr<PushResult> Apply(const PushData& push) override {
    std::vector<ShardState::Waiter> ready;
    PushResult result;
    {
      absl::MutexLock lock(&mu_);
      if (push.base_version < version_) {
        return absl::AbortedError(
            absl::StrCat("sync push for step ", push.base_version,
                         " but shard ", state_->shard(), " is at version ",
                         version_, ": that step is closed; pull and retry"));
      }
      if (push.base_version > version_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sync push for step ", push.base_version, " but shard ",
            state_->shard(), " is only at version ", version_));
      }
      if (arrived_[push.worker_rank]) {
        return absl::AlreadyExistsError(
            absl::StrCat("worker ", push.worker_rank, " already pushed step ",
                         version_, " to shard ", state_->shard()));
      }
      arrived_[push.worker_rank] = true;
      step_samples_[push.worker_rank] = push.samples;
      ++count_;
      for (size_t i = 0; i < sum_.size(); ++i) sum_[i] += push.values[i];
      state_->RecordPush(/*staleness=*/0, push.samples, push.wire_bytes);
      if (count_ == num_workers_) {
        const float scale = 1.0f / static_cast<float>(num_workers_);
        for (float& v : sum_) v *= scale;
        state_->BeginApply();
        optimizer_->Apply(sum_, state_->weights());
        state_->EndApply();
        std::fill(sum_.begin(), sum_.end(), 0.0f);
        std::fill(arrived_.begin(), arrived_.end(), false);
        // Only now are the step's examples in the weights.
        for (int rank = 0; rank < num_workers_; ++rank) {
          state_->RecordAppliedSamples(rank, step_samples_[rank]);
        }
        count_ = 0;
        ++version_;
        ready = state_->AdvanceVersion(version_);
      }
      result.version = version_;
    }
    for (auto& waiter : ready) waiter();
    return result;
  }

  void Snapshot(std::vector<float>* weights, int64_t* version) override {
    absl::MutexLock lock(&mu_);
    state_->CopyWeights(weights);
    *version = version_;
  }

  // The last completed step; the partial sum of the step in progress is not
  // part of it (see update_rule.h).
  RuleState SaveState() override {
    absl::MutexLock lock(&mu_);
    return SaveRuleState(*state_, version_, optimizer_.get());
  }

  absl::Status RestoreState(const RuleState& saved) override {
    std::vector<ShardState::Waiter> ready;
    {
      absl::MutexLock lock(&mu_);
      absl::Status restored =
          RestoreWeightsAndOptimizer(saved, state_, optimizer_.get());
      if (!restored.ok()) return restored;
      version_ = saved.version;
      std::fill(sum_.begin(), sum_.end(), 0.0f);
      std::fill(arrived_.begin(), arrived_.end(), false);
      std::fill(step_samples_.begin(), step_samples_.end(), 0);
      count_ = 0;
      ready = state_->AdvanceVersion(version_);
    }
    for (auto& waiter : ready) waiter();
    return absl::OkStatus();
  }

 private:
  // Constant after construction.
  const int num_workers_;
  ShardState* const state_;

  absl::Mutex mu_;
  const std::unique_ptr<Optimizer> optimizer_ ABSL_PT_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<float> sum_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> arrived_ ABSL_GUARDED_BY(mu_);
  // Examples behind each worker's gradient for the step in progress.
  std::vector<int64_t> step_samples_ ABSL_GUARDED_BY(mu_);
  int count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::unique_ptr<UpdateRule> MakeSyncRule(const TrainingConfig& resolved,
                                         int num_workers, ShardState* state) {
  return std::make_unique<SyncRule>(resolved, num_workers, state);
}

}  // namespace monsoon::server
