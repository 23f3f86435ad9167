#include "server/optimizer.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"

namespace monsoon::server {
namespace {

// Two weights, two steps of two gradients, the same in every test:
//   w = {1, -2}, g1 = {0.5, -1}, g2 = {0.25, 2}.
class OptimizerTest : public testing::Test {
 protected:
  // One step out of place, as the rules apply them: weights_ becomes the
  // result.
  void Step(Optimizer& optimizer, const std::vector<float>& grad,
            float scale = 1.0f) {
    std::vector<float> next(weights_.size(), -99.0f);
    optimizer.Apply({grad, nullptr, scale}, weights_.data(), next.data());
    weights_ = next;
  }
  float w(int i) const { return weights_[i]; }

  void TwoSteps(Optimizer& optimizer, std::vector<float>* after_first) {
    Step(optimizer, {0.5f, -1.0f});
    *after_first = weights_;
    Step(optimizer, {0.25f, 2.0f});
  }

  std::vector<float> weights_ = {1.0f, -2.0f};
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
  Step(adagrad, zero);
  Step(adagrad, zero);
  EXPECT_EQ(w(0), 1.0f);
  EXPECT_EQ(w(1), -2.0f);
}

TEST_F(OptimizerTest, GradientScaleMultipliesTheGradientFirst) {
  // Sync's average of two workers' sum {1, -2}: the same as the mean.
  SgdOptimizer scaled(2, 0.1f, 0.9f);
  Step(scaled, {1.0f, -2.0f}, 0.5f);
  const std::vector<float> by_scale = weights_;
  weights_ = {1.0f, -2.0f};
  SgdOptimizer plain(2, 0.1f, 0.9f);
  Step(plain, {0.5f, -1.0f});
  EXPECT_EQ(by_scale, weights_);
  EXPECT_FLOAT_EQ(w(0), 0.95f);
}

TEST_F(OptimizerTest, AnAddendIsSummedBeforeTheScale) {
  // (sum + last) * scale, as sync's sum of two pushes, averaged.
  const std::vector<float> sum = {0.75f, -1.5f}, last = {0.25f, -0.5f};
  SgdOptimizer with_addend(2, 0.1f, 0.9f);
  std::vector<float> next(2);
  with_addend.Apply({sum, last.data(), 0.5f}, weights_.data(), next.data());
  SgdOptimizer summed(2, 0.1f, 0.9f);
  Step(summed, {1.0f, -2.0f}, 0.5f);
  EXPECT_EQ(next, weights_);
  // In place gives the same.
  std::vector<float> in_place = {1.0f, -2.0f};
  SgdOptimizer again(2, 0.1f, 0.9f);
  again.Apply({sum, last.data(), 0.5f}, in_place.data(), in_place.data());
  EXPECT_EQ(in_place, weights_);
}

TEST_F(OptimizerTest, PlusZeroTurnsANegativeZeroGradientPositive) {
  // w = -0 and g = -0: -0 - 0.1 * (+0) = -0, but -0 - 0.1 * (-0) = +0.
  SgdOptimizer sgd(1, 0.1f, 0.0f);
  const std::vector<float> g = {-0.0f};
  const std::vector<float> w = {-0.0f};
  float with = 1, without = 1;
  sgd.Apply({g, nullptr, 1.0f, /*plus_zero=*/true}, w.data(), &with);
  sgd.Apply({g, nullptr, 1.0f, /*plus_zero=*/false}, w.data(), &without);
  EXPECT_TRUE(std::signbit(with));
  EXPECT_FALSE(std::signbit(without));
}

TEST_F(OptimizerTest, LongSlicesMatchTheScalarDefinitionBitForBit) {
  // The vectorized loops against the plain formulas, on enough values to
  // cover whole vectors and a remainder (Adagrad 16 floats an instruction
  // where the CPU has AVX-512, SGD 8 where it has AVX2, else 4:
  // RunVectorized), out of place.
  const size_t n = 1003;
  std::vector<float> w(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    w[i] = 0.001f * static_cast<float>(i) - 0.4f;
    g[i] = std::sin(static_cast<float>(i)) * 3.0f;
  }
  SgdOptimizer sgd(n, 0.05f, 0.9f);
  AdagradOptimizer adagrad(n, 0.05f, 0.1f);
  std::vector<float> sgd_out(n), adagrad_out(n);
  for (int step = 0; step < 3; ++step) {
    sgd.Apply({g, nullptr, 0.5f}, w.data(), sgd_out.data());
    adagrad.Apply({g, nullptr, 0.5f}, w.data(), adagrad_out.data());
  }
  std::vector<float> v(n, 0.0f), h(n, 0.1f);
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < n; ++i) {
      const float gi = g[i] * 0.5f;
      v[i] = 0.9f * v[i] + gi;
      h[i] += gi * gi;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i] * 0.5f;
    EXPECT_EQ(sgd_out[i], w[i] - 0.05f * v[i]) << i;
    EXPECT_EQ(adagrad_out[i], w[i] - 0.05f * gi / std::sqrt(h[i])) << i;
  }
}

