// downpour (Dean et al. 2012): each push is applied at once with the server
// optimizer, one push at a time per shard, however stale it is; staleness is
// recorded, not refused.

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/optimizer.h"
#include "server/update_rule.h"

namespace monsoon::server {
namespace {

class DownpourRule : public UpdateRule {
 public:
  DownpourRule(const TrainingConfig& resolved, ShardState* state)
      : state_(state), optimizer_(MakeOptimizer(resolved, state->size())) {}

  absl::StatusOr<PushResult> Apply(const PushData& push) override {
    std::vector<ShardState::Waiter> ready;
    PushResult result;
    {
      absl::MutexLock lock(&mu_);
      if (push.base_version > version_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "push computed from version ", push.base_version, " but shard ",
            state_->shard(), " is only at version ", version_));
      }
      result.staleness = version_ - push.base_version;
      state_->BeginApply();
      optimizer_->Apply(push.values, state_->weights());
      state_->EndApply();
      ++version_;
      result.version = version_;
      state_->RecordPush(result.staleness, push.samples, push.wire_bytes);
      ready = state_->AdvanceVersion(version_);
    }
    for (auto& waiter : ready) waiter();
    return result;
  }

  void Snapshot(std::vector<float>* weights, int64_t* version) override {
    absl::MutexLock lock(&mu_);
    state_->CopyWeights(weights);
    *version = version_;
  }

 private:
  ShardState* const state_;  // constant after construction

  absl::Mutex mu_;
  const std::unique_ptr<Optimizer> optimizer_ ABSL_PT_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::unique_ptr<UpdateRule> MakeDownpourRule(const TrainingConfig& resolved,
                                             ShardState* state) {
  return std::make_unique<DownpourRule>(resolved, state);
}

}  // namespace monsoon::server
