#include "server/optimizer.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/float_bytes.h"

namespace monsoon::server {

SgdOptimizer::SgdOptimizer(size_t size, float learning_rate, float momentum)
    : learning_rate_(learning_rate),
      momentum_(momentum),
      velocity_(momentum > 0 ? size : 0, 0.0f) {}

void SgdOptimizer::Apply(const Gradient& gradient, const float* in,
                         float* out) {
  const float lr = learning_rate_;
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

AdagradOptimizer::AdagradOptimizer(size_t size, float learning_rate,
                                   float initial_accumulator)
    : learning_rate_(learning_rate), accumulator_(size, initial_accumulator) {}

void AdagradOptimizer::Apply(const Gradient& gradient, const float* in,
                             float* out) {
  float* h = accumulator_.data();
  const float lr = learning_rate_;
  ForEachGradient(gradient, in, out, [=](size_t i, float g, float w) {
    h[i] += g * g;
    // -fno-math-errno (BUILD) lets this vectorize; sqrt is exact either way.
    return w - lr * g / std::sqrt(h[i]);
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
  return DecodeState(Name(), state, &velocity_);
}

std::string AdagradOptimizer::Name() const { return "adagrad"; }
std::string AdagradOptimizer::SaveState() const {
  return EncodeState(accumulator_);
}
absl::Status AdagradOptimizer::RestoreState(absl::string_view state) {
  return DecodeState(Name(), state, &accumulator_);
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
