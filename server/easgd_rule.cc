// easgd (asynchronous Elastic Averaging SGD, Zhang, Choromanska and LeCun
// 2015, Algorithm 1): the shard holds the center variable x~. A worker pushes
// its elastic difference d = alpha * (x - x~) and the shard adds it:
// x~ += d, one push at a time. No optimizer: the workers' local steps train.

#include <memory>

#include "server/optimizer.h"
#include "server/update_rule.h"

namespace monsoon::server {
namespace {

class EasgdRule : public SerialRule {
 public:
  using SerialRule::SerialRule;

 protected:
  void Update(const Incoming& push, const float* in, float* out) override {
    const float* d = push.values.data();
    ForEachWeight(push.values.size(), in, out,
                  [=](size_t i, float center) { return center + d[i]; });
  }

  bool StaysFinite(const Incoming& push, const float* in) override {
    const float* d = push.values.data();
    return AllFinite(
        push.values.size(), [=](size_t i) { return in[i]; },
        [=](size_t i, float center) { return NonFinite(center + d[i]); });
  }

  // x~ += d moves a weight by |d| and keeps no other state.
  bool BoundStep(double max_abs, double* step) override {
    *step = max_abs;
    return true;
  }
};

}  // namespace

std::unique_ptr<UpdateRule> MakeEasgdRule(const TrainingConfig& resolved,
                                          int num_workers, ShardState* state) {
  return std::make_unique<EasgdRule>(state);
}

}  // namespace monsoon::server
