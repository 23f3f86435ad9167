#include "server/sync_barrier_log.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"

namespace monsoon::server {

std::string DescribeMissingRanks(const ShardState& state,
                                 const std::vector<bool>& arrived,
                                 absl::Time now) {
  std::vector<std::string> missing;
  for (int rank = 0; rank < static_cast<int>(arrived.size()); ++rank) {
    if (arrived[rank]) continue;
    const absl::Duration since = state.SinceContact(rank, now);
    missing.push_back(state.HasLeft(rank) ? absl::StrCat(rank, " (finished)")
                      : since == absl::InfiniteDuration()
                          ? absl::StrCat(rank, " (never called)")
                          : absl::StrCat(rank, " (last call ",
                                         absl::FormatDuration(absl::Trunc(
                                             since, absl::Milliseconds(100))),
                                         " ago)"));
  }
  return absl::StrJoin(missing, ", ");
}

void MissingRanksLog::StepCloses(const ShardState& state,
                                 const std::vector<bool>& arrived, int count,
                                 int64_t version) {
  int num_workers = static_cast<int>(arrived.size());
  std::vector<int> left, silent;
  for (int rank = 0; rank < static_cast<int>(arrived.size()); ++rank) {
    if (arrived[rank]) continue;
    // Elastic: a rank that never registered is not a member (yet).
    if (state.elastic() && !state.HasLeft(rank) &&
        state.SinceContact(rank, absl::Now()) == absl::InfiniteDuration()) {
      --num_workers;
      continue;
    }
    (state.HasLeft(rank) ? left : silent).push_back(rank);
  }
  std::vector<int> missing = left;
  missing.insert(missing.end(), silent.begin(), silent.end());
  std::sort(missing.begin(), missing.end());
  if (missing == last_missing_) return;
  last_missing_ = missing;
  if (missing.empty()) {
    common::Log("shard %d: step %d has every worker's gradient again",
                state.shard(), version);
    return;
  }
  std::string why;
  if (!left.empty()) {
    why = absl::StrCat("rank(s) ", absl::StrJoin(left, ","),
                       " finished or stopped");
  }
  if (!silent.empty()) {
    absl::StrAppend(
        &why, why.empty() ? "" : "; ", "rank(s) ", absl::StrJoin(silent, ","),
        " made no call for the lease of ", absl::FormatDuration(state.lease()),
        " (a worker whose steps take longer than that needs a "
        "larger --lease_s)");
  }
  if (state.elastic()) {
    // Members come and go: a leave is news, not a fault.
    constexpr char kFormat[] =
        "shard %d: step %d closes with %d of %d ranks' gradients: %s; the "
        "steps are the live ranks' from now on (nothing skipped: what a "
        "rank leaves of its data goes back to the queue)";
    if (silent.empty()) {
      common::Log(kFormat, state.shard(), version, count, num_workers, why);
    } else {
      common::LogWarning(kFormat, state.shard(), version, count, num_workers,
                         why);
    }
    return;
  }
  common::LogWarning(
      "shard %d: step %d closes with %d of %d workers' gradients: %s; their "
      "batches are skipped, and the barrier is the live workers' until they "
      "call again",
      state.shard(), version, count, num_workers, why);
}

}  // namespace monsoon::server
