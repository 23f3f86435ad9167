#include "server/update_rule.h"

#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace monsoon::server {

absl::StatusOr<PushResult> SerialRule::Apply(const PushData& push) {
  std::vector<ShardState::Waiter> ready;
  PushResult result;
  {
    absl::MutexLock lock(&mu_);
    const int64_t version = weights_->version();
    if (push.base_version > version) {
      return FutureVersionError(state_->shard(), push.base_version, version);
    }
    // Checked before anything changes: a refused push leaves the weights,
    // the optimizer's state and the rank's position as they were. The
    // bounds usually guarantee it without the pass.
    const Incoming incoming{push.values, push.worker_rank,
                            version - push.base_version,
                            /*forwarded=*/push.replica_seq > 0};
    double step = 0;
    const bool bounded =
        BoundStep(push.max_abs, &step) && weight_bound_.Allows(step);
    if (!bounded && !StaysFinite(incoming, weights_->values().data())) {
      state_->RecordRefusedUpdate();
      return NonFiniteUpdateError(state_->shard(), push.worker_rank, version);
    }
    if (!state_->ClaimSamples(push.worker_rank, push.sample_offset,
                              push.samples)) {
      result.version = version;
      result.duplicate = true;
      return result;
    }
    result.staleness = version - push.base_version;
    result.version = version + 1;
    const absl::Time began = state_->BeginApply();
    WriteNextVersion(
        state_, &weights_, result.version,
        [&](const float* in, float* out) { Update(incoming, in, out); });
    state_->EndApply(began);
    AdvanceBound(push.max_abs);
    result.applied_gradient = AppliedGradient();
    if (!weight_bound_.Advance(
            bounded ? step : std::numeric_limits<double>::infinity())) {
      weight_bound_.Reset(MaxAbs(weights_->values()));
    }
    state_->RecordPush(result.staleness, push.samples, push.wire_bytes);
    state_->RecordAppliedSamples(push.worker_rank, push.samples);
    ready = state_->AdvanceVersion(result.version);
  }
  // Pulls waiting for this version run outside the lock: they take it again
  // through Snapshot.
  state_->RunWaiters(std::move(ready));
  return result;
}

absl::Status NonFiniteUpdateError(int shard, int worker_rank, int64_t version) {
  return absl::InvalidArgumentError(absl::StrCat(
      "shard ", shard, " refused the push of worker ", worker_rank,
      " at version ", version,
      ": applied, it would make a weight or an optimizer value infinite or "
      "NaN (an overflow); the shard keeps its state. The run diverges: lower "
      "the learning rate, or the shards' --max_abs_gradient"));
}

absl::Status FutureVersionError(int shard, int64_t base_version,
                                int64_t version) {
  return absl::AbortedError(absl::StrCat(
      "push computed from version ", base_version, " but shard ", shard,
      " is only at version ", version,
      ": the shard went back (restored from an older checkpoint); the push "
      "is not applied: pull and compute again"));
}

WeightsPtr SerialRule::Snapshot() {
  absl::MutexLock lock(&mu_);
  return Weights::Share(weights_);
}

RuleState SerialRule::SaveState() {
  absl::MutexLock lock(&mu_);
  return SaveRuleState(*state_, weights_->version(), weights_->values(),
                       optimizer());
}

absl::Status SerialRule::RestoreState(const RuleState& saved) {
  std::vector<ShardState::Waiter> ready;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::shared_ptr<Weights>> restored =
        RestoreWeightsAndOptimizer(saved, state_, optimizer());
    if (!restored.ok()) return restored.status();
    weights_ = *std::move(restored);
    weight_bound_.Reset(MaxAbs(weights_->values()));
    ready = state_->AdvanceVersion(weights_->version());
  }
  state_->RunWaiters(std::move(ready));
  return absl::OkStatus();
}

RuleState SaveRuleState(const ShardState& state, int64_t version,
                        absl::Span<const float> weights,
                        const Optimizer* optimizer) {
  RuleState saved;
  saved.version = version;
  saved.weights.assign(weights.begin(), weights.end());
  saved.stats = state.Stats();
  if (optimizer != nullptr) {
    saved.optimizer = optimizer->Name();
    saved.optimizer_state = optimizer->SaveState();
  }
  return saved;
}

absl::StatusOr<std::shared_ptr<Weights>> RestoreWeightsAndOptimizer(
    const RuleState& saved, ShardState* state, Optimizer* optimizer) {
  if (saved.weights.size() != state->size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "saved state holds ", saved.weights.size(), " weights, shard ",
        state->shard(), " has ", state->size()));
  }
  if (saved.version < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("saved state has negative version ", saved.version));
  }
  const std::string name = optimizer != nullptr ? optimizer->Name() : "";
  if (saved.optimizer != name) {
    return absl::InvalidArgumentError(
        absl::StrCat("saved optimizer '", saved.optimizer,
                     "' but this rule uses '", name, "'"));
  }
  if (optimizer != nullptr) {
    absl::Status restored = optimizer->RestoreState(saved.optimizer_state);
    if (!restored.ok()) return restored;
  } else if (!saved.optimizer_state.empty()) {
    return absl::InvalidArgumentError(
        "saved optimizer state but this rule has no optimizer");
  }
  return state->MakeWeights(saved.version, saved.weights);
}

std::unique_ptr<UpdateRule> MakeUpdateRule(const TrainingConfig& resolved,
                                           int num_workers, ShardState* state) {
  switch (resolved.mode()) {
#define MONSOON_MODE(mode, Impl) \
  case mode:                     \
    return Make##Impl##Rule(resolved, num_workers, state);
#include "common/modes.def"
#undef MONSOON_MODE
    default:
      return nullptr;
  }
}

}  // namespace monsoon::server
