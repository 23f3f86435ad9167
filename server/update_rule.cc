#include "server/update_rule.h"

namespace monsoon::server {

std::unique_ptr<UpdateRule> MakeUpdateRule(const TrainingConfig& resolved,
                                           int num_workers, ShardState* state) {
  switch (resolved.mode()) {
    case SYNC:
      return MakeSyncRule(resolved, num_workers, state);
    case DOWNPOUR:
      return MakeDownpourRule(resolved, state);
    default:
      // ResolveConfig refuses the modes not built yet.
      return nullptr;
  }
}

}  // namespace monsoon::server
