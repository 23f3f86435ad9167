#include "server/optimizer.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/float_bytes.h"
#include "common/wire.h"

namespace monsoon::server {

double MaxAbs(absl::Span<const float> values) {
  float max_abs = 0.0f;
  if (common::FirstOutside(values.data(), values.size(),
                           std::numeric_limits<float>::max(),
                           &max_abs) != values.size()) {
    return std::numeric_limits<double>::infinity();
  }
  return max_abs;
}

SgdOptimizer::SgdOptimizer(size_t size, float learning_rate, float momentum)
    : learning_rate_(learning_rate),
      momentum_(momentum),
      velocity_(momentum > 0 ? size : 0, 0.0f) {}

void SgdOptimizer::Apply(const Gradient& gradient, const float* in,
                         float* out) {
  const float lr = learning_rate_ * gradient.lr_scale;
  if (momentum_ > 0) {
    float* v = velocity_.data();
    const float m = momentum_;
    ForEachGradient(gradient, in, out, [=](size_t i, float g, float w) {
      v[i] = m * v[i] + g;
      return w - lr * v[i];
    });
  } else {
    ForEachGradient(gradient, in, out,
                    [=](size_t, float g, float w) { return w - lr * g; });
  }
}

bool SgdOptimizer::StaysFinite(const Gradient& gradient,
                               const float* in) const {
  const float lr = learning_rate_ * gradient.lr_scale;
  if (momentum_ > 0) {
    const float* v = velocity_.data();
    const float m = momentum_;
    return GradientStaysFinite(gradient, in, [=](size_t i, float g, float w) {
      const float velocity = m * v[i] + g;
      return NonFinite(velocity) | NonFinite(w - lr * velocity);
    });
  }
  return GradientStaysFinite(gradient, in, [=](size_t, float g, float w) {
    return NonFinite(w - lr * g);
  });
}

bool SgdOptimizer::BoundStep(double max_abs, double* step) const {
  // |v'| <= momentum |v| + |g|, and a weight moves by lr |v'|.
  const double velocity =
      momentum_ > 0 ? momentum_ * velocity_bound_ + max_abs : max_abs;
  *step = std::abs(learning_rate_) * velocity;
  return velocity < kSafeMagnitude && *step < kSafeMagnitude;
}

void SgdOptimizer::AdvanceBound(double max_abs) {
  if (momentum_ <= 0) return;
  velocity_bound_ = momentum_ * velocity_bound_ + max_abs;
  if (!(velocity_bound_ < kSafeMagnitude)) velocity_bound_ = MaxAbs(velocity_);
}

AdagradOptimizer::AdagradOptimizer(size_t size, float learning_rate,
                                   float initial_accumulator)
    : learning_rate_(learning_rate),
      accumulator_(size, initial_accumulator),
      accumulator_bound_(initial_accumulator) {}

bool AdagradOptimizer::BoundStep(double max_abs, double* step) const {
  // h' = h + g^2 with h > 0, so |g| / sqrt(h') <= 1: a weight moves by at
  // most lr (the float division's rounding is within the margin).
  *step = std::abs(learning_rate_);
  return accumulator_bound_ + max_abs * max_abs < kSafeMagnitude;
}

void AdagradOptimizer::AdvanceBound(double max_abs) {
  accumulator_bound_ += max_abs * max_abs;
  if (!(accumulator_bound_ < kSafeMagnitude)) {
    accumulator_bound_ = MaxAbs(accumulator_);
  }
}

namespace {

// Adagrad's loop: h += g*g; w -= lr * g / sqrt(h). Its square roots and
// divisions, not memory, bound it (apply_bench: 0.27x SAXPY at 4 values an
// instruction). -fno-math-errno (BUILD) lets it vectorize; sqrt and
// division are exact either way, so every width gives the same bits.
inline void AdagradLoop(const Gradient& gradient, float* h, float lr,
                        const float* in, float* out) {
  ForEachGradient(gradient, in, out, [=](size_t i, float g, float w) {
    h[i] += g * g;
    return w - lr * g / std::sqrt(h[i]);
  });
}

// The same loop 8 values an instruction (AVX2, without FMA: no fused
// multiply-add may change a rounding), chosen at run time.
__attribute__((target("avx2"), flatten)) void AdagradLoopAvx2(const Gradient& gradient,
                                                     float* h, float lr,
                                                     const float* in,
                                                     float* out) {
  AdagradLoop(gradient, h, lr, in, out);
}

// Asked once, at the first update (not in a static initializer, which
// could run before the CPU's features are known).
bool HaveAvx2() {
  static const bool have = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return have;
}

}  // namespace

void AdagradOptimizer::Apply(const Gradient& gradient, const float* in,
                             float* out) {
  float* h = accumulator_.data();
  const float lr = learning_rate_ * gradient.lr_scale;
  if (HaveAvx2()) {
    AdagradLoopAvx2(gradient, h, lr, in, out);
  } else {
    AdagradLoop(gradient, h, lr, in, out);
  }
}

bool AdagradOptimizer::StaysFinite(const Gradient& gradient,
                                   const float* in) const {
  const float* h = accumulator_.data();
  const float lr = learning_rate_ * gradient.lr_scale;
  return GradientStaysFinite(gradient, in, [=](size_t i, float g, float w) {
    const float sum = h[i] + g * g;
    return NonFinite(sum) | NonFinite(w - lr * g / std::sqrt(sum));
  });
}

namespace {

// Decodes `state` into `out` if it holds exactly out->size() floats.
absl::Status DecodeState(absl::string_view name, absl::string_view state,
                         std::vector<float>* out) {
  if (state.size() != out->size() * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " optimizer state of ", state.size(), " bytes, expected ",
        out->size() * sizeof(float), " (", out->size(), " float32 values)"));
  }
  std::memcpy(out->data(), state.data(), state.size());
  return absl::OkStatus();
}

