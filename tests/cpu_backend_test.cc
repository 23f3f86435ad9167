#include "worker/cpu_backend.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "common/model_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/window_geometry.h"
#include "worker/compute_backend.h"
#include "worker/cpu_small_gemm.h"

namespace monsoon::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::HasSubstr;
using ::testing::Pointwise;

// The CPU backend's "device" memory is host memory, so the tests hand it
// ordinary vectors.
class CpuBackendTest : public testing::Test {
 protected:
  CpuBackendTest() : backend_(MakeCpuBackend(1)) {}
  std::unique_ptr<ComputeBackend> backend_;
};

TEST_F(CpuBackendTest, NamesItself) {
  EXPECT_THAT(backend_->Name(), HasSubstr("cpu (OpenBLAS, 1 thread"));
  // Says whether its own kernels take the products with a small side.
  EXPECT_EQ(absl::StrContains(backend_->Name(),
                              "AVX2 for products with a side of 16 or less"),
            SmallGemmSupported());
  EXPECT_EQ(MakeCpuBackend(1, /*small_gemm_kernels=*/false)->Name(),
            "cpu (OpenBLAS, 1 thread)");
}

TEST_F(CpuBackendTest, CannotRecordWorkAndRunsNoneOfIt) {
  std::vector<float> y(4, 1.0f);
  absl::StatusOr<std::unique_ptr<CapturedWork>> work =
      backend_->CaptureWork([&] { backend_->Fill(4, 2.0f, y.data()); });
  EXPECT_EQ(work.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(work.status().message(), HasSubstr("cannot record work"));
  EXPECT_EQ(y, std::vector<float>(4, 1.0f));
}

TEST_F(CpuBackendTest, CopiesRoundTripThroughAllocatedMemory) {
  ASSERT_OK_AND_ASSIGN(float* floats, backend_->AllocateFloats(5));
  ASSERT_OK_AND_ASSIGN(int32_t * ints, backend_->AllocateInts(3));
  const std::vector<float> in = {1.5f, -2, 3, 4, 5};
  const std::vector<int32_t> in_ints = {7, -8, 9};
  ASSERT_OK(backend_->CopyToDevice(in.data(), floats, 5 * sizeof(float)));
  ASSERT_OK(backend_->CopyToDevice(in_ints.data(), ints, 3 * sizeof(int32_t)));
  std::vector<float> out(5);
  std::vector<int32_t> out_ints(3);
  ASSERT_OK(backend_->CopyToHost(floats, out.data(), 5 * sizeof(float)));
  ASSERT_OK(backend_->CopyToHost(ints, out_ints.data(), 3 * sizeof(int32_t)));
  EXPECT_EQ(out, in);
  EXPECT_EQ(out_ints, in_ints);
  EXPECT_OK(backend_->Synchronize());
  backend_->Free(floats);
  backend_->Free(ints);
}

// A = [1 2 3; 4 5 6] (2x3), B = [7 8; 9 10; 11 12] (3x2):
// A * B = [58 64; 139 154].
const std::vector<float> kA = {1, 2, 3, 4, 5, 6};
const std::vector<float> kAT = {1, 4, 2, 5, 3, 6};  // A stored 3x2
const std::vector<float> kB = {7, 8, 9, 10, 11, 12};
const std::vector<float> kBT = {7, 9, 11, 8, 10, 12};  // B stored 2x3

TEST_F(CpuBackendTest, GemmMultipliesRowMajorMatrices) {
  std::vector<float> c(4, 100.0f);
  backend_->Gemm(false, false, 2, 2, 3, 1.0f, kA.data(), kB.data(), 0.0f,
                 c.data());
  EXPECT_THAT(c, ElementsAre(58, 64, 139, 154));
}

TEST_F(CpuBackendTest, GemmTransposesEitherOperand) {
  std::vector<float> c(4, 100.0f);
  backend_->Gemm(true, false, 2, 2, 3, 1.0f, kAT.data(), kB.data(), 0.0f,
                 c.data());
  EXPECT_THAT(c, ElementsAre(58, 64, 139, 154));
  backend_->Gemm(false, true, 2, 2, 3, 1.0f, kA.data(), kBT.data(), 0.0f,
                 c.data());
  EXPECT_THAT(c, ElementsAre(58, 64, 139, 154));
  backend_->Gemm(true, true, 2, 2, 3, 1.0f, kAT.data(), kBT.data(), 0.0f,
                 c.data());
  EXPECT_THAT(c, ElementsAre(58, 64, 139, 154));
}

TEST_F(CpuBackendTest, GemmScalesAndAccumulates) {
  std::vector<float> c = {1, 2, 3, 4};
  // 2 * A * B + 1 * C.
  backend_->Gemm(false, false, 2, 2, 3, 2.0f, kA.data(), kB.data(), 1.0f,
                 c.data());
  EXPECT_THAT(c, ElementsAre(117, 130, 281, 312));
}

TEST_F(CpuBackendTest, GemmOfNonSquareShapes) {
  // A^T (3x2 from A stored 2x3) times A (2x3): 3x3.
  std::vector<float> c(9, 0.0f);
  backend_->Gemm(true, false, 3, 3, 2, 1.0f, kA.data(), kA.data(), 0.0f,
                 c.data());
  EXPECT_THAT(c, ElementsAre(17, 22, 27, 22, 29, 36, 27, 36, 45));
}

// A convolution's products over few filters (its forward pass and weight
// gradient: 6 filters of 25 values at 1,100 positions), which the backend
// may give to its own kernels (cpu_small_gemm.h), and the MLP's kind (64
// rows), which it leaves to OpenBLAS: small integers make every sum exact,
// so each must equal the plain loops' result whichever runs it.
TEST_F(CpuBackendTest, GemmOfAConvolutionsShapesIsExact) {
  auto integers = [](size_t n, int seed) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i)
      v[i] = static_cast<float>((i * 7 + seed) % 9) - 4;
    return v;
  };
  const int rows = 1100, filters = 6, patch = 25;
  const std::vector<float> patches =
      integers(static_cast<size_t>(rows) * patch, 1);
  const std::vector<float> weights =
      integers(filters * patch, 2);  // a row per filter
  const std::vector<float> dout =
      integers(static_cast<size_t>(rows) * filters, 3);
  std::vector<float> want_out(static_cast<size_t>(rows) * filters);
  for (int r = 0; r < rows; ++r) {
    for (int f = 0; f < filters; ++f) {
      float sum = 0;
      for (int i = 0; i < patch; ++i)
        sum += patches[r * patch + i] * weights[f * patch + i];
      want_out[r * filters + f] = sum;
    }
  }
  std::vector<float> want_dw(filters * patch);
  for (int f = 0; f < filters; ++f) {
    for (int i = 0; i < patch; ++i) {
      float sum = 0;
      for (int r = 0; r < rows; ++r)
        sum += dout[r * filters + f] * patches[r * patch + i];
      want_dw[f * patch + i] = sum;
    }
  }
  for (bool kernels : {true, false}) {
    SCOPED_TRACE(kernels ? "small-side kernels where the CPU has them"
                         : "OpenBLAS alone");
    std::unique_ptr<ComputeBackend> backend = MakeCpuBackend(1, kernels);
    std::vector<float> out(want_out.size(), std::nanf(""));
    backend->Gemm(false, true, rows, filters, patch, 1.0f, patches.data(),
                  weights.data(), 0.0f, out.data());
    EXPECT_EQ(out, want_out);
    std::vector<float> dw(want_dw.size(), std::nanf(""));
    backend->Gemm(true, false, filters, patch, rows, 1.0f, dout.data(),
                  patches.data(), 0.0f, dw.data());
    EXPECT_EQ(dw, want_dw);
    // The MLP's output layer: 64 rows of 128 inputs to 10 classes.
    const std::vector<float> x = integers(64 * 128, 4);
    const std::vector<float> w = integers(128 * 10, 5);
    std::vector<float> y(64 * 10);
    backend->Gemm(false, false, 64, 10, 128, 1.0f, x.data(), w.data(), 0.0f,
                  y.data());
    for (int r = 0; r < 64; ++r) {
      for (int j = 0; j < 10; ++j) {
        float sum = 0;
        for (int i = 0; i < 128; ++i) sum += x[r * 128 + i] * w[i * 10 + j];
        ASSERT_EQ(y[r * 10 + j], sum) << "row " << r << " column " << j;
      }
    }
  }
}

