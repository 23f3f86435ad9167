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
        arrived_(num_workers, false),
        step_samples_(num_workers, 0),
        step_offsets_(num_workers, 0) {}

  absl::StatusOr<PushResult> Apply(const PushData& push) override {
    std::vector<ShardState::Waiter> ready;
    PushResult result;
    {
      absl::MutexLock lock(&mu_);
      const int64_t version = weights_->version();
      if (state_->IsRepeat(push.worker_rank, push.sample_offset,
                           push.samples)) {
        // A step already closed with these examples in it.
        result.version = version;
        result.duplicate = true;
        return result;
      }
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
      step_offsets_[push.worker_rank] = push.sample_offset;
      ++count_;
      // The sum is 0 + g1 + g2 + ..., as adding to a zeroed sum would (0 +
      // turns -0 into +0), in fewer passes: the step's first push becomes
      // the sum (its buffer taken over, not copied), the 0 + done by the
      // next pass over it; the last push of several is added as the
      // optimizer applies the sum (CloseStep).
      const bool closes = count_ == num_workers_;
      const size_t n = state_->size();
      const float* __restrict g = push.values.data();
      if (count_ == 1) {
        if (push.buffer != nullptr && *push.buffer != nullptr) {
          sum_ = std::move(*push.buffer);
        } else {
          sum_ = state_->buffers().Take();
          std::copy(g, g + n, sum_.get());
        }
        sum_plus_zero_ = true;
      } else if (!closes) {
        float* __restrict sum = sum_.get();
        if (sum_plus_zero_) {
          for (size_t i = 0; i < n; ++i) sum[i] = (0.0f + sum[i]) + g[i];
        } else {
          for (size_t i = 0; i < n; ++i) sum[i] += g[i];
        }
        sum_plus_zero_ = false;
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
      sum_.reset();
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
    const Gradient mean{absl::MakeConstSpan(sum_.get(), state_->size()), last,
                        1.0f / static_cast<float>(num_workers_),
                        sum_plus_zero_};
    state_->BeginApply();
    WriteNextVersion(
        state_, &weights_, weights_->version() + 1,
        [&](const float* in, float* out) { optimizer_->Apply(mean, in, out); });
    state_->EndApply();
    sum_.reset();  // back to the pool
    std::fill(arrived_.begin(), arrived_.end(), false);
    // Only now are the step's examples in the weights.
    for (int rank = 0; rank < num_workers_; ++rank) {
      state_->RecordAppliedSamples(rank, step_samples_[rank]);
      state_->AdvancePosition(rank, step_offsets_[rank], step_samples_[rank]);
    }
    count_ = 0;
  }

  // Constant after construction.
  const int num_workers_;
  ShardState* const state_;

  absl::Mutex mu_;
  const std::unique_ptr<Optimizer> optimizer_ ABSL_PT_GUARDED_BY(mu_);
  std::shared_ptr<Weights> weights_ ABSL_GUARDED_BY(mu_);  // last closed step
  // The step's gradients summed (see Apply): the first push's buffer, null
  // between steps; and whether its values still need 0 + (that is, hold
  // the first push alone).
  FloatBufferPool::Buffer sum_ ABSL_GUARDED_BY(mu_);
  bool sum_plus_zero_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<bool> arrived_ ABSL_GUARDED_BY(mu_);
  // Examples behind each worker's gradient for the step in progress.
  std::vector<int64_t> step_samples_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> step_offsets_ ABSL_GUARDED_BY(mu_);
  int count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::unique_ptr<UpdateRule> MakeSyncRule(const TrainingConfig& resolved,
                                         int num_workers, ShardState* state) {
  return std::make_unique<SyncRule>(resolved, num_workers, state);
}

}  // namespace monsoon::server
