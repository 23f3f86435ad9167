// hogwild (Niu, Recht, Re and Wright 2011): every push is applied at once with
// plain SGD and no lock. Concurrent pushes race element by element: each
// element is a relaxed atomic load and store, so there is no undefined
// behaviour, but one push's write may overwrite another's, as in Hogwild.
// The weights are one buffer written in place; a pull sends a copy taken
// with relaxed loads, which may mix pushes (also as in Hogwild), shared by
// the pulls of the same version.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/optimizer.h"
#include "server/policies/policy_factory.h"
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
        staleness_rate_(
            MakePolicies(resolved, 0, state->size()).staleness_rate),
        state_(state),
        live_(state->InitialWeights()) {
    absl::MutexLock lock(&bound_mu_);
    weight_bound_.Reset(MaxAbsLive());
  }

  absl::StatusOr<PushResult> Apply(const PushData& push) override {
    const int64_t now = version_.load();
    if (push.base_version > now) {
      return FutureVersionError(state_->shard(), push.base_version, now);
    }
    // The bound on the weights usually guarantees that the push cannot
    // overflow them; its step is reserved at once, so that pushes running
    // together count each other's. Otherwise the push is checked against
    // the weights as it reads them: without a lock a concurrent push may
    // still move them between the check and the write (a race Hogwild
    // accepts for every update; the bounds' margin covers it).
    float* weights = live_->mutable_data();
    const float* grad = push.values.data();
    const size_t n = push.values.size();
    // staleness_lr: the rate over the staleness the push has as its write
    // begins (pushes writing at the same time may still add to it).
    const float lr =
        staleness_rate_.Rate(learning_rate_, now - push.base_version);
    const double step = std::abs(lr) * static_cast<double>(push.max_abs);
    bool bounded;
    {
      absl::MutexLock lock(&bound_mu_);
      bounded = weight_bound_.Allows(step);
      if (bounded) weight_bound_.Advance(step);
    }
    if (!bounded && !AllFinite(
                        n, [=](size_t i) { return grad[i]; },
                        [=](size_t i, float g) {
                          return NonFinite(LoadRelaxed(&weights[i]) - lr * g);
                        })) {
      state_->RecordRefusedUpdate();
      return NonFiniteUpdateError(state_->shard(), push.worker_rank, now);
    }
    if (!state_->ClaimSamples(push.worker_rank, push.sample_offset,
                              push.samples)) {
      PushResult repeat;
      repeat.version = now;
      repeat.duplicate = true;
      return repeat;
    }
    const absl::Time began = state_->BeginApply();
    for (size_t i = 0; i < n; ++i) {
      StoreRelaxed(&weights[i], LoadRelaxed(&weights[i]) - lr * grad[i]);
    }
    state_->EndApply(began);
    if (!bounded) {
      absl::MutexLock lock(&bound_mu_);
      weight_bound_.Reset(MaxAbsLive());
    }
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
      absl::MutexLock lock(&bound_mu_);
      weight_bound_.Reset(MaxAbsLive());
    }
    {
      absl::MutexLock lock(&snapshot_mu_);
      snapshot_ = nullptr;
    }
    state_->RunWaiters(state_->AdvanceVersion(saved.version));
    return absl::OkStatus();
  }

 private:
  // The weights' largest magnitude, read as CopyLive reads them; infinity if
  // one is not finite.
  double MaxAbsLive() const {
    const float* weights = live_->values().data();
    uint32_t bad = 0;
    float largest = 0.0f;
    for (size_t i = 0; i < state_->size(); ++i) {
      const float w = LoadRelaxed(&weights[i]);
      bad |= NonFinite(w);
      largest = std::max(largest, std::abs(w));
    }
    return bad != 0 ? std::numeric_limits<double>::infinity() : largest;
  }

  void CopyLive(float* out) const {
    const float* weights = live_->values().data();
    for (size_t i = 0; i < state_->size(); ++i) {
      out[i] = LoadRelaxed(&weights[i]);
    }
  }

  // Constant after construction.
  const float learning_rate_;
  const StalenessAwareRate staleness_rate_;
  ShardState* const state_;
  // Written in place by every push (relaxed atomics); replaced only by
  // RestoreState, before serving.
  std::shared_ptr<Weights> live_;

  std::atomic<int64_t> version_{0};
  absl::Mutex bound_mu_;
  WeightBound weight_bound_ ABSL_GUARDED_BY(bound_mu_);
  absl::Mutex snapshot_mu_;
  WeightsPtr snapshot_ ABSL_GUARDED_BY(snapshot_mu_);  // the latest taken
};

}  // namespace

std::unique_ptr<UpdateRule> MakeHogwildRule(const TrainingConfig& resolved,
                                            int num_workers,
                                            ShardState* state) {
  return std::make_unique<HogwildRule>(resolved, state);
}

}  // namespace monsoon::server
