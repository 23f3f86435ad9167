// downpour (Dean et al. 2012): each push is applied at once with the server
// optimizer, one push at a time per shard, however stale it is; staleness is
// recorded, not refused. Also onebit's rule, after PushDecoder has decoded.
//
// Two options act on stale pushes here (config.proto):
// - staleness_lr (Zhang et al. 2016): the optimizer's learning rate for a
//   push of staleness s is divided by max(1, s);
// - delay_compensation lambda (DC-ASGD, Zheng et al. 2017): the gradient g
//   of a worker that last pulled w_pulled from this shard is applied as
//   g + lambda * g * g * (w_now - w_pulled), element by element. The rule
//   keeps each worker's last pulled version (Pulled): a reference to the
//   version the pull sent, not a copy, so the cost is memory, up to one
//   shard-sized buffer per worker, and every update then writes a new
//   buffer instead of the weights in place.
//
// With pull_compression ONEBIT, the rule keeps, per worker, the copy of the
// weights that worker holds and the residual of its compressed pulls: a
// worker that says it holds its copy gets the 1-bit difference from its
// copy to the current weights (with the residual added, error feedback),
// and its copy on both sides becomes the old one plus the decoded
// difference, equal bit for bit. Any other pull is a full one, which resets
// the copy to the weights sent. Two shard-sized arrays per worker. The copy
// is named by the shard version of the answer that made it: every answer a
// worker holds its copy for is a push-pull's, which includes that worker's
// push, so two such answers never share a version, and an answer that was
// lost (the shard's copy moved on, the worker's did not) shows at the next
// pull, which is then a full one; a loop's resync after a lost shard pulls
// in full too.

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/onebit.h"
#include "server/optimizer.h"
#include "server/update_rule.h"

namespace monsoon::server {
namespace {

class DownpourRule : public SerialRule {
 public:
  DownpourRule(const TrainingConfig& resolved, ShardState* state)
      : SerialRule(state),
        optimizer_(MakeOptimizer(resolved, state->size())),
        staleness_lr_(resolved.staleness_lr()),
        lambda_(resolved.delay_compensation()),
        pull_onebit_(resolved.pull_compression() == COMPRESSION_ONEBIT),
        bucket_size_(resolved.onebit_bucket_size()) {}

  PullAnswer PullFrom(int worker_rank,
                      std::optional<int64_t> have_version) override {
    PullAnswer answer{Snapshot(), nullptr};
    if (!pull_onebit_ || worker_rank < 0) return answer;
    const absl::Span<const float> now = answer.weights->values();
    absl::MutexLock lock(&views_mu_);
    WorkerView& view = views_[worker_rank];
    if (!have_version.has_value() || view.values.empty() ||
        *have_version != view.version) {
      // A full pull: the worker's copy is the weights sent.
      view.values.assign(now.begin(), now.end());
      view.residual.assign(now.size(), 0.0f);
      view.version = answer.weights->version();
      return answer;
    }
    const size_t n = now.size();
    scratch_.resize(n);
    for (size_t i = 0; i < n; ++i) scratch_[i] = now[i] - view.values[i];
    common::OneBitEncoded encoded;
    common::OneBitEncode(scratch_, absl::MakeSpan(view.residual), bucket_size_,
                         &encoded);
    // Decoding what was just encoded cannot fail (see sync_rule.cc).
    common::OneBitDecode(encoded.bits, encoded.scales, bucket_size_,
                         absl::MakeSpan(scratch_))
        .IgnoreError();
    for (size_t i = 0; i < n; ++i) {
      view.values[i] = view.values[i] + scratch_[i];
    }
    auto delta = std::make_shared<EncodedDelta>();
    delta->base_version = view.version;
    delta->version = answer.weights->version();
    delta->bits = std::move(encoded.bits);
    delta->scales = std::move(encoded.scales);
    view.version = delta->version;
    answer.delta = std::move(delta);
    return answer;
  }

  void Pulled(int worker_rank, const WeightsPtr& weights) override {
    if (lambda_ <= 0 || worker_rank < 0) return;
    absl::MutexLock lock(&pulled_mu_);
    pulled_[worker_rank] = weights;
  }

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
    return lambda_ <= 0 && optimizer_->BoundStep(max_abs, step);
  }

  void AdvanceBound(double max_abs) override {
    optimizer_->AdvanceBound(lambda_ > 0 ? MaxAbs(compensated_) : max_abs);
  }

 private:
  // The gradient to apply for `push` on the weights `in`: with delay
  // compensation, the compensated one, computed afresh, or as StaysFinite
  // left it for the Update of the same push, which sees the same `in`.
  Gradient GradientOf(const Incoming& push, const float* in, bool fresh) {
    Gradient gradient{push.values};
    if (staleness_lr_) {
      gradient.lr_scale =
          1.0f / static_cast<float>(std::max<int64_t>(1, push.staleness));
    }
    if (lambda_ <= 0) return gradient;
    if (fresh) Compensate(push, in);
    gradient.values = compensated_;
    return gradient;
  }

  void Compensate(const Incoming& push, const float* in) {
    WeightsPtr pulled;
    {
      absl::MutexLock lock(&pulled_mu_);
      auto it = pulled_.find(push.worker_rank);
      if (it != pulled_.end()) pulled = it->second;
    }
    const size_t n = push.values.size();
    compensated_.resize(n);
    const float* g = push.values.data();
    float* c = compensated_.data();
    if (pulled == nullptr) {
      // No pull of this worker seen (the shard restarted since): nothing to
      // compensate against.
      std::copy(g, g + n, c);
      return;
    }
    const float* old = pulled->values().data();
    const float lambda = lambda_;
    for (size_t i = 0; i < n; ++i) {
      c[i] = g[i] + lambda * g[i] * g[i] * (in[i] - old[i]);
    }
  }

  // Used only under SerialRule's lock.
  const std::unique_ptr<Optimizer> optimizer_;
  const bool staleness_lr_;
  const float lambda_;
  std::vector<float> compensated_;
  // Whether compensated_ holds the push StaysFinite just passed (SerialRule
  // then calls Update for it before any other push).
  bool compensated_ready_ = false;

  absl::Mutex pulled_mu_;
  std::map<int, WeightsPtr> pulled_ ABSL_GUARDED_BY(pulled_mu_);

  // pull_compression: each worker's copy, the version of the answer that
  // made it, and the residual of its compressed pulls.
  struct WorkerView {
    std::vector<float> values;
    std::vector<float> residual;
    int64_t version = -1;
  };
  const bool pull_onebit_;
  const int bucket_size_;
  absl::Mutex views_mu_;
  std::map<int, WorkerView> views_ ABSL_GUARDED_BY(views_mu_);
  std::vector<float> scratch_ ABSL_GUARDED_BY(views_mu_);
};

}  // namespace

std::unique_ptr<UpdateRule> MakeDownpourRule(const TrainingConfig& resolved,
                                             ShardState* state) {
  return std::make_unique<DownpourRule>(resolved, state);
}

}  // namespace monsoon::server
