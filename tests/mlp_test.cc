#include "worker/mlp.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/model_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "worker/compute_backend.h"
#include "worker/cpu_backend.h"

namespace monsoon::worker {
namespace {

using ::monsoon::testutil::StatusIs;

// The network's mean loss and correct count, in double on the host, as the
// reference; *margin gets the smallest |pre-activation| of a hidden unit.
struct Reference {
  double loss = 0;
  int64_t correct = 0;
  double margin = std::numeric_limits<double>::infinity();
};
Reference Forward(const common::ModelLayout& layout,
                  const std::vector<float>& params,
                  const std::vector<float>& images,
                  const std::vector<int32_t>& labels, int n) {
  Reference ref;
  const std::vector<int>& sizes = layout.layer_sizes();
  for (int e = 0; e < n; ++e) {
    std::vector<double> x(images.begin() + e * sizes[0],
                          images.begin() + (e + 1) * sizes[0]);
    for (int l = 0; l < layout.num_layers(); ++l) {
      const float* w = params.data() + layout.weights(l).offset;
      const float* b = params.data() + layout.bias(l).offset;
      std::vector<double> z(sizes[l + 1]);
      for (int j = 0; j < sizes[l + 1]; ++j) {
        z[j] = b[j];
        for (int i = 0; i < sizes[l]; ++i)
          z[j] += x[i] * w[i * sizes[l + 1] + j];
        if (l + 1 < layout.num_layers()) {
          ref.margin = std::min(ref.margin, std::abs(z[j]));
          z[j] = std::max(z[j], 0.0);
        }
      }
      x = z;
    }
    const double max = *std::max_element(x.begin(), x.end());
    double sum = 0;
    for (double v : x) sum += std::exp(v - max);
    ref.loss += std::log(sum) - (x[labels[e]] - max);
    if (std::max_element(x.begin(), x.end()) - x.begin() == labels[e]) {
      ++ref.correct;
    }
  }
  ref.loss /= n;
  return ref;
}

class MlpTest : public testing::Test {
 protected:
  MlpTest()
      : backend_(MakeCpuBackend(1)),
        layout_({5, 4, 3}),
        params_(common::UniformValues(layout_.num_params(), 1)),
        images_(common::UniformValues(10 * 5, 2)),
        labels_({0, 1, 2, 1, 2, 0, 0, 1, 2, 2}) {}

  std::unique_ptr<Mlp> MakeMlp(int max_batch) {
    absl::StatusOr<std::unique_ptr<Mlp>> mlp =
        Mlp::Create(backend_.get(), layout_, max_batch);
    EXPECT_TRUE(mlp.ok()) << mlp.status();
    return mlp.ok() ? *std::move(mlp) : nullptr;
  }

  std::unique_ptr<ComputeBackend> backend_;
  const common::ModelLayout layout_;
  std::vector<float> params_;
  const std::vector<float> images_;
  const std::vector<int32_t> labels_;
};

TEST_F(MlpTest, LossMatchesAHostReference) {
  std::unique_ptr<Mlp> mlp = MakeMlp(4);
  ASSERT_NE(mlp, nullptr);
  ASSERT_OK(mlp->SetParams(params_));
  ASSERT_OK_AND_ASSIGN(
      BatchResult result,
      mlp->ComputeGradients(images_.data(), labels_.data(), 4));
  const Reference ref = Forward(layout_, params_, images_, labels_, 4);
  EXPECT_NEAR(result.loss, ref.loss, 1e-5 * ref.loss);
  EXPECT_EQ(result.correct, ref.correct);
  EXPECT_EQ(result.examples, 4);
}

TEST_F(MlpTest, GradientsMatchCentralFiniteDifferences) {
  constexpr int kBatch = 4;
  constexpr float kEps = 1e-2f;
  std::unique_ptr<Mlp> mlp = MakeMlp(kBatch);
  ASSERT_NE(mlp, nullptr);
  // Moving a parameter by kEps moves a hidden pre-activation by at most
  // kEps (inputs are within [-1, 1]); keep clear of the ReLU's kink, where
  // finite differences are meaningless.
  ASSERT_GT(Forward(layout_, params_, images_, labels_, kBatch).margin,
            3 * kEps);
  ASSERT_OK(mlp->SetParams(params_));
  ASSERT_OK(
      mlp->ComputeGradients(images_.data(), labels_.data(), kBatch).status());
  std::vector<float> grads(layout_.num_params());
  ASSERT_OK(mlp->GetGradients(absl::MakeSpan(grads)));

  auto loss_at = [&](const std::vector<float>& params) -> double {
    EXPECT_OK(mlp->SetParams(params));
    absl::StatusOr<BatchResult> result =
        mlp->Evaluate(images_.data(), labels_.data(), kBatch);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? result->loss : 0;
  };
  int nonzero = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    std::vector<float> plus = params_, minus = params_;
    plus[i] += kEps;
    minus[i] -= kEps;
    const double numeric =
        (loss_at(plus) - loss_at(minus)) / (double{plus[i]} - minus[i]);
    EXPECT_NEAR(grads[i], numeric, 1e-3 + 1e-2 * std::abs(numeric))
        << "parameter " << i;
    if (std::abs(numeric) > 1e-3) ++nonzero;
  }
  // The check is not vacuous: most parameters have a gradient.
  EXPECT_GT(nonzero, static_cast<int>(params_.size()) / 2);
}

TEST_F(MlpTest, ApplyGradientsStepsAgainstTheGradient) {
  std::unique_ptr<Mlp> mlp = MakeMlp(4);
  ASSERT_NE(mlp, nullptr);
  ASSERT_OK(mlp->SetParams(params_));
  ASSERT_OK(mlp->ComputeGradients(images_.data(), labels_.data(), 4).status());
  std::vector<float> grads(layout_.num_params());
  ASSERT_OK(mlp->GetGradients(absl::MakeSpan(grads)));
  ASSERT_OK(mlp->ApplyGradients(0.5f));
  std::vector<float> after(layout_.num_params());
  ASSERT_OK(mlp->GetParams(absl::MakeSpan(after)));
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_NEAR(after[i], params_[i] - 0.5f * grads[i], 1e-6f) << i;
  }
  // The device gradient buffer is what GetGradients copied.
  std::vector<float> device(layout_.num_params());
  ASSERT_OK(backend_->CopyToHost(mlp->device_gradients(), device.data(),
                                 device.size() * sizeof(float)));
  EXPECT_EQ(device, grads);
}