std::string EncodeState(const std::vector<float>& values) {
  std::string bytes;
  common::AppendFloatBytes(values, &bytes);
  return bytes;
}

}  // namespace

std::string SgdOptimizer::Name() const { return "sgd"; }
std::string SgdOptimizer::SaveState() const { return EncodeState(velocity_); }
absl::Status SgdOptimizer::RestoreState(absl::string_view state) {
  absl::Status decoded = DecodeState(Name(), state, &velocity_);
  velocity_bound_ = MaxAbs(velocity_);
  return decoded;
}

std::string AdagradOptimizer::Name() const { return "adagrad"; }
std::string AdagradOptimizer::SaveState() const {
  return EncodeState(accumulator_);
}
absl::Status AdagradOptimizer::RestoreState(absl::string_view state) {
  std::vector<float> accumulator(accumulator_.size());
  if (absl::Status decoded = DecodeState(Name(), state, &accumulator);
      !decoded.ok()) {
    return decoded;
  }
  // Positive and finite, as Apply keeps them: a zero would make a zero
  // gradient's step 0/0.
  for (size_t i = 0; i < accumulator.size(); ++i) {
    if (!(accumulator[i] > 0.0f) || !std::isfinite(accumulator[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "adagrad optimizer state value ", i, " is ", accumulator[i],
          ": accumulators must be positive and finite"));
    }
  }
  accumulator_ = std::move(accumulator);
  accumulator_bound_ = MaxAbs(accumulator_);
  return absl::OkStatus();
}

std::unique_ptr<Optimizer> MakeOptimizer(const TrainingConfig& resolved,
                                         size_t size) {
  if (resolved.optimizer() == ADAGRAD) {
    return std::make_unique<AdagradOptimizer>(
        size, resolved.learning_rate(), resolved.adagrad_initial_accumulator());
  }
  return std::make_unique<SgdOptimizer>(size, resolved.learning_rate(),
                                        resolved.momentum());
}

}  // namespace monsoon::server
