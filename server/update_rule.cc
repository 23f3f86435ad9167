#include "server/update_rule.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace monsoon::server {

absl::StatusOr<PushResult> SerialRule::Apply(const PushData& push) {
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
    Update(push.values, state_->weights());
    state_->EndApply();
    ++version_;
    result.version = version_;
    state_->RecordPush(result.staleness, push.samples, push.wire_bytes);
    state_->RecordAppliedSamples(push.worker_rank, push.samples);
    ready = state_->AdvanceVersion(version_);
  }
  // Pulls waiting for this version run outside the lock: they take it again
  // through Snapshot.
  for (auto& waiter : ready) waiter();
  return result;
}

void SerialRule::Snapshot(std::vector<float>* weights, int64_t* version) {
  absl::MutexLock lock(&mu_);
  state_->CopyWeights(weights);
  *version = version_;
}

RuleState SerialRule::SaveState() {
  absl::MutexLock lock(&mu_);
  return SaveRuleState(*state_, version_, optimizer());
}

absl::Status SerialRule::RestoreState(const RuleState& saved) {
  std::vector<ShardState::Waiter> ready;
  {
    absl::MutexLock lock(&mu_);
    absl::Status restored =
        RestoreWeightsAndOptimizer(saved, state_, optimizer());
    if (!restored.ok()) return restored;
    version_ = saved.version;
    ready = state_->AdvanceVersion(version_);
  }
  for (auto& waiter : ready) waiter();
  return absl::OkStatus();
}

RuleState SaveRuleState(const ShardState& state, int64_t version,
                        const Optimizer* optimizer) {
  RuleState saved;
  saved.version = version;
  state.CopyWeights(&saved.weights);
  saved.stats = state.Stats();
  if (optimizer != nullptr) {
    saved.optimizer = optimizer->Name();
    saved.optimizer_state = optimizer->SaveState();
  }
  return saved;
}

absl::Status RestoreWeightsAndOptimizer(const RuleState& saved,
                                        ShardState* state,
                                        Optimizer* optimizer) {
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
  auto weights = state->weights();
  for (size_t i = 0; i < weights.size(); ++i) {
    weights[i].store(saved.weights[i], std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

std::unique_ptr<UpdateRule> MakeUpdateRule(const TrainingConfig& resolved,
                                           int num_workers, ShardState* state) {
  switch (resolved.mode()) {
    case SYNC:
      return MakeSyncRule(resolved, num_workers, state);
    case DOWNPOUR:
    case ONEBIT:  // PushDecoder has already decoded the 1-bit payload
      return MakeDownpourRule(resolved, state);
    case EASGD:
      return MakeEasgdRule(state);
    case HOGWILD:
      return MakeHogwildRule(resolved, state);
    default:
      return nullptr;
  }
}

}  // namespace monsoon::server
