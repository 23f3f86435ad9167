// hogwild (Niu, Recht, Re and Wright 2011): every push is applied at once with
// plain SGD and no lock. Concurrent pushes race element by element: each
// element is a relaxed atomic load and store, so there is no undefined
// behaviour, but one push's write may overwrite another's, as in Hogwild.
// The weights are one buffer written in place; a pull sends a copy taken
// with relaxed loads, which may mix pushes (also as in Hogwild), shared by
// the pulls of the same version.

#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/update_rule.h"

namespace monsoon::server {
namespace {

// Element-wise relaxed atomics on plain floats (what C++20's atomic_ref
// does); the compiler and ThreadSanitizer treat them as atomic accesses.
inline float LoadRelaxed(const float* p) {
  float v;
  __atomic_load(p, &v, __ATOMIC_RELAXED);
  return v;
}
inline void StoreRelaxed(float* p, float v) {
  __atomic_store(p, &v, __ATOMIC_RELAXED);
}

class HogwildRule : public UpdateRule {
 public:
  HogwildRule(const TrainingConfig& resolved, ShardState* state)
      : learning_rate_(resolved.learning_rate()),
        state_(state),
        live_(state->InitialWeights()) {}

  absl::StatusOr<PushResult> Apply(const PushData& push) override {
    const int64_t now = version_.load();
    if (push.base_version > now) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push computed from version ", push.base_version, " but shard ",
          state_->shard(), " is only at version ", now));
    }
    if (!state_->ClaimSamples(push.worker_rank, push.sample_offset,
                              push.samples)) {
      PushResult repeat;
      repeat.version = now;
      repeat.duplicate = true;
      return repeat;
    }
    float* weights = live_->mutable_data();
    const float* grad = push.values.data();
    const size_t n = push.values.size();
    state_->BeginApply();
    for (size_t i = 0; i < n; ++i) {
      StoreRelaxed(&weights[i],
                   LoadRelaxed(&weights[i]) - learning_rate_ * grad[i]);
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
    state_->RunWaiters(state_->AdvanceVersion(result.version));
    return result;
  }

  WeightsPtr Snapshot() override {
    const int64_t version = version_.load();
    {
      absl::MutexLock lock(&snapshot_mu_);
      if (snapshot_ != nullptr && snapshot_->version() == version) {
        return snapshot_;
      }
    }
    FloatBufferPool::Buffer copy = state_->buffers().Take();
    CopyLive(copy.get());
    auto taken = std::make_shared<const Weights>(version, std::move(copy),
                                                 state_->size());
    absl::MutexLock lock(&snapshot_mu_);
    if (snapshot_ == nullptr || snapshot_->version() <= version) {
      snapshot_ = taken;
    }
    return taken;
  }

  // Plain SGD keeps no optimizer state. Consistent only when no push runs.
  RuleState SaveState() override {
    std::vector<float> weights(state_->size());
    const int64_t version = version_.load();
    CopyLive(weights.data());
    return SaveRuleState(*state_, version, weights, nullptr);
  }

  // Before serving only (see update_rule.h): nothing else runs.
  absl::Status RestoreState(const RuleState& saved) override {
    absl::StatusOr<std::shared_ptr<Weights>> restored =
        RestoreWeightsAndOptimizer(saved, state_, nullptr);
    if (!restored.ok()) return restored.status();
    live_ = *std::move(restored);
    version_.store(saved.version);
    {
      absl::MutexLock lock(&snapshot_mu_);
      snapshot_ = nullptr;
    }
    state_->RunWaiters(state_->AdvanceVersion(saved.version));
    return absl::OkStatus();
  }

 private:
  void CopyLive(float* out) const {
    const float* weights = live_->values().data();
    for (size_t i = 0; i < state_->size(); ++i) {
      out[i] = LoadRelaxed(&weights[i]);
    }
  }

  // Constant after construction.
  const float learning_rate_;
  ShardState* const state_;
  // Written in place by every push (relaxed atomics); replaced only by
  // RestoreState, before serving.
  std::shared_ptr<Weights> live_;

  std::atomic<int64_t> version_{0};
  absl::Mutex snapshot_mu_;
  WeightsPtr snapshot_ ABSL_GUARDED_BY(snapshot_mu_);  // the latest taken
};

}  // namespace

std::unique_ptr<UpdateRule> MakeHogwildRule(const TrainingConfig& resolved,
                                            ShardState* state) {
  return std::make_unique<HogwildRule>(resolved, state);
}

}  // namespace monsoon::server