TEST_F(OptimizerTest, InPlaceWithAnAddendMatchesTheScalarDefinitionBitForBit) {
  // As sync applies a step: in place, the sum so far plus the last push,
  // 0 + first (plus_zero), averaged; the wide loops against the formulas.
  const size_t n = 1003;
  std::vector<float> w(n), sum(n), last(n);
  for (size_t i = 0; i < n; ++i) {
    w[i] = 0.002f * static_cast<float>(i) - 1.0f;
    sum[i] = std::cos(static_cast<float>(i)) * 2.0f;
    last[i] = std::sin(static_cast<float>(3 * i)) * 0.7f;
  }
  sum[5] = -0.0f;
  last[5] = -0.0f;
  std::vector<float> sgd_w = w, adagrad_w = w;
  SgdOptimizer sgd(n, 0.05f, 0.9f);
  AdagradOptimizer adagrad(n, 0.05f, 0.1f);
  const Gradient mean{sum, last.data(), 0.5f, /*plus_zero=*/true};
  for (int step = 0; step < 3; ++step) {
    sgd.Apply(mean, sgd_w.data(), sgd_w.data());
    adagrad.Apply(mean, adagrad_w.data(), adagrad_w.data());
  }
  std::vector<float> sgd_ref = w, adagrad_ref = w, v(n, 0.0f), h(n, 0.1f);
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < n; ++i) {
      const float gi = ((0.0f + sum[i]) + last[i]) * 0.5f;
      v[i] = 0.9f * v[i] + gi;
      sgd_ref[i] = sgd_ref[i] - 0.05f * v[i];
      h[i] += gi * gi;
      adagrad_ref[i] = adagrad_ref[i] - 0.05f * gi / std::sqrt(h[i]);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(sgd_w[i], sgd_ref[i]) << i;
    EXPECT_EQ(adagrad_w[i], adagrad_ref[i]) << i;
  }
}

TEST_F(OptimizerTest, StaysFiniteFindsTheOneValueThatWouldOverflow) {
  // Every position of a long slice (whole vectors and the remainder) in
  // turn: a step there overflows, nowhere else.
  const size_t n = 1003;
  std::vector<float> w(n, 1.0f), g(n, 0.5f);
  SgdOptimizer sgd(n, /*learning_rate=*/2.0f, /*momentum=*/0.0f);
  SgdOptimizer momentum(n, 2.0f, 0.9f);
  AdagradOptimizer adagrad(n, 2.0f, 0.1f);
  for (size_t bad : {size_t{0}, size_t{7}, size_t{8}, size_t{500}, n - 1}) {
    g[bad] = 3e38f;  // w - 2 * 3e38 overflows; and so does 3e38 squared
    EXPECT_FALSE(sgd.StaysFinite({g}, w.data())) << bad;
    EXPECT_FALSE(momentum.StaysFinite({g}, w.data())) << bad;
    EXPECT_FALSE(adagrad.StaysFinite({g}, w.data())) << bad;
    g[bad] = 0.5f;
    w[bad] = 3e38f;  // a weight: w - 2 * 0.5 is finite
    EXPECT_TRUE(sgd.StaysFinite({g}, w.data())) << bad;
    w[bad] = -3.4e38f;  // -3.4e38 - 2 * 0.5 * 1e38 overflows
    g[bad] = 1e38f;
    EXPECT_FALSE(sgd.StaysFinite({g}, w.data())) << bad;
    w[bad] = 1.0f;
    g[bad] = 0.5f;
  }
  EXPECT_TRUE(sgd.StaysFinite({g}, w.data()));
  EXPECT_TRUE(momentum.StaysFinite({g}, w.data()));
  EXPECT_TRUE(adagrad.StaysFinite({g}, w.data()));
  // The scale and the addend count: 2e38 + 2e38 overflows before the
  // scale of 0.5 would bring it back.
  std::vector<float> big(n, 2e38f);
  EXPECT_FALSE(sgd.StaysFinite({big, big.data(), 0.5f}, w.data()));
  EXPECT_TRUE(sgd.StaysFinite({big, nullptr, 0.5f}, w.data()));
}

TEST_F(OptimizerTest, StaysFiniteSeesTheStateTheNextStepWouldWrite) {
  // The velocity 0.9 * 3e38 + 1e38 overflows, though the weight step (at a
  // learning rate of 1e-30) would be small.
  SgdOptimizer momentum(2, /*learning_rate=*/1e-30f, /*momentum=*/0.9f);
  const std::vector<float> big = {3e38f, 0.0f};
  weights_ = {0.0f, 0.0f};
  ASSERT_TRUE(momentum.StaysFinite({big}, weights_.data()));
  Step(momentum, big);  // velocity {3e38, 0}
  EXPECT_FALSE(momentum.StaysFinite({{1e38f, 0.0f}}, weights_.data()));
  EXPECT_TRUE(momentum.StaysFinite({{-1e38f, 0.0f}}, weights_.data()));
  // Nothing changed by asking: the state is as the one step left it.
  EXPECT_EQ(momentum.SaveState().size(), 2 * sizeof(float));
  const std::string state = momentum.SaveState();
  float v0;
  std::memcpy(&v0, state.data(), sizeof(v0));
  EXPECT_EQ(v0, 3e38f);
}

