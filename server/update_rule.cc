#include "server/update_rule.h"

namespace monsoon::server {

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
