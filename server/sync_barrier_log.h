// What a sync shard says about the workers its barrier waits for: the
// ranks a closing step is without, and the ranks a waiting step still
// lacks. Used by sync_rule.cc under its lock; not thread-safe.
#ifndef MONSOON_SERVER_SYNC_BARRIER_LOG_H_
#define MONSOON_SERVER_SYNC_BARRIER_LOG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/shard_state.h"

namespace monsoon::server {

// The ranks that have not pushed the step in progress (`arrived` false), as
// "0 (never called), 2 (last call 1.2s ago), 3 (finished)".
std::string DescribeMissingRanks(const ShardState& state,
                                 const std::vector<bool>& arrived,
                                 absl::Time now);

class MissingRanksLog {
 public:
  // Step `version` closes with `count` of arrived.size() workers' gradients:
  // logs which ranks it is without and why (finished or stopped, or silent
  // for the lease), when that set differs from the last step's: a worker
  // that has gone is named once, not at every step.
  void StepCloses(const ShardState& state, const std::vector<bool>& arrived,
                  int count, int64_t version);

 private:
  std::vector<int> last_missing_;  // the ranks the last step closed without
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_SYNC_BARRIER_LOG_H_