TEST_F(CpuBackendTest, AddBiasAddsToEveryRow) {
  std::vector<float> y = {1, 2, 3, 4, 5, 6};
  const std::vector<float> bias = {10, 20, 30};
  backend_->AddBias(2, 3, bias.data(), y.data());
  EXPECT_THAT(y, ElementsAre(11, 22, 33, 14, 25, 36));
}

TEST_F(CpuBackendTest, ReluZeroesNegatives) {
  std::vector<float> y = {-1, 0, 2, -0.5f, 3};
  backend_->Relu(5, y.data());
  EXPECT_THAT(y, ElementsAre(0, 0, 2, 0, 3));
}

TEST_F(CpuBackendTest, ReluBackwardZeroesWhereTheOutputIsNotPositive) {
  const std::vector<float> y = {0, 1, 0, 3, 0.5f};
  std::vector<float> dy = {5, 6, 7, 8, -9};
  backend_->ReluBackward(5, y.data(), dy.data());
  EXPECT_THAT(dy, ElementsAre(0, 6, 0, 8, -9));
}

TEST_F(CpuBackendTest, ColumnSumsOverwriteTheOutput) {
  std::vector<float> sums = {100, 100, 100};
  backend_->ColumnSums(2, 3, kA.data(), sums.data());
  EXPECT_THAT(sums, ElementsAre(5, 7, 9));
}

