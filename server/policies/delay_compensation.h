// Delay compensation (DC-ASGD, Zheng et al. 2017; config.proto
// delay_compensation lambda): the gradient g of a worker that last pulled
// w_pulled from this shard is applied as g + lambda * g * g * (w_now -
// w_pulled), element by element. It keeps each worker's last pulled version
// (Pulled): a reference to the version the pull sent, not a copy, so the
// cost is memory, up to one shard-sized buffer per worker (see
// PolicyMemory), and every update then writes a new buffer instead of the
// weights in place. Used by the downpour (and onebit) rule.
//
// Pulled is thread-safe; Compensate is called under the rule's lock.
#ifndef MONSOON_SERVER_POLICIES_DELAY_COMPENSATION_H_
#define MONSOON_SERVER_POLICIES_DELAY_COMPENSATION_H_

#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "server/shard_state.h"

namespace monsoon::server {

class DelayCompensation {
 public:
  explicit DelayCompensation(float lambda) : lambda_(lambda) {}

  // Worker `rank` (>= 0) was sent `weights`.
  void Pulled(int rank, const WeightsPtr& weights);

  // Forgets worker `rank`'s last pull (it left): its next push, unless it
  // pulls first, is applied uncompensated.
  void Drop(int rank);

  // The workers whose last pull is kept.
  int workers();

  // `out` = g compensated for the weights `in` (of g.size() values) that it
  // is applied to. Without a pull of `rank` seen (the shard restarted
  // since) there is nothing to compensate against: `out` = g.
  void Compensate(int rank, absl::Span<const float> g, const float* in,
                  std::vector<float>* out);

 private:
  const float lambda_;
  absl::Mutex mu_;
  std::map<int, WeightsPtr> pulled_ ABSL_GUARDED_BY(mu_);
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_POLICIES_DELAY_COMPENSATION_H_
