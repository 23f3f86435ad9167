// Server-side optimizers: how a shard turns a gradient into a weight update.
// An Optimizer owns its state (momentum, Adagrad accumulators) for one shard,
// and can export and import it (SaveState, RestoreState) for checkpoints.
// Not thread-safe: the update rule serializes calls. (Hogwild applies its
// own plain SGD in place, without an optimizer.)
#ifndef MONSOON_SERVER_OPTIMIZER_H_
#define MONSOON_SERVER_OPTIMIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/config.pb.h"

namespace monsoon::server {

// out[i] = step(i, in[i]) for i < n, where out may be in itself (an update
// in place) or an array that does not overlap it. Either way the loop
// vectorizes (-O3): the compiler checks at run time that the arrays `step`
// reads and writes do not overlap `out`.
template <typename Step>
void ForEachWeight(size_t n, const float* in, float* out, Step step) {
  if (in == out) {
    float* w = out;
    for (size_t i = 0; i < n; ++i) w[i] = step(i, w[i]);
  } else {
    const float* __restrict w = in;
    float* __restrict next = out;
    for (size_t i = 0; i < n; ++i) next[i] = step(i, w[i]);
  }
}

// The gradient an optimizer applies: g[i] = (v[i] + addend[i]) * scale,
// the addend optional (sync applies the step's sum so far plus its last
// push, averaged, without storing the sum first), where v[i] is values[i],
// or 0 + values[i] with plus_zero (which turns -0 into +0, as adding to a
// zeroed sum would: sync's sum of one push).
struct Gradient {
  absl::Span<const float> values;
  const float* addend = nullptr;  // values.size() floats, or none
  float scale = 1.0f;
  bool plus_zero = false;
};

// out[i] = step(i, g[i], in[i]) for the gradient g, in place or not (see
// ForEachWeight).
template <typename Step>
void ForEachGradient(const Gradient& gradient, const float* in, float* out,
                     Step step) {
  const float* g = gradient.values.data();
  const float scale = gradient.scale;
  const size_t n = gradient.values.size();
  const float* a = gradient.addend;
  if (gradient.plus_zero) {
    if (a == nullptr) {
      ForEachWeight(n, in, out, [=](size_t i, float w) {
        return step(i, (0.0f + g[i]) * scale, w);
      });
    } else {
      ForEachWeight(n, in, out, [=](size_t i, float w) {
        return step(i, ((0.0f + g[i]) + a[i]) * scale, w);
      });
    }
  } else if (a == nullptr) {
    ForEachWeight(n, in, out,
                  [=](size_t i, float w) { return step(i, g[i] * scale, w); });
  } else {
    ForEachWeight(n, in, out, [=](size_t i, float w) {
      return step(i, (g[i] + a[i]) * scale, w);
    });
  }
}

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // out = in - update(g), element by element, for the gradient g (see
  // Gradient), where in and out hold as many values: the same array (in
  // place) or two that do not overlap. Loops vectorize.
  virtual void Apply(const Gradient& gradient, const float* in, float* out) = 0;

  // "sgd" or "adagrad": names the format of SaveState's bytes.
  virtual std::string Name() const = 0;
  // The optimizer's state as little-endian float32 bytes (possibly empty),
  // for a checkpoint.
  virtual std::string SaveState() const = 0;
  // Replaces the state with one that SaveState returned for an optimizer of
  // the same kind and size. INVALID_ARGUMENT (state unchanged) when the
  // bytes do not fit.
  virtual absl::Status RestoreState(absl::string_view state) = 0;
};

// SGD with (heavy-ball) momentum: v = momentum*v + g; w -= lr*v.
class SgdOptimizer : public Optimizer {
 public:
  SgdOptimizer(size_t size, float learning_rate, float momentum);
  void Apply(const Gradient& gradient, const float* in, float* out) override;
  std::string Name() const override;
  std::string SaveState() const override;
  absl::Status RestoreState(absl::string_view state) override;

 private:
  const float learning_rate_;
  const float momentum_;
  std::vector<float> velocity_;
};

// Adagrad: h += g*g; w -= lr * g / sqrt(h), h starting at initial_accumulator.
class AdagradOptimizer : public Optimizer {
 public:
  AdagradOptimizer(size_t size, float learning_rate, float initial_accumulator);
  void Apply(const Gradient& gradient, const float* in, float* out) override;
  std::string Name() const override;
  std::string SaveState() const override;
  absl::Status RestoreState(absl::string_view state) override;

 private:
  const float learning_rate_;
  std::vector<float> accumulator_;
};

// The optimizer a resolved config names, sized for one shard.
std::unique_ptr<Optimizer> MakeOptimizer(const TrainingConfig& resolved,
                                         size_t size);

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_OPTIMIZER_H_
