// hogwild (Niu, Recht, Re and Wright 2011): every push is applied at once with
// plain SGD and no lock. Concurrent pushes race element by element: each
// element is a relaxed atomic load and store, so there is no undefined
// behaviour, but one push's write may overwrite another's, as in Hogwild.
// Pulls read a snapshot that may mix pushes (also as in Hogwild).

#include <atomic>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/update_rule.h"

namespace monsoon::server {
namespace {

class HogwildRule : public UpdateRule {
 public:
  HogwildRule(const TrainingConfig& resolved, ShardState* state)
      : learning_rate_(resolved.learning_rate()), state_(state) {}

  absl::StatusOr<PushResult> Apply(const PushData& push) override {
    const int64_t now = version_.load();
    if (push.base_version > now) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push computed from version ", push.base_version, " but shard ",
          state_->shard(), " is only at version ", now));
    }
    auto weights = state_->weights();
    state_->BeginApply();
    for (size_t i = 0; i < weights.size(); ++i) {
      weights[i].store(weights[i].load(std::memory_order_relaxed) -
                           learning_rate_ * push.values[i],
                       std::memory_order_relaxed);
    }
    state_->EndApply();
    // Versions count applied pushes; staleness counts the pushes applied
    // since the gradient's weights were read.
    const int64_t before = version_.fetch_add(1);
    PushResult result;
    result.version = before + 1;
    result.staleness = before - push.base_version;
    state_->RecordPush(result.staleness, push.samples, push.wire_bytes);
    state_->RecordAppliedSamples(push.worker_rank, push.samples);
    for (auto& waiter : state_->AdvanceVersion(result.version)) waiter();
    return result;
  }

  void Snapshot(std::vector<float>* weights, int64_t* version) override {
    *version = version_.load();
    state_->CopyWeights(weights);
  }

  // Plain SGD keeps no optimizer state. Consistent only when no push runs.
  RuleState SaveState() override {
    return SaveRuleState(*state_, version_.load(), nullptr);
  }

  absl::Status RestoreState(const RuleState& saved) override {
    absl::Status restored = RestoreWeightsAndOptimizer(saved, state_, nullptr);
    if (!restored.ok()) return restored;
    version_.store(saved.version);
    for (auto& waiter : state_->AdvanceVersion(saved.version)) waiter();
    return absl::OkStatus();
  }

 private:
  // Constant after construction.
  const float learning_rate_;
  ShardState* const state_;

  std::atomic<int64_t> version_{0};
};

}  // namespace

std::unique_ptr<UpdateRule> MakeHogwildRule(const TrainingConfig& resolved,
                                            ShardState* state) {
  return std::make_unique<HogwildRule>(resolved, state);
}

}  // namespace monsoon::server