TEST_F(OptimizerTest, BoundsFollowTheStateWithoutAPass) {
  double step = 0;
  // SGD with momentum: |v'| <= 0.9 |v| + |g|; a weight moves lr |v'|.
  SgdOptimizer momentum(2, /*learning_rate=*/0.5f, /*momentum=*/0.9f);
  EXPECT_TRUE(momentum.BoundStep(2.0, &step));
  EXPECT_DOUBLE_EQ(step, 1.0);
  momentum.AdvanceBound(2.0);  // |v| <= 2
  EXPECT_TRUE(momentum.BoundStep(1.0, &step));
  EXPECT_NEAR(step, 0.5 * (0.9 * 2.0 + 1.0), 1e-6);  // momentum is a float
  EXPECT_FALSE(momentum.BoundStep(1e37, &step));
  EXPECT_FALSE(
      momentum.BoundStep(std::numeric_limits<double>::infinity(), &step));
  // A bound that outgrows the margin is taken again from the state.
  momentum.AdvanceBound(std::numeric_limits<double>::infinity());
  EXPECT_TRUE(momentum.BoundStep(0.0, &step));
  EXPECT_DOUBLE_EQ(step, 0.0);  // the velocity is still 0: no Apply ran
  // Restored state sets the bound: |v| <= 4.
  std::string state(2 * sizeof(float), '\0');
  const float velocity[2] = {-4.0f, 1.0f};
  std::memcpy(state.data(), velocity, sizeof(velocity));
  ASSERT_TRUE(momentum.RestoreState(state).ok());
  EXPECT_TRUE(momentum.BoundStep(0.0, &step));
  EXPECT_NEAR(step, 0.5 * 0.9 * 4.0, 1e-6);

  // Adagrad moves a weight by at most lr; its accumulator grows by g^2.
  AdagradOptimizer adagrad(2, /*learning_rate=*/0.25f, 0.1f);
  EXPECT_TRUE(adagrad.BoundStep(3e18, &step));  // 0.1 + 9e36 < 1e37
  EXPECT_DOUBLE_EQ(step, 0.25);
  EXPECT_FALSE(adagrad.BoundStep(4e18, &step));  // 1.6e37
  adagrad.AdvanceBound(2e18);                    // h <= 4e36
  EXPECT_FALSE(adagrad.BoundStep(3e18, &step));
}

TEST_F(OptimizerTest, AdagradRefusesAStateWithANonPositiveAccumulator) {
  AdagradOptimizer adagrad(2, 0.25f, 0.1f);
  std::string state(2 * sizeof(float), '\0');
  const float zero[2] = {1.0f, 0.0f};
  std::memcpy(state.data(), zero, sizeof(zero));
  const absl::Status restored = adagrad.RestoreState(state);
  EXPECT_EQ(restored.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(restored.message().find("value 1 is 0"), std::string::npos)
      << restored;
  // Unchanged: still the initial accumulator.
  const std::string kept = adagrad.SaveState();
  float h[2];
  std::memcpy(h, kept.data(), sizeof(h));
  EXPECT_EQ(h[0], 0.1f);
  EXPECT_EQ(h[1], 0.1f);
}

TEST_F(OptimizerTest, MakeOptimizerBuildsTheOptimizerTheConfigNames) {
  TrainingConfig config;
  config.set_optimizer(ADAGRAD);
  config.set_learning_rate(0.1f);
  config.set_adagrad_initial_accumulator(0.1f);
  std::unique_ptr<Optimizer> adagrad = MakeOptimizer(config, 2);
  ASSERT_NE(adagrad, nullptr);
  Step(*adagrad, {0.5f, -1.0f});
  EXPECT_FLOAT_EQ(w(0), 0.91548457f);
  EXPECT_FLOAT_EQ(w(1), -1.9046537f);

  config.set_optimizer(SGD);
  config.set_momentum(0.9f);
  std::unique_ptr<Optimizer> sgd = MakeOptimizer(config, 2);
  ASSERT_NE(sgd, nullptr);
  weights_ = {1.0f, -2.0f};
  std::vector<float> first;
  TwoSteps(*sgd, &first);
  EXPECT_FLOAT_EQ(w(0), 0.88f);
  EXPECT_FLOAT_EQ(w(1), -2.01f);
}

}  // namespace
}  // namespace monsoon::server
