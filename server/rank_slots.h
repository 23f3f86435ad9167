// RankSlots counts the calls of one kind (pushes, pulls) that each worker
// rank has in flight, up to a bound, so that one client cannot make a shard
// hold unbounded memory: a push holds a shard-sized buffer, a pull the
// version it sends. The evaluator (rank -1) has slots as a rank does.
// Thread-safe.
#ifndef MONSOON_SERVER_RANK_SLOTS_H_
#define MONSOON_SERVER_RANK_SLOTS_H_

#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace monsoon::server {

class RankSlots {
 public:
  explicit RankSlots(int per_rank) : per_rank_(per_rank) {}
  RankSlots(const RankSlots&) = delete;
  RankSlots& operator=(const RankSlots&) = delete;

  // Takes a slot: false when `rank` has per_rank calls in flight already.
  bool Acquire(int rank) {
    absl::MutexLock lock(&mu_);
    int& in_flight = in_flight_[rank];
    if (in_flight >= per_rank_) return false;
    ++in_flight;
    return true;
  }
  // Gives back a slot that Acquire took.
  void Release(int rank) {
    absl::MutexLock lock(&mu_);
    --in_flight_[rank];
  }
  int per_rank() const { return per_rank_; }

 private:
  const int per_rank_;
  absl::Mutex mu_;
  std::map<int, int> in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_RANK_SLOTS_H_
