// allreduce: the workers train among themselves (a ring all-reduce of each
// step's gradients, worker/allreduce_loop.cc); the shard holds the weights
// that rank 0 publishes every so often and at the end, for the evaluator,
// checkpoints and the run's final weights. A push carries the weights
// themselves, and the shard takes them as they are: x~ = x. No optimizer:
// the workers apply it.

#include <algorithm>
#include <memory>

#include "server/update_rule.h"

namespace monsoon::server {
namespace {

class AllreduceRule : public SerialRule {
 public:
  using SerialRule::SerialRule;

 protected:
  void Update(const Incoming& push, const float* in, float* out) override {
    std::copy(push.values.begin(), push.values.end(), out);
  }

  // The published weights are finite (the service checked them), and they
  // are all the state there is.
  bool StaysFinite(const Incoming& push, const float* in) override {
    return true;
  }

  // The weights are replaced, not moved by a bounded step: no bound, so
  // the rule asks StaysFinite and measures the new weights afresh.
  bool BoundStep(double max_abs, double* step) override { return false; }
};

}  // namespace

std::unique_ptr<UpdateRule> MakeAllreduceRule(const TrainingConfig& resolved,
                                              int num_workers,
                                              ShardState* state) {
  return std::make_unique<AllreduceRule>(state);
}

}  // namespace monsoon::server
