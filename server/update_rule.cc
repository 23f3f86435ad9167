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
