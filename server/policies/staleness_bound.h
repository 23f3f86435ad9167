// Bounded staleness (stale synchronous parallel, Ho et al. 2013;
// config.proto max_staleness): a worker's clock is the steps of examples a
// shard has applied from it (its applied examples / batch_size); a pull of a
// worker more than max_staleness steps ahead of the slowest live worker
// waits until it is not. This file decides; ShardState holds the waiting
// pulls and asks it. Immutable after construction; thread-safe.
#ifndef MONSOON_SERVER_POLICIES_STALENESS_BOUND_H_
#define MONSOON_SERVER_POLICIES_STALENESS_BOUND_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace monsoon::server {

class StalenessBound {
 public:
  // Ranks [0, num_workers) have clocks; a clock counts `batch_size`
  // examples per step (at least 1).
  StalenessBound(int max_staleness, int num_workers, int64_t batch_size);

  // Each worker's clock, and the slowest live worker's.
  struct Clocks {
    std::vector<int64_t> of_rank;
    int64_t slowest = 0;
    int slowest_rank = -1;  // -1: no live worker
  };

  // The clocks from the examples applied per rank and which ranks are live
  // (`live[rank]`: not left, lease not run out).
  Clocks Read(const std::map<int, int64_t>& applied_samples,
              const std::vector<bool>& live) const;

  // Whether a pull of `rank` may go ahead (always, without a live worker
  // or for a rank without a clock).
  bool Allows(const Clocks& clocks, int rank) const;

  // For the log: "rank 0 at step 12 waits for rank 1 at step 7".
  std::string DescribeWait(const Clocks& clocks, int rank) const;

  int max_staleness() const { return max_staleness_; }
  int num_workers() const { return num_workers_; }
  int64_t batch_size() const { return batch_size_; }

 private:
  const int max_staleness_;
  const int num_workers_;
  const int64_t batch_size_;
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_POLICIES_STALENESS_BOUND_H_
