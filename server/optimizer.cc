#include "server/optimizer.h"

#include <cmath>

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