TEST_F(CpuBackendTest, SoftmaxCrossEntropyOfKnownLogits) {
  // Row 0: logits 0, 0, 0 and label 1: p = 1/3 each, loss ln 3; the arg-max
  // is the first of the tied classes, 0, so the row is wrong.
  // Row 1: logits 0, ln 2, ln 5 and label 2: p = 1/8, 2/8, 5/8, loss
  // -ln(5/8); the arg-max is 2, so the row is right.
  const std::vector<float> logits = {
      0, 0, 0, 0, std::log(2.0f), std::log(5.0f)};
  const std::vector<int32_t> labels = {1, 2};
  std::vector<float> dlogits(6, 100.0f);
  std::vector<float> stats = {10.0f, 1.0f};  // accumulates
  backend_->SoftmaxCrossEntropy(2, 3, logits.data(), labels.data(),
                                dlogits.data(), stats.data());
  EXPECT_NEAR(stats[0], 10.0 + std::log(3.0) - std::log(5.0 / 8.0), 1e-5);
  EXPECT_EQ(stats[1], 2.0f);
  // (softmax - onehot) / rows.
  EXPECT_THAT(dlogits,
              Pointwise(FloatNear(1e-6f),
                        std::vector<float>{1.0f / 6, -1.0f / 3, 1.0f / 6,
                                           1.0f / 16, 1.0f / 8, -3.0f / 16}));
}

TEST_F(CpuBackendTest, SoftmaxCrossEntropyWithoutGradientsOnlyCounts) {
  // Large logits must not overflow: softmax is shifted by the row maximum.
  const std::vector<float> logits = {1000, 0, 999};
  const std::vector<int32_t> labels = {0};
  std::vector<float> stats = {0, 0};
  backend_->SoftmaxCrossEntropy(1, 3, logits.data(), labels.data(), nullptr,
                                stats.data());
  EXPECT_NEAR(stats[0], std::log(1.0 + std::exp(-1000.0) + std::exp(-1.0)),
              1e-6);
  EXPECT_EQ(stats[1], 1.0f);
}

