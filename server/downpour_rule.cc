// downpour (Dean et al. 2012): each push is applied at once with the server
// optimizer, one push at a time per shard, however stale it is; staleness is
// recorded, not refused. Also onebit's rule, after PushDecoder has decoded.
//
// Its policies (server/policies/): the staleness-aware rate and delay
// compensation act on stale pushes; compressed pulls answer a worker that
// holds its copy with the 1-bit difference.

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "server/optimizer.h"
#include "server/policies/policy_factory.h"
#include "server/update_rule.h"

namespace monsoon::server {
namespace {

class DownpourRule : public SerialRule {
 public:
  DownpourRule(const TrainingConfig& resolved, ShardState* state,
               ShardPolicies policies)
      : SerialRule(state),
        optimizer_(MakeOptimizer(resolved, state->size())),
        staleness_rate_(policies.staleness_rate),
        compensation_(std::move(policies.delay_compensation)),
        pull_copies_(std::move(policies.worker_pulls)) {}

  PullAnswer PullFrom(int worker_rank,
                      std::optional<int64_t> have_version) override {
    PullAnswer answer{Snapshot(), nullptr};
    if (pull_copies_ == nullptr || worker_rank < 0) return answer;
    answer.delta =
        pull_copies_->DeltaFor(worker_rank, have_version, answer.weights);
    return answer;
  }

  void Pulled(int worker_rank, const WeightsPtr& weights) override {
    if (compensation_ == nullptr || worker_rank < 0) return;
    compensation_->Pulled(worker_rank, weights);
  }

  void DropWorker(int worker_rank) override {
    if (pull_copies_ != nullptr) pull_copies_->Drop(worker_rank);
    if (compensation_ != nullptr) compensation_->Drop(worker_rank);
  }

  void HandOutAppliedGradients() override { hand_out_ = true; }

 protected:
  Optimizer* optimizer() override { return optimizer_.get(); }

  void Update(const Incoming& push, const float* in, float* out) override {
    optimizer_->Apply(GradientOf(push, in, /*fresh=*/!compensated_ready_), in,
                      out);
    compensated_ready_ = false;
  }

  bool StaysFinite(const Incoming& push, const float* in) override {
    const bool finite =
        optimizer_->StaysFinite(GradientOf(push, in, /*fresh=*/true), in);
    compensated_ready_ = finite;
    return finite;
  }

  // With delay compensation the gradient applied is not the one pushed, and
  // its size depends on the weights: no bound without a pass.
  bool BoundStep(double max_abs, double* step) override {
    return compensation_ == nullptr && optimizer_->BoundStep(max_abs, step);
  }

  void AdvanceBound(double max_abs) override {
    optimizer_->AdvanceBound(compensates_ ? MaxAbs(*compensated_) : max_abs);
  }

  std::shared_ptr<const std::vector<float>> AppliedGradient() override {
    if (!compensates_ || !hand_out_) return nullptr;
    return compensated_;
  }

 private:
  // The gradient to apply for `push` on the weights `in`: with delay
  // compensation, the compensated one, computed afresh, or as StaysFinite
  // left it for the Update of the same push, which sees the same `in`. A
  // push forwarded by the range's primary is compensated already.
  Gradient GradientOf(const Incoming& push, const float* in, bool fresh) {
    Gradient gradient{push.values};
    gradient.lr_scale = staleness_rate_.Scale(push.staleness);
    compensates_ = compensation_ != nullptr && !push.forwarded;
    if (!compensates_) return gradient;
    if (fresh) {
      // Handed out, each push's gradient is an array of its own (the
      // backup's forward holds it until sent).
      if (compensated_ == nullptr || hand_out_) {
        compensated_ = std::make_shared<std::vector<float>>();
      }
      compensation_->Compensate(push.worker_rank, push.values, in,
                                compensated_.get());
    }
    gradient.values = *compensated_;
    return gradient;
  }

  // Used only under SerialRule's lock.
  const std::unique_ptr<Optimizer> optimizer_;
  const StalenessAwareRate staleness_rate_;
  const std::unique_ptr<DelayCompensation> compensation_;  // null: off
  std::shared_ptr<std::vector<float>> compensated_;
  // Whether compensated_ holds the push StaysFinite just passed (SerialRule
  // then calls Update for it before any other push).
  bool compensated_ready_ = false;
  // Whether the push being applied is compensated here.
  bool compensates_ = false;
  // HandOutAppliedGradients was called: set before serving.
  bool hand_out_ = false;

  // Thread-safe. Null: float32 pulls.
  const std::unique_ptr<WorkerPullCopies> pull_copies_;
};

}  // namespace

std::unique_ptr<UpdateRule> MakeDownpourRule(const TrainingConfig& resolved,
                                             int num_workers,
                                             ShardState* state) {
  return std::make_unique<DownpourRule>(
      resolved, state, MakePolicies(resolved, 0, state->size()));
}

}  // namespace monsoon::server
