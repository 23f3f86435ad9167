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

void SgdOptimizer::Apply(absl::Span<const float> grad,
                         absl::Span<std::atomic<float>> weights) {
  for (size_t i = 0; i < grad.size(); ++i) {
    float step = grad[i];
    if (momentum_ > 0) {
      velocity_[i] = momentum_ * velocity_[i] + grad[i];
      step = velocity_[i];
    }
    weights[i].store(
        weights[i].load(std::memory_order_relaxed) - learning_rate_ * step,
        std::memory_order_relaxed);
  }
}

AdagradOptimizer::AdagradOptimizer(size_t size, float learning_rate,
                                   float initial_accumulator)
    : learning_rate_(learning_rate), accumulator_(size, initial_accumulator) {}

void AdagradOptimizer::Apply(absl::Span<const float> grad,
                             absl::Span<std::atomic<float>> weights) {
  for (size_t i = 0; i < grad.size(); ++i) {
    accumulator_[i] += grad[i] * grad[i];
    weights[i].store(weights[i].load(std::memory_order_relaxed) -
                         learning_rate_ * grad[i] / std::sqrt(accumulator_[i]),
                     std::memory_order_relaxed);
  }
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