TEST_F(CpuBackendTest, AxpyScaleAndFill) {
  std::vector<float> y = {1, 2, 3};
  const std::vector<float> x = {1, -1, 0.5f};
  backend_->Axpy(3, 2.0f, x.data(), y.data());
  EXPECT_THAT(y, ElementsAre(3, 0, 4));
  backend_->Scale(3, -0.5f, y.data());
  EXPECT_THAT(y, ElementsAre(-1.5f, 0, -2));
  backend_->Fill(2, -7.0f, y.data());
  EXPECT_THAT(y, ElementsAre(-7, -7, -2));
}

// Window operations against plain loops over their definitions, on odd
// shapes with strides, padding and overlapping windows.
using testutil::Window;

// Their kernel rows (kernel x channels values, which Im2Col copies in one
// run) are 3, 4, 5, 6, 8, 9, 12 and 18 values long; the padded windows
// come in both orders of size, so that the backend's zero-bordered copy of
// an image is reused for a smaller one.
std::vector<WindowGeometry> ConvWindows() {
  return {Window(7, 5, 3, 3, 2, 1), Window(6, 9, 2, 4, 1, 3),
          Window(5, 5, 1, 5, 1, 2), Window(4, 6, 4, 1, 1, 0),
          Window(8, 3, 2, 3, 3, 0), Window(6, 7, 1, 3, 1, 1),
          Window(9, 7, 3, 4, 2, 1), Window(5, 6, 6, 3, 1, 1)};
}

// The value Im2Col should put at (row, k): the definition, one value at a
// time.
float PatchValue(const WindowGeometry& g, const std::vector<float>& x,
                 size_t row, int k) {
  const int c = k % g.channels;
  const int kx = (k / g.channels) % g.kernel;
  const int ky = k / (g.channels * g.kernel);
  const int ox = static_cast<int>(row % g.out_width);
  const int oy = static_cast<int>(row / g.out_width % g.out_height);
  const size_t n = row / (static_cast<size_t>(g.out_width) * g.out_height);
  const int iy = oy * g.stride - g.padding + ky;
  const int ix = ox * g.stride - g.padding + kx;
  if (iy < 0 || iy >= g.height || ix < 0 || ix >= g.width) return 0;
  return x[((n * g.height + iy) * g.width + ix) * g.channels + c];
}

TEST_F(CpuBackendTest, Im2ColCopiesEachPatchAndZeroesThePadding) {
  constexpr int kBatch = 2;
  for (const WindowGeometry& g : ConvWindows()) {
    SCOPED_TRACE(testing::Message()
                 << g.height << "x" << g.width << "x" << g.channels << " k"
                 << g.kernel << " s" << g.stride << " p" << g.padding);
    const std::vector<float> x = common::UniformValues(
        static_cast<size_t>(kBatch) * g.height * g.width * g.channels, 1);
    const size_t rows =
        static_cast<size_t>(kBatch) * g.out_height * g.out_width;
    std::vector<float> cols(rows * g.patch(), -99.0f);
    backend_->Im2Col(g, kBatch, x.data(), cols.data());
    for (size_t row = 0; row < rows; ++row) {
      for (int k = 0; k < g.patch(); ++k) {
        ASSERT_EQ(cols[row * g.patch() + k], PatchValue(g, x, row, k))
            << "row " << row << " value " << k;
      }
    }
  }
}

