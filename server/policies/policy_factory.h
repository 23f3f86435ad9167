// The shard's policies (server/policies/): what a resolved config turns on,
// built in one place, and the memory they keep, checked against the
// machine's before the shard serves. Which mode takes which option (and the
// combinations that make no sense) is refused earlier, in
// common/config.cc's table. Stateless; thread-safe.
//
// Adding a policy: its file here (with its test), a member and one line
// below, and its field in proto/config.proto.
#ifndef MONSOON_SERVER_POLICIES_POLICY_FACTORY_H_
#define MONSOON_SERVER_POLICIES_POLICY_FACTORY_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "proto/config.pb.h"
#include "server/policies/compressed_pulls.h"
#include "server/policies/delay_compensation.h"
#include "server/policies/staleness_bound.h"
#include "server/policies/staleness_rate.h"

namespace monsoon::server {

struct ShardPolicies {
  // max_staleness: pulls wait for the slowest worker (ShardState holds it).
  std::optional<StalenessBound> staleness_bound;
  // staleness_lr (downpour, onebit, hogwild).
  StalenessAwareRate staleness_rate{false};
  // delay_compensation (downpour, onebit); null: off.
  std::unique_ptr<DelayCompensation> delay_compensation;
  // pull_compression ONEBIT: sync's step encoder, or the asynchronous
  // modes' per-worker copies; null: float32 pulls.
  std::unique_ptr<StepPullEncoder> step_pulls;
  std::unique_ptr<WorkerPullCopies> worker_pulls;
};

// The policies of `resolved` (a config that common::ResolveConfig passed)
// for a shard of `shard_size` parameters in a run of `num_workers`.
ShardPolicies MakePolicies(const TrainingConfig& resolved, int num_workers,
                           uint64_t shard_size);

// The bound of `resolved` (max_staleness), alone: what ShardState holds.
std::optional<StalenessBound> StalenessBoundFor(const TrainingConfig& resolved,
                                                int num_workers);

// RESOURCE_EXHAUSTED, saying what keeps what and what to do instead, when
// the shard-sized arrays that `resolved`'s policies keep per worker do not
// fit `memory` bytes next to the `needed` bytes the shard holds anyway (0
// `memory`: not checked).
absl::Status CheckPolicyMemory(const TrainingConfig& resolved, int num_workers,
                               uint64_t shard_size, int shard, uint64_t needed,
                               uint64_t memory);

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_POLICIES_POLICY_FACTORY_H_
