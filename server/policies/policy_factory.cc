#include "server/policies/policy_factory.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace monsoon::server {

std::optional<StalenessBound> StalenessBoundFor(const TrainingConfig& resolved,
                                                int num_workers) {
  if (!resolved.has_max_staleness()) return std::nullopt;
  return StalenessBound(resolved.max_staleness(), num_workers,
                        resolved.batch_size());
}

ShardPolicies MakePolicies(const TrainingConfig& resolved, int num_workers,
                           uint64_t shard_size) {
  ShardPolicies policies;
  if (std::optional<StalenessBound> bound =
          StalenessBoundFor(resolved, num_workers);
      bound.has_value()) {
    policies.staleness_bound.emplace(*bound);
  }
  policies.staleness_rate = StalenessAwareRate(resolved.staleness_lr());
  if (resolved.delay_compensation() > 0) {
    policies.delay_compensation =
        std::make_unique<DelayCompensation>(resolved.delay_compensation());
  }
  if (resolved.pull_compression() == COMPRESSION_ONEBIT) {
    if (resolved.mode() == SYNC) {
      policies.step_pulls = std::make_unique<StepPullEncoder>(
          resolved.onebit_bucket_size(), shard_size);
    } else {
      policies.worker_pulls =
          std::make_unique<WorkerPullCopies>(resolved.onebit_bucket_size());
    }
  }
  return policies;
}

absl::Status CheckPolicyMemory(const TrainingConfig& resolved, int num_workers,
                               uint64_t shard_size, int shard, uint64_t needed,
                               uint64_t memory) {
  auto per_worker = [&](int arrays, const std::string& what,
                        const std::string& instead) -> absl::Status {
    const uint64_t kept = static_cast<uint64_t>(arrays) *
                          static_cast<uint64_t>(num_workers) * shard_size *
                          sizeof(float);
    if (memory == 0 || needed + kept <= memory) return absl::OkStatus();
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": ", arrays, " x ", num_workers, " x ", shard_size,
                     " parameters = ", kept >> 20, " MiB on shard ", shard,
                     ", which with its ", needed >> 20,
                     " MiB does not fit the ", memory >> 20,
                     " MiB of memory this process may use: use more shards, "
                     "fewer workers, or ",
                     instead));
  };
  // Compressed pulls in downpour and onebit keep each worker's copy and
  // residual.
  if (resolved.pull_compression() == COMPRESSION_ONEBIT &&
      resolved.mode() != SYNC) {
    if (absl::Status fits = per_worker(
            2, "pull_compression keeps each worker's copy and residual",
            "float32 pulls");
        !fits.ok()) {
      return fits;
    }
  }
  // Delay compensation keeps the version each worker last pulled.
  if (resolved.delay_compensation() > 0) {
    return per_worker(
        1, "delay_compensation keeps each worker's last pulled weights",
        "no delay_compensation");
  }
  return absl::OkStatus();
}

}  // namespace monsoon::server
