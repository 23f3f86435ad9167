#include "server/optimizer.h"

#include <algorithm>
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

namespace {

// The widest of RunVectorized's builds this CPU runs; asked once, at the
// first update (not in a static initializer, which could run before the
// CPU's features are known).
enum class Width { kBaseline, kAvx2, kAvx512 };
Width CpuWidth() {
  static const Width width = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return Width::kAvx512;
    if (__builtin_cpu_supports("avx2")) return Width::kAvx2;
    return Width::kBaseline;
  }();
  return width;
}

// loop(), with everything it calls inlined (flatten) and compiled for
// 8 (AVX2) or 16 (AVX-512) floats an instruction. No fused multiply-add:
// -ffp-contract=off (BUILD) keeps a*b+c two roundings at every width, so
// each build gives the same bits as the baseline's.
template <typename Loop>
__attribute__((target("avx2"), flatten)) void RunAvx2(const Loop& loop) {
  loop();
}
template <typename Loop>
__attribute__((target("avx512f"), flatten)) void RunAvx512(const Loop& loop) {
  loop();
}

// Runs loop() in the widest build this CPU has, up to `widest`. Measured
// (apply_bench, 1M values, against the baseline's 4 floats): SGD's loops,
// bound by memory, gain most at 8 (momentum 1.1x) and lose at 16 (0.85x;
// likely because the arrays are 16-byte aligned, so that most 64-byte
// accesses span two cache lines); Adagrad's, bound by its square roots
// and divisions, gains at both (1.9x, 2.5x).
template <Width kWidest, typename Loop>
void RunVectorized(const Loop& loop) {
  const Width width = std::min(kWidest, CpuWidth());
  if constexpr (kWidest >= Width::kAvx512) {
    if (width == Width::kAvx512) return RunAvx512(loop);
  }
  if constexpr (kWidest >= Width::kAvx2) {
    if (width == Width::kAvx2) return RunAvx2(loop);
  }
  loop();
}

}  // namespace

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
    RunVectorized<Width::kAvx2>([&] {
      ForEachGradient(gradient, in, out, [=](size_t i, float g, float w) {
        v[i] = m * v[i] + g;
        return w - lr * v[i];
      });
    });
  } else {
    RunVectorized<Width::kAvx2>([&] {
      ForEachGradient(gradient, in, out,
                      [=](size_t, float g, float w) { return w - lr * g; });
    });
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

void AdagradOptimizer::Apply(const Gradient& gradient, const float* in,
                             float* out) {
  float* h = accumulator_.data();
  const float lr = learning_rate_ * gradient.lr_scale;
  // Its square roots and divisions, more than memory, bound it: vectorized
  // (-fno-math-errno, BUILD) and as wide as the CPU allows. Both are exact
  // at any width, so every width gives the same bits.
  RunVectorized<Width::kAvx512>([&] {
    ForEachGradient(gradient, in, out, [=](size_t i, float g, float w) {
      h[i] += g * g;
      return w - lr * g / std::sqrt(h[i]);
    });
  });
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