TEST_F(CpuBackendTest, Col2ImAddsEachPatchValueBackWhereItCameFrom) {
  constexpr int kBatch = 2;
  for (const WindowGeometry& g : ConvWindows()) {
    SCOPED_TRACE(testing::Message()
                 << g.height << "x" << g.width << "x" << g.channels << " k"
                 << g.kernel << " s" << g.stride << " p" << g.padding);
    const size_t inputs =
        static_cast<size_t>(kBatch) * g.height * g.width * g.channels;
    const size_t rows =
        static_cast<size_t>(kBatch) * g.out_height * g.out_width;
    const std::vector<float> cols = common::UniformValues(rows * g.patch(), 2);
    // The adjoint of Im2Col by its definition: each input value gets the
    // patch values that are copies of it, in the order of the rows.
    std::vector<float> want(inputs, 0.0f);
    for (size_t row = 0; row < rows; ++row) {
      for (int k = 0; k < g.patch(); ++k) {
        std::vector<float> unit(inputs, 0.0f);
        // Which input Im2Col reads for (row, k): the one whose unit
        // vector gives a 1 there.
        for (size_t i = 0; i < inputs; ++i) {
          unit[i] = 1;
          if (PatchValue(g, unit, row, k) == 1)
            want[i] += cols[row * g.patch() + k];
          unit[i] = 0;
        }
      }
    }
    std::vector<float> dx(inputs, -99.0f);
    backend_->Col2Im(g, kBatch, cols.data(), dx.data());
    EXPECT_EQ(dx, want);
  }
}

TEST_F(CpuBackendTest, ComputesSingleChannelWindowsDirectlyWithIm2ColsBits) {
  if (!SmallGemmSupported()) {
    GTEST_SKIP() << "no AVX2 and FMA: the backend has no direct kernels here";
  }
  // One channel and stride 1: LeNet's first layer, and a smaller window.
  for (const WindowGeometry& g :
       {Window(28, 28, 1, 5, 1, 2), Window(11, 9, 1, 3, 1, 0)}) {
    SCOPED_TRACE(testing::Message() << g.height << "x" << g.width << " k"
                                    << g.kernel << " p" << g.padding);
    // Enough positions (at least 1,024) that the im2col path's products
    // take the same small-side kernels.
    const int batch = 1100 / (g.out_height * g.out_width) + 2;
    const int filters = 6;
    const size_t scratch = backend_->DirectConvScratch(g, filters, batch);
    ASSERT_EQ(scratch, static_cast<size_t>(batch) * (g.height + 2 * g.padding) *
                           (g.width + 2 * g.padding));
    const int rows = batch * g.out_height * g.out_width;
    const std::vector<float> x = common::UniformValues(
        static_cast<size_t>(batch) * g.height * g.width, 1);
    const std::vector<float> w =
        common::UniformValues(static_cast<size_t>(filters) * g.patch(), 2);
    const std::vector<float> bias = common::UniformValues(filters, 3);
    const std::vector<float> dy =
        common::UniformValues(static_cast<size_t>(rows) * filters, 4);

    std::vector<float> cols(static_cast<size_t>(rows) * g.patch());
    std::vector<float> want_y(static_cast<size_t>(rows) * filters);
    backend_->Im2Col(g, batch, x.data(), cols.data());
    backend_->Gemm(false, true, rows, filters, g.patch(), 1.0f, cols.data(),
                   w.data(), 0.0f, want_y.data());
    backend_->AddBias(rows, filters, bias.data(), want_y.data());
    std::vector<float> want_dw(static_cast<size_t>(filters) * g.patch());
    std::vector<float> want_db(filters);
    backend_->Gemm(true, false, filters, g.patch(), rows, 1.0f, dy.data(),
                   cols.data(), 0.0f, want_dw.data());
    backend_->ColumnSums(rows, filters, dy.data(), want_db.data());

    // The scratch's old contents do not matter.
    std::vector<float> space(scratch, std::nanf(""));
    std::vector<float> y(want_y.size(), std::nanf(""));
    backend_->DirectConvForward(g, batch, filters, x.data(), w.data(),
                                bias.data(), y.data(), space.data());
    EXPECT_EQ(y, want_y);
    std::vector<float> dw(want_dw.size(), std::nanf(""));
    std::vector<float> db(filters, std::nanf(""));
    backend_->DirectConvBackward(g, batch, filters, dy.data(), dw.data(),
                                 db.data(), space.data());
    EXPECT_EQ(dw, want_dw);
    EXPECT_EQ(db, want_db);
  }
  // Not for several channels, a stride, or more filters than 16: the layer
  // takes Im2Col there.
  EXPECT_EQ(backend_->DirectConvScratch(Window(28, 28, 3, 5, 1, 2), 6, 4), 0u);
  EXPECT_EQ(backend_->DirectConvScratch(Window(28, 28, 1, 5, 2, 2), 6, 4), 0u);
  EXPECT_EQ(backend_->DirectConvScratch(Window(28, 28, 1, 5, 1, 2), 17, 4), 0u);
  EXPECT_EQ(MakeCpuBackend(1, /*small_gemm_kernels=*/false)
                ->DirectConvScratch(Window(28, 28, 1, 5, 1, 2), 6, 4),
            0u);
}