TEST_F(MlpTest, ApplyGradientsWithMomentumAccumulatesVelocity) {
  std::unique_ptr<Mlp> mlp = MakeMlp(4);
  ASSERT_NE(mlp, nullptr);
  ASSERT_OK(mlp->SetParams(params_));
  const size_t p = layout_.num_params();
  std::vector<float> g1(p), g2(p), after_one(p), after_two(p);
  ASSERT_OK(mlp->ComputeGradients(images_.data(), labels_.data(), 4).status());
  ASSERT_OK(mlp->GetGradients(absl::MakeSpan(g1)));
  // v1 = g1; params -= 0.5 * v1.
  ASSERT_OK(mlp->ApplyGradients(0.5f, 0.9f));
  ASSERT_OK(mlp->GetParams(absl::MakeSpan(after_one)));
  for (size_t i = 0; i < p; ++i) {
    EXPECT_NEAR(after_one[i], params_[i] - 0.5f * g1[i], 1e-6f) << i;
  }
  // v2 = 0.9 * v1 + g2; params -= 0.5 * v2.
  ASSERT_OK(mlp->ComputeGradients(images_.data(), labels_.data(), 4).status());
  ASSERT_OK(mlp->GetGradients(absl::MakeSpan(g2)));
  ASSERT_OK(mlp->ApplyGradients(0.5f, 0.9f));
  ASSERT_OK(mlp->GetParams(absl::MakeSpan(after_two)));
  for (size_t i = 0; i < p; ++i) {
    EXPECT_NEAR(after_two[i], after_one[i] - 0.5f * (0.9f * g1[i] + g2[i]),
                1e-5f)
        << i;
  }
}

TEST_F(MlpTest, TrainingOnOneBatchLowersItsLoss) {
  std::unique_ptr<Mlp> mlp = MakeMlp(4);
  ASSERT_NE(mlp, nullptr);
  ASSERT_OK(mlp->SetParams(params_));
  ASSERT_OK_AND_ASSIGN(
      BatchResult first,
      mlp->ComputeGradients(images_.data(), labels_.data(), 4));
  BatchResult last = first;
  for (int step = 0; step < 50; ++step) {
    ASSERT_OK(mlp->ApplyGradients(0.2f));
    ASSERT_OK_AND_ASSIGN(
        last, mlp->ComputeGradients(images_.data(), labels_.data(), 4));
  }
  EXPECT_LT(last.loss, 0.5 * first.loss);
  EXPECT_EQ(last.correct, 4);
}

TEST_F(MlpTest, EvaluateCoversMoreExamplesThanOneBatch) {
  std::unique_ptr<Mlp> mlp = MakeMlp(4);
  ASSERT_NE(mlp, nullptr);
  ASSERT_OK(mlp->SetParams(params_));
  // 10 examples in batches of 4, 4 and 2.
  ASSERT_OK_AND_ASSIGN(BatchResult result,
                       mlp->Evaluate(images_.data(), labels_.data(), 10));
  const Reference ref = Forward(layout_, params_, images_, labels_, 10);
  EXPECT_NEAR(result.loss, ref.loss, 1e-5 * ref.loss);
  EXPECT_EQ(result.correct, ref.correct);
  EXPECT_EQ(result.examples, 10);
}

TEST_F(MlpTest, ParamsRoundTrip) {
  std::unique_ptr<Mlp> mlp = MakeMlp(2);
  ASSERT_NE(mlp, nullptr);
  ASSERT_OK(mlp->SetParams(params_));
  std::vector<float> out(layout_.num_params());
  ASSERT_OK(mlp->GetParams(absl::MakeSpan(out)));
  EXPECT_EQ(out, params_);
  EXPECT_EQ(mlp->layout().num_params(), 39u);
  EXPECT_EQ(mlp->backend(), backend_.get());
}

TEST_F(MlpTest, WrongSizesAreInvalidArguments) {
  EXPECT_THAT(Mlp::Create(backend_.get(), layout_, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  std::unique_ptr<Mlp> mlp = MakeMlp(4);
  ASSERT_NE(mlp, nullptr);
  std::vector<float> wrong(38);
  EXPECT_THAT(mlp->SetParams(wrong),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       testing::HasSubstr("expected 39 parameters, got 38")));
  EXPECT_THAT(mlp->GetParams(absl::MakeSpan(wrong)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(mlp->GetGradients(absl::MakeSpan(wrong)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(mlp->ComputeGradients(images_.data(), labels_.data(), 5),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       testing::HasSubstr("batch of 5 outside [1, 4]")));
  EXPECT_THAT(mlp->ComputeGradients(images_.data(), labels_.data(), 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace monsoon::worker
