// easgd (asynchronous Elastic Averaging SGD, Zhang, Choromanska and LeCun
// 2015, Algorithm 1): the shard holds the center variable x~. A worker pushes
// its elastic difference d = alpha * (x - x~) and the shard adds it:
// x~ += d, one push at a time. No optimizer: the workers' local steps train.

#include <memory>

#include "server/update_rule.h"

namespace monsoon::server {
namespace {

class EasgdRule : public SerialRule {
 public:
  using SerialRule::SerialRule;

 protected:
  void Update(absl::Span<const float> elastic, const float* in,
              float* out) override {
    const size_t n = elastic.size();
    const float* __restrict d = elastic.data();
    const float* __restrict center = in;
    float* __restrict next = out;
    for (size_t i = 0; i < n; ++i) next[i] = center[i] + d[i];
  }
};

}  // namespace

std::unique_ptr<UpdateRule> MakeEasgdRule(ShardState* state) {
  return std::make_unique<EasgdRule>(state);
}

}  // namespace monsoon::server
