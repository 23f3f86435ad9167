// downpour (Dean et al. 2012): each push is applied at once with the server
// optimizer, one push at a time per shard, however stale it is; staleness is
// recorded, not refused. Also onebit's rule, after PushDecoder has decoded.

#include <memory>

#include "server/optimizer.h"
#include "server/update_rule.h"

namespace monsoon::server {
namespace {

class DownpourRule : public SerialRule {
 public:
  DownpourRule(const TrainingConfig& resolved, ShardState* state)
      : SerialRule(state), optimizer_(MakeOptimizer(resolved, state->size())) {}

 protected:
  Optimizer* optimizer() override { return optimizer_.get(); }

  void Update(absl::Span<const float> gradient, const float* in,
              float* out) override {
    optimizer_->Apply({gradient}, in, out);
  }

  bool StaysFinite(absl::Span<const float> gradient, const float* in) override {
    return optimizer_->StaysFinite({gradient}, in);
  }

  bool BoundStep(double max_abs, double* step) override {
    return optimizer_->BoundStep(max_abs, step);
  }

  void AdvanceBound(double max_abs) override {
    optimizer_->AdvanceBound(max_abs);
  }

 private:
  // Used only under SerialRule's lock.
  const std::unique_ptr<Optimizer> optimizer_;
};

}  // namespace

std::unique_ptr<UpdateRule> MakeDownpourRule(const TrainingConfig& resolved,
                                             ShardState* state) {
  return std::make_unique<DownpourRule>(resolved, state);
}

}  // namespace monsoon::server
