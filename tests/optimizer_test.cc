#include "server/optimizer.h"

#include <atomic>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"

namespace monsoon::server {
namespace {

// Two weights, two steps of two gradients, the same in every test:
//   w = {1, -2}, g1 = {0.5, -1}, g2 = {0.25, 2}.
class OptimizerTest : public testing::Test {
 protected:
  OptimizerTest() : weights_(new std::atomic<float>[2]) {
    weights_[0].store(1.0f);
    weights_[1].store(-2.0f);
  }

  absl::Span<std::atomic<float>> weights() {
    return absl::MakeSpan(weights_.get(), 2);
  }
  float w(int i) const { return weights_[i].load(); }

  void TwoSteps(Optimizer& optimizer, std::vector<float>* after_first) {
    const std::vector<float> g1 = {0.5f, -1.0f};
    const std::vector<float> g2 = {0.25f, 2.0f};
    optimizer.Apply(g1, weights());
    *after_first = {w(0), w(1)};
    optimizer.Apply(g2, weights());
  }

  std::unique_ptr<std::atomic<float>[]> weights_;
};

TEST_F(OptimizerTest, SgdWithoutMomentumStepsAlongTheGradient) {
  SgdOptimizer sgd(2, /*learning_rate=*/0.1f, /*momentum=*/0.0f);
  std::vector<float> first;
  TwoSteps(sgd, &first);
  // w1 = w - 0.1 * g1 = {1 - 0.05, -2 + 0.1}.
  EXPECT_FLOAT_EQ(first[0], 0.95f);
  EXPECT_FLOAT_EQ(first[1], -1.9f);
  // w2 = w1 - 0.1 * g2 = {0.95 - 0.025, -1.9 - 0.2}.
  EXPECT_FLOAT_EQ(w(0), 0.925f);
  EXPECT_FLOAT_EQ(w(1), -2.1f);
}

TEST_F(OptimizerTest, SgdWithMomentumAccumulatesVelocity) {
  SgdOptimizer sgd(2, /*learning_rate=*/0.1f, /*momentum=*/0.9f);
  std::vector<float> first;
  TwoSteps(sgd, &first);
  // v1 = g1 = {0.5, -1}; w1 = w - 0.1 * v1 = {0.95, -1.9}.
  EXPECT_FLOAT_EQ(first[0], 0.95f);
  EXPECT_FLOAT_EQ(first[1], -1.9f);
  // v2 = 0.9 * v1 + g2 = {0.45 + 0.25, -0.9 + 2} = {0.7, 1.1};
  // w2 = w1 - 0.1 * v2 = {0.95 - 0.07, -1.9 - 0.11}.
  EXPECT_FLOAT_EQ(w(0), 0.88f);
  EXPECT_FLOAT_EQ(w(1), -2.01f);
}

TEST_F(OptimizerTest, AdagradScalesEachStepByTheAccumulatedSquares) {
  AdagradOptimizer adagrad(2, /*learning_rate=*/0.1f,
                           /*initial_accumulator=*/0.1f);
  std::vector<float> first;
  TwoSteps(adagrad, &first);
  // h1 = 0.1 + g1^2 = {0.35, 1.1}; w1 = w - 0.1 * g1 / sqrt(h1)
  //    = {1 - 0.05 / 0.591608, -2 + 0.1 / 1.048809}.
  EXPECT_FLOAT_EQ(first[0], 0.91548457f);
  EXPECT_FLOAT_EQ(first[1], -1.9046537f);
  // h2 = h1 + g2^2 = {0.4125, 5.1}; w2 = w1 - 0.1 * g2 / sqrt(h2)
  //    = {w1 - 0.025 / 0.642262, w1 - 0.2 / 2.258318}.
  EXPECT_FLOAT_EQ(w(0), 0.87655963f);
  EXPECT_FLOAT_EQ(w(1), -1.9932152f);
}

TEST_F(OptimizerTest, AdagradLeavesWeightsOfZeroGradientUntouched) {
  AdagradOptimizer adagrad(2, 0.1f, 0.1f);
  const std::vector<float> zero = {0.0f, 0.0f};
  adagrad.Apply(zero, weights());
  adagrad.Apply(zero, weights());
  EXPECT_EQ(w(0), 1.0f);
  EXPECT_EQ(w(1), -2.0f);
}

TEST_F(OptimizerTest, MakeOptimizerBuildsTheOptimizerTheConfigNames) {
  TrainingConfig config;
  config.set_optimizer(ADAGRAD);
  config.set_learning_rate(0.1f);
  config.set_adagrad_initial_accumulator(0.1f);
  std::unique_ptr<Optimizer> adagrad = MakeOptimizer(config, 2);
  ASSERT_NE(adagrad, nullptr);
  adagrad->Apply(std::vector<float>{0.5f, -1.0f}, weights());
  EXPECT_FLOAT_EQ(w(0), 0.91548457f);
  EXPECT_FLOAT_EQ(w(1), -1.9046537f);

  config.set_optimizer(SGD);
  config.set_momentum(0.9f);
  std::unique_ptr<Optimizer> sgd = MakeOptimizer(config, 2);
  ASSERT_NE(sgd, nullptr);
  weights_[0].store(1.0f);
  weights_[1].store(-2.0f);
  std::vector<float> first;
  TwoSteps(*sgd, &first);
  EXPECT_FLOAT_EQ(w(0), 0.88f);
  EXPECT_FLOAT_EQ(w(1), -2.01f);
}

}  // namespace
}  // namespace monsoon::server
