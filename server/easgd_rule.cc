// easgd (asynchronous Elastic Averaging SGD, Zhang, Choromanska and LeCun
// 2015, Algorithm 1): the shard holds the center variable x~. A worker pushes
// its elastic difference d = alpha * (x - x~) and the shard adds it:
// x~ += d, one push at a time. No optimizer: the workers' local steps train.

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/update_rule.h"

namespace monsoon::server {
namespace {

class EasgdRule : public UpdateRule {
 public:
  explicit EasgdRule(ShardState* state) : state_(state) {}

  absl::StatusOr<PushResult> Apply(const PushData& push) override {
    std::vector<ShardState::Waiter> ready;
    PushResult result;
    {
      absl::MutexLock lock(&mu_);
      if (push.base_version > version_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "elastic update from center version ", push.base_version,
            " but shard ", state_->shard(), " is only at version ", version_));
      }
      result.staleness = version_ - push.base_version;
      auto weights = state_->weights();
      state_->BeginApply();
      for (size_t i = 0; i < weights.size(); ++i) {
        weights[i].store(
            weights[i].load(std::memory_order_relaxed) + push.values[i],
            std::memory_order_relaxed);
      }
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
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::unique_ptr<UpdateRule> MakeEasgdRule(ShardState* state) {
  return std::make_unique<EasgdRule>(state);
}

}  // namespace monsoon::server
