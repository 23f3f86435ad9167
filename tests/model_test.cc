#include "worker/model/model.h"

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/config.h"
#include "common/data_shape.h"
#include "common/model_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "worker/compute_backend.h"
#include "worker/cpu_backend.h"

namespace monsoon::worker {
namespace {

using ::monsoon::testutil::StatusIs;

// The network's mean loss and correct count, in double on the host, from
// the layers' definitions (direct convolution and pooling loops, no
// im2col), as the reference; *margin gets the smallest |value| entering a
// ReLU and the smallest gap between a pooling window's two largest values
// (but for windows of zeros), which say how far the parameters are from a
// kink.
struct Reference {
  double loss = 0;
  int64_t correct = 0;
  double margin = std::numeric_limits<double>::infinity();
};
Reference Forward(const common::ModelLayout& layout,
                  const std::vector<double>& params,
                  const std::vector<float>& images,
                  const std::vector<int32_t>& labels, int n) {
  using Kind = common::LayerSpec::Kind;
  Reference ref;
  const size_t in_size = layout.input().size();
  for (int e = 0; e < n; ++e) {
    std::vector<double> x(images.begin() + e * in_size,
                          images.begin() + (e + 1) * in_size);
    for (const common::LayerSpec& layer : layout.layers()) {
      const common::Shape& in = layer.in;
      const common::Shape& out = layer.out;
      // x and y are channels last: (row * width + column) * channels + c.
      std::vector<double> y(out.size(), 0.0);
      auto at = [](const common::Shape& s, int r, int c, int ch) {
        return (static_cast<size_t>(r) * s.width + c) * s.channels + ch;
      };
      if (layer.kind == Kind::kDense) {
        const common::TensorSpec& w = layout.tensors()[layer.weights];
        const common::TensorSpec& b = layout.tensors()[layer.bias];
        for (uint64_t j = 0; j < w.cols; ++j) {
          y[j] = params[b.offset + j];
          for (uint64_t i = 0; i < w.rows; ++i) {
            y[j] += x[i] * params[w.offset + i * w.cols + j];
          }
        }
      } else if (layer.kind == Kind::kConv) {
        const common::TensorSpec& w = layout.tensors()[layer.weights];
        const common::TensorSpec& b = layout.tensors()[layer.bias];
        for (int oy = 0; oy < out.height; ++oy) {
          for (int ox = 0; ox < out.width; ++ox) {
            for (int f = 0; f < out.channels; ++f) {
              double sum = params[b.offset + f];
              for (int ky = 0; ky < layer.kernel; ++ky) {
                for (int kx = 0; kx < layer.kernel; ++kx) {
                  const int iy = oy * layer.stride - layer.padding + ky;
                  const int ix = ox * layer.stride - layer.padding + kx;
                  if (iy < 0 || iy >= in.height || ix < 0 || ix >= in.width) {
                    continue;
                  }
                  for (int c = 0; c < in.channels; ++c) {
                    const size_t row =
                        (static_cast<size_t>(ky) * layer.kernel + kx) *
                            in.channels +
                        c;
                    // W: a row of the patch's weights per filter.
                    sum += x[at(in, iy, ix, c)] *
                           params[w.offset + f * w.cols + row];
                  }
                }
              }
              y[at(out, oy, ox, f)] = sum;
            }
          }
        }
      } else if (layer.kind == Kind::kMaxPool) {
        for (int oy = 0; oy < out.height; ++oy) {
          for (int ox = 0; ox < out.width; ++ox) {
            for (int c = 0; c < out.channels; ++c) {
              std::vector<double> window;
              for (int ky = 0; ky < layer.kernel; ++ky) {
                for (int kx = 0; kx < layer.kernel; ++kx) {
                  window.push_back(x[at(in, oy * layer.stride + ky,
                                        ox * layer.stride + kx, c)]);
                }
              }
              std::sort(window.rbegin(), window.rend());
              // Zeros from a ReLU tie without a kink: they stay 0 (and
              // pass no gradient) while the ReLU's inputs keep their sign.
              if (window.size() > 1 && window[0] != 0) {
                ref.margin = std::min(ref.margin, window[0] - window[1]);
              }
              y[at(out, oy, ox, c)] = window[0];
            }
          }
        }
      } else {  // ReLU
        for (size_t i = 0; i < x.size(); ++i) {
          ref.margin = std::min(ref.margin, std::abs(x[i]));
          y[i] = std::max(x[i], 0.0);
        }
      }
      x = std::move(y);
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
Reference Forward(const common::ModelLayout& layout,
                  const std::vector<float>& params,
                  const std::vector<float>& images,
                  const std::vector<int32_t>& labels, int n) {
  return Forward(layout, std::vector<double>(params.begin(), params.end()),
                 images, labels, n);
}

class MlpModelTest : public testing::Test {
 protected:
  MlpModelTest()
      : backend_(MakeCpuBackend(1)),
        layout_({5, 4, 3}),
        params_(common::UniformValues(layout_.num_params(), 1)),
        images_(common::UniformValues(10 * 5, 2)),
        labels_({0, 1, 2, 1, 2, 0, 0, 1, 2, 2}) {}

  std::unique_ptr<Model> MakeModel(int max_batch) {
    absl::StatusOr<std::unique_ptr<Model>> model =
        Model::Create(backend_.get(), layout_, max_batch);
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? *std::move(model) : nullptr;
  }

  std::unique_ptr<ComputeBackend> backend_;
  const common::ModelLayout layout_;
  std::vector<float> params_;
  const std::vector<float> images_;
  const std::vector<int32_t> labels_;
};

TEST_F(MlpModelTest, LossMatchesAHostReference) {
  std::unique_ptr<Model> model = MakeModel(4);
  ASSERT_NE(model, nullptr);
  ASSERT_OK(model->SetParams(params_));
  ASSERT_OK_AND_ASSIGN(
      BatchResult result,
      model->ComputeGradients(images_.data(), labels_.data(), 4));
  const Reference ref = Forward(layout_, params_, images_, labels_, 4);
  EXPECT_NEAR(result.loss, ref.loss, 1e-5 * ref.loss);
  EXPECT_EQ(result.correct, ref.correct);
  EXPECT_EQ(result.examples, 4);
}

TEST_F(MlpModelTest, GradientsMatchCentralFiniteDifferences) {
  constexpr int kBatch = 4;
  constexpr float kEps = 1e-2f;
  std::unique_ptr<Model> model = MakeModel(kBatch);
  ASSERT_NE(model, nullptr);
  // Moving a parameter by kEps moves a hidden pre-activation by at most
  // kEps (inputs are within [-1, 1]); keep clear of the ReLU's kink, where
  // finite differences are meaningless.
  ASSERT_GT(Forward(layout_, params_, images_, labels_, kBatch).margin,
            3 * kEps);
  ASSERT_OK(model->SetParams(params_));
  ASSERT_OK(
      model->ComputeGradients(images_.data(), labels_.data(), kBatch).status());
  std::vector<float> grads(layout_.num_params());
  ASSERT_OK(model->GetGradients(absl::MakeSpan(grads)));

  auto loss_at = [&](const std::vector<float>& params) -> double {
    EXPECT_OK(model->SetParams(params));
    absl::StatusOr<BatchResult> result =
        model->Evaluate(images_.data(), labels_.data(), kBatch);
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

TEST_F(MlpModelTest, ApplyGradientsStepsAgainstTheGradient) {
  std::unique_ptr<Model> model = MakeModel(4);
  ASSERT_NE(model, nullptr);
  ASSERT_OK(model->SetParams(params_));
  ASSERT_OK(
      model->ComputeGradients(images_.data(), labels_.data(), 4).status());
  std::vector<float> grads(layout_.num_params());
  ASSERT_OK(model->GetGradients(absl::MakeSpan(grads)));
  ASSERT_OK(model->ApplyGradients(0.5f));
  std::vector<float> after(layout_.num_params());
  ASSERT_OK(model->GetParams(absl::MakeSpan(after)));
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_NEAR(after[i], params_[i] - 0.5f * grads[i], 1e-6f) << i;
  }
  // The device gradient buffer is what GetGradients copied.
  std::vector<float> device(layout_.num_params());
  ASSERT_OK(backend_->CopyToHost(model->device_gradients(), device.data(),
                                 device.size() * sizeof(float)));
  EXPECT_EQ(device, grads);
}

TEST_F(MlpModelTest, WeightDecayAddsItsMultipleOfTheWeights) {
  std::unique_ptr<Model> model = MakeModel(4);
  ASSERT_NE(model, nullptr);
  ASSERT_OK(model->SetParams(params_));
  const size_t p = layout_.num_params();
  std::vector<float> plain(p), decayed(p);
  ASSERT_OK(
      model->ComputeGradients(images_.data(), labels_.data(), 4).status());
  ASSERT_OK(model->GetGradients(absl::MakeSpan(plain)));
  model->set_weight_decay(0.25f);
  ASSERT_OK(
      model->ComputeGradients(images_.data(), labels_.data(), 4).status());
  ASSERT_OK(model->GetGradients(absl::MakeSpan(decayed)));
  for (size_t i = 0; i < p; ++i) {
    // OpenBLAS's saxpy: one multiply-add per value.
    EXPECT_FLOAT_EQ(decayed[i], plain[i] + 0.25f * params_[i]) << i;
  }
}

TEST_F(MlpModelTest, GradientScaleMultipliesTheGradientsWeightDecayIncluded) {
  std::unique_ptr<Model> model = MakeModel(4);
  ASSERT_NE(model, nullptr);
  ASSERT_OK(model->SetParams(params_));
  model->set_weight_decay(0.25f);
  const size_t p = layout_.num_params();
  std::vector<float> plain(p), scaled(p);
  ASSERT_OK(
      model->ComputeGradients(images_.data(), labels_.data(), 4).status());
  ASSERT_OK(model->GetGradients(absl::MakeSpan(plain)));
  model->set_gradient_scale(0.25f);
  ASSERT_OK(
      model->ComputeGradients(images_.data(), labels_.data(), 4).status());
  ASSERT_OK(model->GetGradients(absl::MakeSpan(scaled)));
  for (size_t i = 0; i < p; ++i) {
    // A power of two: exact.
    EXPECT_EQ(scaled[i], 0.25f * plain[i]) << i;
  }
}

TEST_F(MlpModelTest, ApplyGradientsWithMomentumAccumulatesVelocity) {
  std::unique_ptr<Model> model = MakeModel(4);
  ASSERT_NE(model, nullptr);
  ASSERT_OK(model->SetParams(params_));
  const size_t p = layout_.num_params();
  std::vector<float> g1(p), g2(p), after_one(p), after_two(p);
  ASSERT_OK(
      model->ComputeGradients(images_.data(), labels_.data(), 4).status());
  ASSERT_OK(model->GetGradients(absl::MakeSpan(g1)));
  // v1 = g1; params -= 0.5 * v1.
  ASSERT_OK(model->ApplyGradients(0.5f, 0.9f));
  ASSERT_OK(model->GetParams(absl::MakeSpan(after_one)));
  for (size_t i = 0; i < p; ++i) {
    EXPECT_NEAR(after_one[i], params_[i] - 0.5f * g1[i], 1e-6f) << i;
  }
  // v2 = 0.9 * v1 + g2; params -= 0.5 * v2.
  ASSERT_OK(
      model->ComputeGradients(images_.data(), labels_.data(), 4).status());
  ASSERT_OK(model->GetGradients(absl::MakeSpan(g2)));
  ASSERT_OK(model->ApplyGradients(0.5f, 0.9f));
  ASSERT_OK(model->GetParams(absl::MakeSpan(after_two)));
  for (size_t i = 0; i < p; ++i) {
    EXPECT_NEAR(after_two[i], after_one[i] - 0.5f * (0.9f * g1[i] + g2[i]),
                1e-5f)
        << i;
  }
}

TEST_F(MlpModelTest, TrainingOnOneBatchLowersItsLoss) {
  std::unique_ptr<Model> model = MakeModel(4);
  ASSERT_NE(model, nullptr);
  ASSERT_OK(model->SetParams(params_));
  ASSERT_OK_AND_ASSIGN(
      BatchResult first,
      model->ComputeGradients(images_.data(), labels_.data(), 4));
  BatchResult last = first;
  for (int step = 0; step < 50; ++step) {
    ASSERT_OK(model->ApplyGradients(0.2f));
    ASSERT_OK_AND_ASSIGN(
        last, model->ComputeGradients(images_.data(), labels_.data(), 4));
  }
  EXPECT_LT(last.loss, 0.5 * first.loss);
  EXPECT_EQ(last.correct, 4);
}

TEST_F(MlpModelTest, EvaluateCoversMoreExamplesThanOneBatch) {
  std::unique_ptr<Model> model = MakeModel(4);
  ASSERT_NE(model, nullptr);
  ASSERT_OK(model->SetParams(params_));
  // 10 examples in batches of 4, 4 and 2.
  ASSERT_OK_AND_ASSIGN(BatchResult result,
                       model->Evaluate(images_.data(), labels_.data(), 10));
  const Reference ref = Forward(layout_, params_, images_, labels_, 10);
  EXPECT_NEAR(result.loss, ref.loss, 1e-5 * ref.loss);
  EXPECT_EQ(result.correct, ref.correct);
  EXPECT_EQ(result.examples, 10);
}

TEST_F(MlpModelTest, ParamsRoundTrip) {
  std::unique_ptr<Model> model = MakeModel(2);
  ASSERT_NE(model, nullptr);
  ASSERT_OK(model->SetParams(params_));
  std::vector<float> out(layout_.num_params());
  ASSERT_OK(model->GetParams(absl::MakeSpan(out)));
  EXPECT_EQ(out, params_);
  EXPECT_EQ(model->layout().num_params(), 39u);
  EXPECT_EQ(model->backend(), backend_.get());
}

TEST_F(MlpModelTest, WrongSizesAreInvalidArguments) {
  EXPECT_THAT(Model::Create(backend_.get(), layout_, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  std::unique_ptr<Model> model = MakeModel(4);
  ASSERT_NE(model, nullptr);
  std::vector<float> wrong(38);
  EXPECT_THAT(model->SetParams(wrong),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       testing::HasSubstr("expected 39 parameters, got 38")));
  EXPECT_THAT(model->GetParams(absl::MakeSpan(wrong)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(model->GetGradients(absl::MakeSpan(wrong)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(model->ComputeGradients(images_.data(), labels_.data(), 5),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       testing::HasSubstr("batch of 5 outside [1, 4]")));
  EXPECT_THAT(model->ComputeGradients(images_.data(), labels_.data(), 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// A small model with every kind of layer on odd shapes: 7x5x2 images, a
// conv with stride 2 and padding, ReLU, an overlapping max pool, a second
// conv, a flatten and the dense output layer.
common::ModelLayout ConvLayout() {
  TrainingConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(
        layers { conv { filters: 3 kernel: 3 stride: 2 padding: 1 } }
        layers { relu {} }
        layers { max_pool { size: 2 stride: 1 } }
        layers { conv { filters: 2 kernel: 2 } }
        layers { relu {} }
        layers { flatten {} }
        layers { dense {} }
        input_shape: [ 7, 5, 2 ]
        num_classes: 3
      )pb",
      &config));
  absl::StatusOr<TrainingConfig> resolved = common::ResolveConfig(config);
  EXPECT_TRUE(resolved.ok()) << resolved.status();
  return common::ModelLayout::FromConfig(resolved.ok() ? *resolved : config);
}

class ConvModelTest : public testing::Test {
 protected:
  static constexpr int kBatch = 4;
  ConvModelTest()
      : backend_(MakeCpuBackend(1)),
        layout_(ConvLayout()),
        params_(common::UniformValues(layout_.num_params(), 5, 0.7f)),
        images_(common::UniformValues(kBatch * 7 * 5 * 2, 4)),
        labels_({2, 0, 1, 2}) {}

  std::unique_ptr<ComputeBackend> backend_;
  const common::ModelLayout layout_;
  const std::vector<float> params_;
  const std::vector<float> images_;
  const std::vector<int32_t> labels_;
};

TEST_F(ConvModelTest, LayersHaveTheShapesTheirDefinitionsGive) {
  std::vector<std::string> shapes;
  for (const common::LayerSpec& layer : layout_.layers()) {
    shapes.push_back(common::ShapeString(layer.out));
  }
  // (7 + 2 - 3) / 2 + 1 = 4 rows, (5 + 2 - 3) / 2 + 1 = 3 columns; the
  // pool of 2 with stride 1 takes one off each side; the 2x2 conv another.
  EXPECT_THAT(shapes, testing::ElementsAre("4x3x3", "4x3x3", "3x2x3", "2x1x2",
                                           "2x1x2", "1x1x3"));
  // 3x3x2 x 3 + 3, 2x2x3 x 2 + 2, 4 x 3 + 3.
  EXPECT_EQ(layout_.num_params(), 57u + 26u + 15u);
}

TEST_F(ConvModelTest, GradientsEqualTheReferencesDerivative) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> model,
                       Model::Create(backend_.get(), layout_, kBatch));
  ASSERT_OK(model->SetParams(params_));
  ASSERT_OK_AND_ASSIGN(
      BatchResult result,
      model->ComputeGradients(images_.data(), labels_.data(), kBatch));
  std::vector<float> grads(layout_.num_params());
  ASSERT_OK(model->GetGradients(absl::MakeSpan(grads)));

  const std::vector<double> at(params_.begin(), params_.end());
  const Reference ref = Forward(layout_, at, images_, labels_, kBatch);
  EXPECT_NEAR(result.loss, ref.loss, 1e-5 * ref.loss);
  EXPECT_EQ(result.correct, ref.correct);
  // Central differences of the double reference are exact to ~1e-9 away
  // from kinks; a step of kH moves no ReLU input or pooling gap by more
  // than about 10 * kH here, well inside the margin.
  constexpr double kH = 1e-6;
  ASSERT_GT(ref.margin, 1e-3);
  int nonzero = 0;
  for (size_t i = 0; i < at.size(); ++i) {
    std::vector<double> plus = at, minus = at;
    plus[i] += kH;
    minus[i] -= kH;
    const double numeric =
        (Forward(layout_, plus, images_, labels_, kBatch).loss -
         Forward(layout_, minus, images_, labels_, kBatch).loss) /
        (2 * kH);
    EXPECT_NEAR(grads[i], numeric, 1e-5 + 1e-4 * std::abs(numeric))
        << "parameter " << i;
    if (std::abs(numeric) > 1e-4) ++nonzero;
  }
  // Not vacuous: every layer's parameters are reached.
  EXPECT_GT(nonzero, static_cast<int>(at.size()) * 3 / 4);
}

TEST_F(ConvModelTest, TrainingOnOneBatchLowersItsLoss) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> model,
                       Model::Create(backend_.get(), layout_, kBatch));
  ASSERT_OK(model->SetParams(params_));
  ASSERT_OK_AND_ASSIGN(
      BatchResult first,
      model->ComputeGradients(images_.data(), labels_.data(), kBatch));
  BatchResult last = first;
  for (int step = 0; step < 100; ++step) {
    ASSERT_OK(model->ApplyGradients(0.05f, 0.9f));
    ASSERT_OK_AND_ASSIGN(
        last, model->ComputeGradients(images_.data(), labels_.data(), kBatch));
  }
  EXPECT_LT(last.loss, 0.25 * first.loss);
  EXPECT_EQ(last.correct, kBatch);
}

TEST_F(ConvModelTest, EvaluateInSmallerBatchesGivesTheSameLoss) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> whole,
                       Model::Create(backend_.get(), layout_, kBatch));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> pieces,
                       Model::Create(backend_.get(), layout_, 3));
  ASSERT_OK(whole->SetParams(params_));
  ASSERT_OK(pieces->SetParams(params_));
  ASSERT_OK_AND_ASSIGN(BatchResult a,
                       whole->Evaluate(images_.data(), labels_.data(), kBatch));
  ASSERT_OK_AND_ASSIGN(
      BatchResult b, pieces->Evaluate(images_.data(), labels_.data(), kBatch));
  EXPECT_NEAR(a.loss, b.loss, 1e-6 * a.loss);
  EXPECT_EQ(a.correct, b.correct);
}

// The lenet preset's layout on Fashion-MNIST's shape, with He weights on
// the output layer too, so that every layer shapes the loss (the preset's
// output layer starts at zero).
common::ModelLayout LenetLayout() {
  TrainingConfig config;
  config.set_model(LENET);
  common::DataShape fashion_mnist;
  fashion_mnist.example = {28, 28, 1};
  fashion_mnist.num_classes = 10;
  absl::StatusOr<TrainingConfig> resolved =
      common::ResolveConfig(config, &fashion_mnist);
  EXPECT_OK(resolved.status());
  if (!resolved.ok()) return common::ModelLayout({1, 1});
  resolved->clear_output_init();
  return common::ModelLayout::FromConfig(*resolved);
}

TEST(LenetModelTest, HasTheDocumentedSizeAndTrainsAStep) {
  const common::ModelLayout layout = LenetLayout();
  EXPECT_EQ(layout.num_params(), 61706u);
  EXPECT_EQ(layout.Describe(),
            "conv 5x5x6 pad 2, relu, max_pool 2, conv 5x5x16, relu, "
            "max_pool 2, dense 120, relu, dense 84, relu, dense 10");
  // 2 x (28*28*25*6 + 10*10*150*16 + 400*120 + 120*84 + 84*10).
  EXPECT_EQ(layout.ForwardFlops(),
            2u * (117600 + 240000 + 48000 + 10080 + 840));
  std::unique_ptr<ComputeBackend> backend = MakeCpuBackend(1);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> model,
                       Model::Create(backend.get(), layout, 8));
  std::vector<float> params(layout.num_params());
  common::InitialValues(layout, 1, 0, absl::MakeSpan(params));
  ASSERT_OK(model->SetParams(params));
  const std::vector<float> images = common::UniformValues(8 * 784, 5);
  const std::vector<int32_t> labels = {0, 1, 2, 3, 4, 5, 6, 7};
  ASSERT_OK_AND_ASSIGN(
      BatchResult result,
      model->ComputeGradients(images.data(), labels.data(), 8));
  const Reference ref = Forward(layout, params, images, labels, 8);
  EXPECT_NEAR(result.loss, ref.loss, 1e-5 * ref.loss);
  EXPECT_EQ(result.correct, ref.correct);
}

// Backward hears of each layer's gradients as they become final, from the
// output layer down, at block boundaries (multiples of 32), and weight decay
// and the scale, applied layer by layer, give the same bits as one pass
// over the whole vector.
TEST(LenetModelTest, GradientsAreFinalLayerByLayerAndAsOnePassWouldMakeThem) {
  const common::ModelLayout layout = LenetLayout();
  std::unique_ptr<ComputeBackend> backend = MakeCpuBackend(1);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> model,
                       Model::Create(backend.get(), layout, 8));
  const size_t p = layout.num_params();
  std::vector<float> params(p);
  common::InitialValues(layout, 1, 0, absl::MakeSpan(params));
  ASSERT_OK(model->SetParams(params));
  const std::vector<int32_t> labels = {0, 1, 2, 3, 4, 5, 6, 7};
  // Several batches: a split at the wrong place changes only the values
  // whose multiply-add rounds differently fused, about one in a hundred.
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(seed);
    const std::vector<float> images = common::UniformValues(8 * 784, seed);
    model->set_weight_decay(0);
    model->set_gradient_scale(1);
    ASSERT_OK(
        model->ComputeGradients(images.data(), labels.data(), 8).status());
    std::vector<float> expected(p);
    ASSERT_OK(model->GetGradients(absl::MakeSpan(expected)));
    backend->Axpy(p, 0.0005f, params.data(), expected.data());
    backend->Scale(p, 0.1f, expected.data());

    model->set_weight_decay(0.0005f);
    model->set_gradient_scale(0.1f);
    std::vector<uint64_t> ready;
    ASSERT_OK(model
                  ->ComputeGradients(
                      images.data(), labels.data(), 8,
                      [&](uint64_t from) { ready.push_back(from); })
                  .status());
    // The layers' weights start at 60856, 50692, 2572, 156 and 0.
    ASSERT_THAT(ready, testing::ElementsAre(60864, 50720, 2592, 160, 0));
    std::vector<float> layered(p);
    ASSERT_OK(model->GetGradients(absl::MakeSpan(layered)));
    for (size_t i = 0; i < p; ++i) {
      ASSERT_EQ(std::memcmp(&layered[i], &expected[i], sizeof(float)), 0)
          << "gradient " << i << ": " << layered[i] << " against "
          << expected[i];
    }
  }
}

TEST(ModelCreateTest, RefusesBatchesWhoseBuffersOutgrowIntIndices) {
  std::unique_ptr<ComputeBackend> backend = MakeCpuBackend(1);
  // 2^20 inputs: 2^11 examples would make 2^31 values.
  const common::ModelLayout layout({1 << 20, 2});
  EXPECT_THAT(Model::Create(backend.get(), layout, 1 << 11),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       testing::HasSubstr("use smaller batches")));
}

}  // namespace
}  // namespace monsoon::worker
