// Server-side optimizers: how a shard turns a gradient into a weight update.
// An Optimizer owns its state (momentum, Adagrad accumulators) for one shard,
// and can export and import it (SaveState, RestoreState) for checkpoints.
// Not thread-safe: the update rule serializes calls. (Hogwild applies its
// own plain SGD in place, without an optimizer.)
#ifndef MONSOON_SERVER_OPTIMIZER_H_
#define MONSOON_SERVER_OPTIMIZER_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
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
  // Multiplies the optimizer's learning rate for this update (the
  // staleness-aware rate); at most 1, so that BoundStep's bound, taken at
  // the full rate, still holds.
  float lr_scale = 1.0f;
};

// Calls body(n, grad), where grad(i) is the gradient's i-th value (see
// Gradient) and n its length: one loop body per kind of gradient, so that
// each loop vectorizes.
template <typename Body>
void WithGradient(const Gradient& gradient, Body body) {
  const float* g = gradient.values.data();
  const float scale = gradient.scale;
  const size_t n = gradient.values.size();
  const float* a = gradient.addend;
  if (gradient.plus_zero) {
    if (a == nullptr) {
      body(n, [=](size_t i) { return (0.0f + g[i]) * scale; });
    } else {
      body(n, [=](size_t i) { return ((0.0f + g[i]) + a[i]) * scale; });
    }
  } else if (a == nullptr) {
    body(n, [=](size_t i) { return g[i] * scale; });
  } else {
    body(n, [=](size_t i) { return (g[i] + a[i]) * scale; });
  }
}

// out[i] = step(i, g[i], in[i]) for the gradient g, in place or not (see
// ForEachWeight).
template <typename Step>
void ForEachGradient(const Gradient& gradient, const float* in, float* out,
                     Step step) {
  WithGradient(gradient, [&](size_t n, auto grad) {
    ForEachWeight(n, in, out,
                  [=](size_t i, float w) { return step(i, grad(i), w); });
  });
}

// 1 when x is infinite or NaN (its exponent bits all set), else 0: a
// compare on the bits, which vectorizes.
inline uint32_t NonFinite(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
}

// Whether probe(i, v) is 0 for every i < n, where probe returns the OR of
// NonFinite over the values an update would write for index i (v =
// values(i)). Reads only; the loop vectorizes.
template <typename Values, typename Probe>
bool AllFinite(size_t n, Values values, Probe probe) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad |= probe(i, values(i));
  return bad == 0;
}

// AllFinite over step(i, g[i], in[i]) for the gradient g (see
// ForEachGradient): whether ForEachGradient with the same arithmetic would
// write only finite values.
template <typename Probe>
bool GradientStaysFinite(const Gradient& gradient, const float* in,
                         Probe probe) {
  bool finite = true;
  WithGradient(gradient, [&](size_t n, auto grad) {
    finite = AllFinite(n, grad,
                       [=](size_t i, float g) { return probe(i, g, in[i]); });
  });
  return finite;
}

// Overflow is possible only near float's largest value (3.4e38): bounds
// below this one, kept in double, leave a margin that the rounding of
// float arithmetic cannot cross.
inline constexpr double kSafeMagnitude = 1e37;

// The largest magnitude in `values`; infinity if one is not finite. A pass.
double MaxAbs(absl::Span<const float> values);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // out = in - update(g), element by element, for the gradient g (see
  // Gradient), where in and out hold as many values: the same array (in
  // place) or two that do not overlap. Loops vectorize.
  virtual void Apply(const Gradient& gradient, const float* in, float* out) = 0;
  // Whether Apply(gradient, in, ...) would leave every weight and every
  // value of the optimizer's state finite; changes nothing. A rule calls it
  // first and refuses an update that would not (an overflow that would
  // poison the shard for good).
  virtual bool StaysFinite(const Gradient& gradient, const float* in) const = 0;

  // The cheap guarantee, from bounds kept on the state instead of a pass:
  // true when Apply of a gradient whose values are at most `max_abs` in
  // magnitude surely leaves the state below kSafeMagnitude, with *step set
  // to the most it can move any weight. False when the bounds cannot tell
  // (then ask StaysFinite).
  virtual bool BoundStep(double max_abs, double* step) const = 0;
  // After Apply of such a gradient (max_abs infinity: unknown): advances the
  // state's bound; where that is no longer below kSafeMagnitude it is
  // recomputed from the state (a pass).
  virtual void AdvanceBound(double max_abs) = 0;

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
  bool StaysFinite(const Gradient& gradient, const float* in) const override;
  bool BoundStep(double max_abs, double* step) const override;
  void AdvanceBound(double max_abs) override;
  std::string Name() const override;
  std::string SaveState() const override;
  absl::Status RestoreState(absl::string_view state) override;

 private:
  const float learning_rate_;
  const float momentum_;
  std::vector<float> velocity_;
  double velocity_bound_ = 0;  // >= every |velocity_[i]|
};

// Adagrad: h += g*g; w -= lr * g / sqrt(h), h starting at initial_accumulator.
class AdagradOptimizer : public Optimizer {
 public:
  AdagradOptimizer(size_t size, float learning_rate, float initial_accumulator);
  void Apply(const Gradient& gradient, const float* in, float* out) override;
  bool StaysFinite(const Gradient& gradient, const float* in) const override;
  bool BoundStep(double max_abs, double* step) const override;
  void AdvanceBound(double max_abs) override;
  std::string Name() const override;
  std::string SaveState() const override;
  absl::Status RestoreState(absl::string_view state) override;

 private:
  const float learning_rate_;
  std::vector<float> accumulator_;
  double accumulator_bound_;  // >= every accumulator_[i] (all >= 0)
};

// The optimizer a resolved config names, sized for one shard.
std::unique_ptr<Optimizer> MakeOptimizer(const TrainingConfig& resolved,
                                         size_t size);

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_OPTIMIZER_H_
