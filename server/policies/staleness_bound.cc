#include "server/policies/staleness_bound.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace monsoon::server {

StalenessBound::StalenessBound(int max_staleness, int num_workers,
                               int64_t batch_size)
    : max_staleness_(max_staleness),
      num_workers_(num_workers),
      batch_size_(std::max<int64_t>(1, batch_size)) {}

StalenessBound::Clocks StalenessBound::Read(
    const std::map<int, int64_t>& applied_samples,
    const std::vector<bool>& live) const {
  Clocks clocks;
  clocks.of_rank.assign(num_workers_, 0);
  for (const auto& [rank, samples] : applied_samples) {
    if (rank >= 0 && rank < num_workers_) {
      clocks.of_rank[rank] = samples / batch_size_;
    }
  }
  for (int rank = 0; rank < num_workers_; ++rank) {
    if (rank < static_cast<int>(live.size()) && live[rank] &&
        (clocks.slowest_rank < 0 || clocks.of_rank[rank] < clocks.slowest)) {
      clocks.slowest = clocks.of_rank[rank];
      clocks.slowest_rank = rank;
    }
  }
  return clocks;
}

bool StalenessBound::Allows(const Clocks& clocks, int rank) const {
  return clocks.slowest_rank < 0 || rank < 0 ||
         rank >= static_cast<int>(clocks.of_rank.size()) ||
         clocks.of_rank[rank] - clocks.slowest <= max_staleness_;
}

std::string StalenessBound::DescribeWait(const Clocks& clocks, int rank) const {
  return absl::StrCat("rank ", rank, " at step ", clocks.of_rank[rank],
                      " waits for rank ", clocks.slowest_rank, " at step ",
                      clocks.slowest);
}

}  // namespace monsoon::server
