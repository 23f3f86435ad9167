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
        weights_(state->InitialWeights()),
        sum_(state->size()),
        arrived_(num_workers, false),
        step_samples_(num_workers, 0) {}

  absl::StatusOr<PushResult> Apply(const PushData& push) override {
    std::vector<ShardState::Waiter> ready;
    PushResult result;
    {
      absl::MutexLock lock(&mu_);
      const int64_t version = weights_->version();
      if (push.base_version < version) {
        return absl::AbortedError(
            absl::StrCat("sync push for step ", push.base_version,
                         " but shard ", state_->shard(), " is at version ",
                         version, ": that step is closed; pull and retry"));
      }
      if (push.base_version > version) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sync push for step ", push.base_version, " but shard ",
            state_->shard(), " is only at version ", version));
      }
      if (arrived_[push.worker_rank]) {
        return absl::AlreadyExistsError(
            absl::StrCat("worker ", push.worker_rank, " already pushed step ",
                         version, " to shard ", state_->shard()));
      }
      arrived_[push.worker_rank] = true;
      step_samples_[push.worker_rank] = push.samples;
      ++count_;
      // The step's first gradient starts the sum: 0 + g, as adding to a
      // zeroed sum would (it turns -0 into +0), without the zeroing pass.
      // The last one of several is added as the optimizer applies the sum
      // (CloseStep), without a pass of its own.
      const bool closes = count_ == num_workers_;
      const size_t n = sum_.size();
      float* __restrict sum = sum_.data();
      const float* __restrict g = push.values.data();
      if (count_ == 1) {
        for (size_t i = 0; i < n; ++i) sum[i] = 0.0f + g[i];
      } else if (!closes) {
        for (size_t i = 0; i < n; ++i) sum[i] += g[i];
      }
      state_->RecordPush(/*staleness=*/0, push.samples, push.wire_bytes);
      result.version = version;
      if (closes) {
        CloseStep(count_ == 1 ? nullptr : g);
        result.version = weights_->version();
        ready = state_->AdvanceVersion(result.version);
      }
    }
    state_->RunWaiters(std::move(ready));
    return result;
  }

  WeightsPtr Snapshot() override {
    absl::MutexLock lock(&mu_);
    return Weights::Share(weights_);
  }

  // The last completed step; the partial sum of the step in progress is not
  // part of it (see update_rule.h).
  RuleState SaveState() override {
    absl::MutexLock lock(&mu_);
    return SaveRuleState(*state_, weights_->version(), weights_->values(),
                         optimizer_.get());
  }

  absl::Status RestoreState(const RuleState& saved) override {
    std::vector<ShardState::Waiter> ready;
    {
      absl::MutexLock lock(&mu_);
      absl::StatusOr<std::shared_ptr<Weights>> restored =
          RestoreWeightsAndOptimizer(saved, state_, optimizer_.get());
      if (!restored.ok()) return restored.status();
      weights_ = *std::move(restored);
      std::fill(arrived_.begin(), arrived_.end(), false);
      std::fill(step_samples_.begin(), step_samples_.end(), 0);
      count_ = 0;
      ready = state_->AdvanceVersion(weights_->version());
    }
    state_->RunWaiters(std::move(ready));
    return absl::OkStatus();
  }

 private:
  // Averages the step's gradients (the sum, plus `last` where the last push
  // is not in it yet) and publishes the next version.
  void CloseStep(const float* last) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Gradient mean{sum_, last, 1.0f / static_cast<float>(num_workers_)};
    state_->BeginApply();
    WriteNextVersion(
        state_, &weights_, weights_->version() + 1,
        [&](const float* in, float* out) { optimizer_->Apply(mean, in, out); });
    state_->EndApply();
    std::fill(arrived_.begin(), arrived_.end(), false);
    // Only now are the step's examples in the weights.
    for (int rank = 0; rank < num_workers_; ++rank) {
      state_->RecordAppliedSamples(rank, step_samples_[rank]);
    }
    count_ = 0;
  }

  // Constant after construction.
  const int num_workers_;
  ShardState* const state_;

  absl::Mutex mu_;
  const std::unique_ptr<Optimizer> optimizer_ ABSL_PT_GUARDED_BY(mu_);
  std::shared_ptr<Weights> weights_ ABSL_GUARDED_BY(mu_);  // last closed step
  // The step's gradients summed; its first push overwrites it.
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