TEST_F(CpuBackendTest, MaxPoolTakesTheFirstLargestAndRoutesItsGradient) {
  constexpr int kBatch = 2;
  for (WindowGeometry g :
       {Window(7, 5, 3, 2, 2, 0), Window(6, 9, 2, 3, 1, 0),
        Window(5, 5, 1, 5, 1, 0), Window(9, 6, 4, 3, 2, 0),
        // Channels in groups of 4 (8 with AVX2), the last overlapping the
        // one before when 4 (8) does not divide them, or, for 4 to 7
        // channels with AVX2, running into the next output but for the
        // last (LeNet's pools: 6 and 16).
        Window(6, 6, 6, 2, 2, 0), Window(7, 7, 5, 3, 2, 0),
        Window(4, 4, 16, 2, 2, 0), Window(5, 6, 7, 2, 1, 0),
        Window(6, 5, 9, 3, 2, 0), Window(4, 6, 12, 2, 2, 0)}) {
    SCOPED_TRACE(testing::Message()
                 << g.height << "x" << g.width << "x" << g.channels << " k"
                 << g.kernel << " s" << g.stride);
    const size_t inputs =
        static_cast<size_t>(kBatch) * g.height * g.width * g.channels;
    const size_t outputs =
        static_cast<size_t>(kBatch) * g.out_height * g.out_width * g.channels;
    std::vector<float> x = common::UniformValues(inputs, 3);
    for (size_t i = 0; i < inputs; i += 3) x[i] = 0.5f;  // ties
    const std::vector<float> dy = common::UniformValues(outputs, 4);
    std::vector<float> y(outputs);
    std::vector<int32_t> argmax(outputs);
    backend_->MaxPool(g, kBatch, x.data(), y.data(), argmax.data());
    std::vector<float> want_dx(inputs, 0.0f);
    size_t o = 0;
    for (int n = 0; n < kBatch; ++n) {
      for (int oy = 0; oy < g.out_height; ++oy) {
        for (int ox = 0; ox < g.out_width; ++ox) {
          for (int c = 0; c < g.channels; ++c, ++o) {
            size_t best = 0;
            bool found = false;
            for (int ky = 0; ky < g.kernel; ++ky) {
              for (int kx = 0; kx < g.kernel; ++kx) {
                const size_t i =
                    ((static_cast<size_t>(n) * g.height + oy * g.stride + ky) *
                         g.width +
                     ox * g.stride + kx) *
                        g.channels +
                    c;
                if (!found || x[i] > x[best]) best = i;
                found = true;
              }
            }
            ASSERT_EQ(argmax[o], static_cast<int32_t>(best)) << "output " << o;
            ASSERT_EQ(y[o], x[best]);
            want_dx[best] += dy[o];
          }
        }
      }
    }
    std::vector<float> dx(inputs, -99.0f);
    backend_->MaxPoolBackward(g, kBatch, dy.data(), argmax.data(), dx.data());
    EXPECT_EQ(dx, want_dx);
  }
}

}  // namespace
}  // namespace monsoon::worker
