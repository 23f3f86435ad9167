// The CUDA backend against the CPU backend: every operation on random
// non-zero inputs, and whole training steps through Model (an MLP and a
// small convolutional model).
//
// The test reaches the GPU through MakeBackend("cuda"), so this one file
// builds with and without --config=cuda. Where the build has no CUDA backend
// or the machine no usable GPU, each GPU test skips with the reason; with
// MONSOON_REQUIRE_GPU=1 in the environment (tools/cuda_bench/gpu_check.sh
// sets it) that is a failure instead, so that a GPU run cannot pass by
// skipping.
//
// Tolerances: results that one float32 operation per element produces
// (copies, AddBias, Relu, ReluBackward, Scale, Fill, 1-bit bits and decode,
// Im2Col and MaxPool) and the window adjoints (Col2Im, MaxPoolBackward, which
// add in the CPU's order) must be identical; sums and products (Gemm,
// ColumnSums, the softmax, Axpy, the training steps) must agree to a max-norm
// relative error max|gpu - cpu| / max|cpu| under 1e-4, since the two backends
// add in different orders.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/config.h"
#include "common/data_shape.h"
#include "common/model_layout.h"
#include "common/onebit.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/window_geometry.h"
#include "worker/backend_factory.h"
#include "worker/compute_backend.h"
#include "worker/cpu_backend.h"
#include "worker/model/model.h"

namespace monsoon::worker {
namespace {

using ::monsoon::testutil::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr double kTolerance = 1e-4;

bool RequireGpu() {
  const char* value = std::getenv("MONSOON_REQUIRE_GPU");
  return value != nullptr && std::string(value) == "1";
}

// Uniform in [-scale, scale), reproducibly, with no exact zeros.
std::vector<float> RandomValues(size_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> values = common::UniformValues(n, seed, scale);
  for (float& v : values) {
    if (v == 0) v = static_cast<float>(scale * 0.5);
  }
  return values;
}

std::vector<int32_t> RandomLabels(size_t n, int classes, uint64_t seed) {
  std::vector<int32_t> labels(n);
  for (size_t i = 0; i < n; ++i) {
    labels[i] =
        static_cast<int32_t>(common::SplitMix64(seed * 7919 + i) % classes);
  }
  return labels;
}

// max |got - want| / max |want|, with the worst element in the message.
testing::AssertionResult CloseTo(const std::vector<float>& got,
                                 const std::vector<float>& want,
                                 double tolerance = kTolerance) {
  if (got.size() != want.size()) {
    return testing::AssertionFailure()
           << "sizes differ: " << got.size() << " vs " << want.size();
  }
  double scale = 0;
  for (float w : want) scale = std::max(scale, std::abs(double{w}));
  size_t worst = 0;
  double worst_error = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double error = std::abs(double{got[i]} - want[i]);
    if (!(error <= worst_error)) {  // also catches NaN
      worst_error = error;
      worst = i;
    }
  }
  const double relative = scale > 0 ? worst_error / scale : worst_error;
  if (relative < tolerance) return testing::AssertionSuccess();
  return testing::AssertionFailure() << absl::StrFormat(
             "relative error %g (limit %g): element %d is %.9g, want %.9g "
             "(largest |want| %.9g)",
             relative, tolerance, worst, got.empty() ? 0.0f : got[worst],
             want.empty() ? 0.0f : want[worst], scale);
}

testing::AssertionResult Identical(const std::vector<float>& got,
                                   const std::vector<float>& want) {
  if (got.size() != want.size()) {
    return testing::AssertionFailure()
           << "sizes differ: " << got.size() << " vs " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      return testing::AssertionFailure() << absl::StrFormat(
                 "element %d is %.9g, want %.9g", i, got[i], want[i]);
    }
  }
  return testing::AssertionSuccess();
}

// A CUDA backend (or a skip), a CPU backend for reference, and device
// buffers freed at the end of each test.
class CudaBackendTest : public testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<ComputeBackend>> gpu =
        MakeBackend("cuda", 1);
    if (!gpu.ok()) {
      if (gpu.status().code() == absl::StatusCode::kFailedPrecondition &&
          !RequireGpu()) {
        GTEST_SKIP() << "no GPU to test on: " << gpu.status().message();
      }
      FAIL() << "MakeBackend(\"cuda\"): " << gpu.status();
    }
    gpu_ = *std::move(gpu);
    cpu_ = MakeCpuBackend(1);
  }

  void TearDown() override {
    if (gpu_ == nullptr) return;
    for (void* p : allocations_) gpu_->Free(p);
    EXPECT_OK(gpu_->Synchronize());
  }

  // A device copy of `host`.
  template <typename T>
  T* Upload(const std::vector<T>& host) {
    T* device = Allocate<T>(host.size());
    if (device != nullptr && !host.empty()) {
      EXPECT_OK(
          gpu_->CopyToDevice(host.data(), device, host.size() * sizeof(T)));
    }
    return device;
  }

  template <typename T>
  T* Allocate(size_t n) {
    absl::StatusOr<uint8_t*> memory = gpu_->AllocateBytes(n * sizeof(T));
    EXPECT_OK(memory.status());
    if (!memory.ok()) return nullptr;
    allocations_.push_back(*memory);
    return reinterpret_cast<T*>(*memory);
  }

  // The n values at `device`, after all queued work; fails the test on a
  // device error.
  template <typename T>
  std::vector<T> Download(const T* device, size_t n) {
    std::vector<T> host(n);
    EXPECT_OK(gpu_->CopyToHost(device, host.data(), n * sizeof(T)));
    EXPECT_OK(gpu_->Synchronize());
    return host;
  }

  std::unique_ptr<ComputeBackend> gpu_;
  std::unique_ptr<ComputeBackend> cpu_;
  std::vector<void*> allocations_;
};

TEST_F(CudaBackendTest, NamesItsGpu) {
  EXPECT_THAT(gpu_->Name(), StartsWith("cuda:0 ("));
}

TEST_F(CudaBackendTest, CopiesRoundTripAtEverySize) {
  // Sizes around the 2 MiB staging slots, odd byte counts and an offset.
  for (size_t bytes :
       {size_t{1}, size_t{13}, size_t{4096}, (size_t{2} << 20) - 4,
        size_t{2} << 20, (size_t{2} << 20) + 7, size_t{11} << 20}) {
    SCOPED_TRACE(bytes);
    std::vector<uint8_t> in(bytes);
    for (size_t i = 0; i < bytes; ++i) {
      in[i] = static_cast<uint8_t>(common::SplitMix64(bytes + i));
    }
    uint8_t* device = Allocate<uint8_t>(bytes + 3);
    ASSERT_NE(device, nullptr);
    ASSERT_OK(gpu_->CopyToDevice(in.data(), device + 3, bytes));
    std::vector<uint8_t> out(bytes);
    ASSERT_OK(gpu_->CopyToHost(device + 3, out.data(), bytes));
    EXPECT_TRUE(out == in);
  }
  const std::vector<int32_t> ints = {7, -8, 9, std::numeric_limits<int>::min()};
  int32_t* device_ints = Upload(ints);
  EXPECT_EQ(Download(device_ints, ints.size()), ints);
}

TEST_F(CudaBackendTest, BackToBackUploadsEachLandWhereTheyShould) {
  // More uploads than staging slots, with no synchronization in between:
  // a slot must not be refilled before its last copy has left it.
  constexpr int kBuffers = 11;
  constexpr size_t kN = (size_t{3} << 20) / sizeof(float);  // 1.5 slots each
  std::vector<std::vector<float>> host;
  std::vector<float*> device;
  for (int i = 0; i < kBuffers; ++i) {
    host.push_back(RandomValues(kN, 100 + i));
    device.push_back(Allocate<float>(kN));
    ASSERT_NE(device.back(), nullptr);
    ASSERT_OK(gpu_->CopyToDevice(host.back().data(), device.back(),
                                 kN * sizeof(float)));
  }
  for (int i = 0; i < kBuffers; ++i) {
    EXPECT_TRUE(Identical(Download(device[i], kN), host[i])) << "buffer " << i;
  }
}

TEST_F(CudaBackendTest, CopyToHostWaitsForQueuedWork) {
  constexpr size_t kN = size_t{1} << 22;
  float* y = Allocate<float>(kN);
  ASSERT_NE(y, nullptr);
  gpu_->Fill(kN, 0.0f, y);
  for (int i = 0; i < 10; ++i) gpu_->Scale(kN, 2.0f, y);
  gpu_->Fill(kN, 3.5f, y);
  std::vector<float> out(kN);
  // No Synchronize: the copy itself must wait for the kernels before it.
  ASSERT_OK(gpu_->CopyToHost(y, out.data(), kN * sizeof(float)));
  EXPECT_EQ(std::count(out.begin(), out.end(), 3.5f), static_cast<long>(kN));
}

struct GemmShape {
  int m, n, k;
};

TEST_F(CudaBackendTest, GemmMatchesTheCpuForEveryTransposeAndShape) {
  const GemmShape shapes[] = {
      {37, 53, 29}, {1, 7, 300}, {130, 65, 257}, {64, 256, 784}, {5, 1, 1}};
  int seed = 0;
  for (const GemmShape& shape : shapes) {
    for (bool trans_a : {false, true}) {
      for (bool trans_b : {false, true}) {
        SCOPED_TRACE(absl::StrCat("m=", shape.m, " n=", shape.n, " k=", shape.k,
                                  " trans_a=", trans_a, " trans_b=", trans_b));
        const auto a = RandomValues(size_t{1} * shape.m * shape.k, ++seed);
        const auto b = RandomValues(size_t{1} * shape.k * shape.n, ++seed);
        auto c = RandomValues(size_t{1} * shape.m * shape.n, ++seed);
        float* da = Upload(a);
        float* db = Upload(b);
        float* dc = Upload(c);
        gpu_->Gemm(trans_a, trans_b, shape.m, shape.n, shape.k, 0.7f, da, db,
                   -0.3f, dc);
        cpu_->Gemm(trans_a, trans_b, shape.m, shape.n, shape.k, 0.7f, a.data(),
                   b.data(), -0.3f, c.data());
        EXPECT_TRUE(CloseTo(Download(dc, c.size()), c));
        // beta = 0 must ignore what C held (even NaN).
        std::vector<float> nan(c.size(), std::nanf(""));
        ASSERT_OK(
            gpu_->CopyToDevice(nan.data(), dc, nan.size() * sizeof(float)));
        gpu_->Gemm(trans_a, trans_b, shape.m, shape.n, shape.k, 1.0f, da, db,
                   0.0f, dc);
        cpu_->Gemm(trans_a, trans_b, shape.m, shape.n, shape.k, 1.0f, a.data(),
                   b.data(), 0.0f, c.data());
        EXPECT_TRUE(CloseTo(Download(dc, c.size()), c));
      }
    }
  }
}

TEST_F(CudaBackendTest, AddBiasReluAndReluBackwardMatchExactly) {
  for (auto [rows, cols] : {std::pair{64, 256}, std::pair{3, 1},
                            std::pair{1, 1000}, std::pair{300, 33}}) {
    SCOPED_TRACE(absl::StrCat(rows, "x", cols));
    const size_t n = size_t{1} * rows * cols;
    auto y = RandomValues(n, rows * 31 + cols);
    const auto bias = RandomValues(cols, rows * 37 + cols);
    float* dy = Upload(y);
    float* dbias = Upload(bias);
    gpu_->AddBias(rows, cols, dbias, dy);
    cpu_->AddBias(rows, cols, bias.data(), y.data());
    EXPECT_TRUE(Identical(Download(dy, n), y));

    y[0] = 0.0f;  // the kink: ReLU keeps 0, and its backward masks it
    if (n > 1) y[1] = -0.0f;
    ASSERT_OK(gpu_->CopyToDevice(y.data(), dy, n * sizeof(float)));
    gpu_->Relu(n, dy);
    cpu_->Relu(n, y.data());
    EXPECT_TRUE(Identical(Download(dy, n), y));

    auto grad = RandomValues(n, rows * 41 + cols);
    float* dgrad = Upload(grad);
    gpu_->ReluBackward(n, dy, dgrad);
    cpu_->ReluBackward(n, y.data(), grad.data());
    EXPECT_TRUE(Identical(Download(dgrad, n), grad));
    EXPECT_GT(std::count(grad.begin(), grad.end(), 0.0f), 0);
  }
}

TEST_F(CudaBackendTest, ColumnSumsMatchTheCpuAndOverwrite) {
  for (auto [rows, cols] :
       {std::pair{64, 10}, std::pair{1, 7}, std::pair{67, 131},
        std::pair{1000, 10}, std::pair{5, 1}, std::pair{64, 256}}) {
    SCOPED_TRACE(absl::StrCat(rows, "x", cols));
    const auto x = RandomValues(size_t{1} * rows * cols, rows * 13 + cols);
    std::vector<float> sums(cols, 100.0f);
    float* dx = Upload(x);
    float* dsums = Upload(sums);
    gpu_->ColumnSums(rows, cols, dx, dsums);
    cpu_->ColumnSums(rows, cols, x.data(), sums.data());
    EXPECT_TRUE(CloseTo(Download(dsums, cols), sums));
  }
}

TEST_F(CudaBackendTest, SoftmaxCrossEntropyMatchesTheCpu) {
  for (auto [rows, cols] :
       {std::pair{64, 10}, std::pair{1, 2}, std::pair{33, 70},
        std::pair{257, 10}, std::pair{3, 1000}}) {
    SCOPED_TRACE(absl::StrCat(rows, "x", cols));
    const auto logits =
        RandomValues(size_t{1} * rows * cols, rows * 17 + cols, 5.0f);
    const auto labels = RandomLabels(rows, cols, rows + cols);
    std::vector<float> dlogits(logits.size(), 100.0f);
    std::vector<float> stats = {2.5f, 3.0f};  // accumulates
    float* dlogits_in = Upload(logits);
    int32_t* dlabels = Upload(labels);
    float* ddlogits = Upload(dlogits);
    float* dstats = Upload(stats);
    gpu_->SoftmaxCrossEntropy(rows, cols, dlogits_in, dlabels, ddlogits,
                              dstats);
    cpu_->SoftmaxCrossEntropy(rows, cols, logits.data(), labels.data(),
                              dlogits.data(), stats.data());
    EXPECT_TRUE(CloseTo(Download(ddlogits, dlogits.size()), dlogits));
    const std::vector<float> gpu_stats = Download(dstats, 2);
    EXPECT_NEAR(gpu_stats[0], stats[0], kTolerance * std::abs(stats[0]));
    EXPECT_EQ(gpu_stats[1], stats[1]);

    // Without gradients: only the statistics, added again.
    gpu_->SoftmaxCrossEntropy(rows, cols, dlogits_in, dlabels, nullptr, dstats);
    cpu_->SoftmaxCrossEntropy(rows, cols, logits.data(), labels.data(), nullptr,
                              stats.data());
    const std::vector<float> again = Download(dstats, 2);
    EXPECT_NEAR(again[0], stats[0], kTolerance * std::abs(stats[0]));
    EXPECT_EQ(again[1], stats[1]);
  }
}

TEST_F(CudaBackendTest, SoftmaxCrossEntropyBreaksArgMaxTiesByTheFirstIndex) {
  // 70 columns put tied maxima in different lanes and in the same lane.
  constexpr int kCols = 70;
  std::vector<float> logits(4 * kCols, -1.0f);
  std::vector<int32_t> labels = {40, 5, 33, 1};
  // Row 0: maxima at 5 and 40 (lanes 5 and 8); the label 40 loses the tie.
  logits[0 * kCols + 5] = logits[0 * kCols + 40] = 2.0f;
  // Row 1: the same maxima; the label 5 wins it.
  logits[1 * kCols + 5] = logits[1 * kCols + 40] = 2.0f;
  // Row 2: maxima at 33 and 1 (both lane 1); 1 comes first.
  logits[2 * kCols + 1] = logits[2 * kCols + 33] = 3.0f;
  // Row 3: every column tied; the first, 0, is not the label 1.
  std::fill(logits.begin() + 3 * kCols, logits.end(), 0.5f);
  std::vector<float> stats = {0, 0};
  float* dlogits_in = Upload(logits);
  int32_t* dlabels = Upload(labels);
  float* dstats = Upload(stats);
  gpu_->SoftmaxCrossEntropy(4, kCols, dlogits_in, dlabels, nullptr, dstats);
  cpu_->SoftmaxCrossEntropy(4, kCols, logits.data(), labels.data(), nullptr,
                            stats.data());
  EXPECT_EQ(stats[1], 1.0f);  // only row 1
  EXPECT_EQ(Download(dstats, 2)[1], stats[1]);
}

TEST_F(CudaBackendTest, SoftmaxCrossEntropyOfLargeLogitsDoesNotOverflow) {
  const std::vector<float> logits = {1000, 0, 999};
  const std::vector<int32_t> labels = {0};
  std::vector<float> stats = {0, 0};
  float* dlogits_in = Upload(logits);
  int32_t* dlabels = Upload(labels);
  float* dstats = Upload(stats);
  gpu_->SoftmaxCrossEntropy(1, 3, dlogits_in, dlabels, nullptr, dstats);
  const std::vector<float> got = Download(dstats, 2);
  EXPECT_NEAR(got[0], std::log(1.0 + std::exp(-1000.0) + std::exp(-1.0)), 1e-6);
  EXPECT_EQ(got[1], 1.0f);
}

TEST_F(CudaBackendTest, AxpyScaleAndFillMatchTheCpu) {
  for (size_t n : {size_t{1}, size_t{1000}, size_t{235146}, size_t{3} << 20}) {
    SCOPED_TRACE(n);
    auto y = RandomValues(n, n + 1);
    const auto x = RandomValues(n, n + 2);
    float* dy = Upload(y);
    float* dx = Upload(x);
    gpu_->Axpy(n, -0.37f, dx, dy);
    cpu_->Axpy(n, -0.37f, x.data(), y.data());
    EXPECT_TRUE(CloseTo(Download(dy, n), y, 1e-6));
    // Scale and Fill are one rounding per element: identical.
    ASSERT_OK(gpu_->CopyToDevice(y.data(), dy, n * sizeof(float)));
    gpu_->Scale(n, 0.9f, dy);
    cpu_->Scale(n, 0.9f, y.data());
    EXPECT_TRUE(Identical(Download(dy, n), y));
    gpu_->Fill(n - n / 3, -2.25f, dy);
    cpu_->Fill(n - n / 3, -2.25f, y.data());
    EXPECT_TRUE(Identical(Download(dy, n), y));
  }
}

TEST_F(CudaBackendTest, RecordedWorkRunsOnlyWhenReplayedAndThenExactly) {
  const size_t n = 235146;
  auto y = RandomValues(n, 11);
  const auto x = RandomValues(n, 12);
  float* dy = Upload(y);
  float* dx = Upload(x);
  // y = 0.5 * (y + x): an Axpy and a Scale, each one rounding per element.
  absl::StatusOr<std::unique_ptr<CapturedWork>> work = gpu_->CaptureWork([&] {
    gpu_->Axpy(n, 1.0f, dx, dy);
    gpu_->Scale(n, 0.5f, dy);
  });
  ASSERT_OK(work.status());
  // Recording ran nothing.
  EXPECT_TRUE(Identical(Download(dy, n), y));
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE(replay);
    ASSERT_OK((*work)->Replay());
    cpu_->Axpy(n, 1.0f, x.data(), y.data());
    cpu_->Scale(n, 0.5f, y.data());
    EXPECT_TRUE(Identical(Download(dy, n), y));
  }
  // Operations outside the recording still run at once.
  gpu_->Fill(n, 3.0f, dy);
  EXPECT_EQ(Download(dy, n), std::vector<float>(n, 3.0f));
}

TEST_F(CudaBackendTest, AFailedOperationFailsItsRecording) {
  float* y = Allocate<float>(16);
  absl::StatusOr<std::unique_ptr<CapturedWork>> work = gpu_->CaptureWork([&] {
    gpu_->Fill(16, 1.0f, y);
    gpu_->Gemm(false, false, -1, 4, 4, 1.0f, y, y, 0.0f, y);
  });
  EXPECT_THAT(work.status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cublasSgemm: CUBLAS_STATUS_INVALID_VALUE")));
  // The error was reported by the recording, not kept for later.
  EXPECT_OK(gpu_->Synchronize());
  gpu_->Fill(16, 2.0f, y);
  EXPECT_EQ(Download(y, 16), std::vector<float>(16, 2.0f));
}

// Gradients (or residuals, at a smaller scale) with the cases the codec
// must get right once added up: exact zeros and -0 (both quantize to 1), and
// a first bucket of up to 64 values with no negative one.
std::vector<float> CodecInput(size_t n, uint64_t seed, float scale = 0.01f) {
  std::vector<float> g = RandomValues(n, seed, scale);
  for (size_t i = 0; i < n; i += 97) g[i] = 0.0f;
  for (size_t i = 50; i < n; i += 101) g[i] = -0.0f;
  for (size_t i = 0; i < std::min<size_t>(n, 64); ++i) g[i] = std::abs(g[i]);
  return g;
}

TEST_F(CudaBackendTest, OneBitEncodeMatchesTheCodecBitForBit) {
  constexpr size_t kN = 5003;
  for (int bucket : {512, 10, 1, 7, 8, 64, 8192}) {
    SCOPED_TRACE(absl::StrCat("bucket ", bucket));
    const size_t bits_bytes = common::OneBitBitsBytes(kN, bucket);
    const size_t buckets = common::OneBitBuckets(kN, bucket);
    std::vector<float> residual = CodecInput(kN, bucket + 1, 0.001f);
    float* dgrad = Allocate<float>(kN);
    float* dresidual = Upload(residual);
    uint8_t* dbits = Allocate<uint8_t>(bits_bytes);
    float* dscales = Allocate<float>(2 * buckets);
    // Two rounds, so that the second quantizes with the first's error.
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE(absl::StrCat("round ", round));
      const std::vector<float> grad = CodecInput(kN, 10 * bucket + round);
      ASSERT_OK(gpu_->CopyToDevice(grad.data(), dgrad, kN * sizeof(float)));
      ASSERT_OK(
          gpu_->OneBitEncode(dgrad, dresidual, kN, bucket, dbits, dscales));
      common::OneBitEncoded want;
      common::OneBitEncode(grad, absl::MakeSpan(residual), bucket, &want);

      const std::vector<uint8_t> bits = Download(dbits, bits_bytes);
      EXPECT_EQ(std::string(bits.begin(), bits.end()), want.bits);
      std::vector<float> want_scales(2 * buckets);
      std::memcpy(want_scales.data(), want.scales.data(), want.scales.size());
      const std::vector<float> scales = Download(dscales, 2 * buckets);
      // The means are summed in double in another order: equal to float
      // rounding.
      EXPECT_TRUE(CloseTo(scales, want_scales, 1e-6));
      const std::vector<float> got_residual = Download(dresidual, kN);
      double largest_scale = 0;
      for (float s : want_scales) {
        largest_scale = std::max(largest_scale, std::abs(double{s}));
      }
      for (size_t i = 0; i < kN; ++i) {
        ASSERT_NEAR(got_residual[i], residual[i], 1e-6 * largest_scale)
            << "value " << i;
      }
      // Carry on from the GPU's residual, so rounds stay comparable.
      residual = got_residual;
    }
  }
}

TEST_F(CudaBackendTest, OneBitDecodeMatchesTheCodecExactly) {
  constexpr size_t kN = 5003;
  for (int bucket : {512, 10, 1, 8192}) {
    SCOPED_TRACE(absl::StrCat("bucket ", bucket));
    std::vector<float> residual(kN, 0.0f);
    common::OneBitEncoded encoded;
    common::OneBitEncode(CodecInput(kN, bucket), absl::MakeSpan(residual),
                         bucket, &encoded);
    std::vector<float> want(kN);
    ASSERT_OK(common::OneBitDecode(encoded.bits, encoded.scales, bucket,
                                   absl::MakeSpan(want)));
    const std::vector<uint8_t> bits(encoded.bits.begin(), encoded.bits.end());
    std::vector<float> scales(encoded.scales.size() / sizeof(float));
    std::memcpy(scales.data(), encoded.scales.data(), encoded.scales.size());
    uint8_t* dbits = Upload(bits);
    float* dscales = Upload(scales);
    float* dout = Allocate<float>(kN);
    ASSERT_OK(gpu_->OneBitDecode(dbits, dscales, kN, bucket, dout));
    EXPECT_TRUE(Identical(Download(dout, kN), want));
  }
}

TEST_F(CudaBackendTest, OneBitWithABadBucketSizeIsInvalidArgument) {
  float* f = Allocate<float>(8);
  uint8_t* bits = Allocate<uint8_t>(8);
  EXPECT_THAT(gpu_->OneBitEncode(f, f + 4, 4, 0, bits, f),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(gpu_->OneBitDecode(bits, f, 4, -1, f + 4),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(CudaBackendTest, AFailedOperationIsReportedBySynchronizeOnce) {
  float* y = Allocate<float>(16);
  gpu_->Fill(16, 1.0f, y);
  // cuBLAS refuses a negative dimension when the call is made.
  gpu_->Gemm(false, false, -1, 4, 4, 1.0f, y, y, 0.0f, y);
  // Later work still runs, and the first error is the one kept.
  gpu_->Fill(16, 2.0f, y);
  gpu_->Gemm(false, false, 4, -2, 4, 1.0f, y, y, 0.0f, y);
  EXPECT_THAT(gpu_->Synchronize(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cublasSgemm: CUBLAS_STATUS_INVALID_VALUE")));
  EXPECT_OK(gpu_->Synchronize());
  EXPECT_EQ(Download(y, 16), std::vector<float>(16, 2.0f));
}

TEST_F(CudaBackendTest, AnImpossibleAllocationIsResourceExhaustedAndHarmless) {
  EXPECT_THAT(
      gpu_->AllocateFloats(size_t{1} << 42),  // 16 TiB
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("cudaMalloc")));
  // The failure must not be pinned on the next operation.
  float* y = Allocate<float>(4);
  gpu_->Fill(4, 1.5f, y);
  EXPECT_OK(gpu_->Synchronize());
  EXPECT_EQ(Download(y, 4), std::vector<float>(4, 1.5f));
}

TEST_F(CudaBackendTest, TwoBackendsShareTheGpu) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ComputeBackend> other,
                       MakeBackend("cuda", 1));
  constexpr size_t kN = 100000;
  float* mine = Allocate<float>(kN);
  ASSERT_OK_AND_ASSIGN(float* theirs, other->AllocateFloats(kN));
  for (int i = 0; i < 20; ++i) {
    gpu_->Fill(kN, 1.0f * i, mine);
    other->Fill(kN, -1.0f * i, theirs);
  }
  std::vector<float> out(kN);
  ASSERT_OK(other->CopyToHost(theirs, out.data(), kN * sizeof(float)));
  ASSERT_OK(other->Synchronize());
  EXPECT_EQ(out, std::vector<float>(kN, -19.0f));
  EXPECT_EQ(Download(mine, kN), std::vector<float>(kN, 19.0f));
  other->Free(theirs);
}

TEST_F(CudaBackendTest, AutoChoosesTheGpu) {
  std::string why_no_gpu = "unset";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ComputeBackend> backend,
                       MakeBackend("auto", 1, &why_no_gpu));
  EXPECT_THAT(backend->Name(), StartsWith("cuda:0 ("));
  EXPECT_EQ(why_no_gpu, "");
}

// The geometries of the window tests: odd sides, strides, padding,
// overlapping and non-overlapping pools, one and several channels.
std::vector<WindowGeometry> Geometries() {
  std::vector<WindowGeometry> out;
  for (const auto& [h, w, c, k, s, pad] :
       std::vector<std::tuple<int, int, int, int, int, int>>{
           {28, 28, 1, 5, 1, 2},
           {10, 10, 6, 5, 1, 0},
           {7, 5, 3, 3, 2, 1},
           {9, 6, 2, 2, 2, 0},
           {6, 9, 4, 3, 1, 0},
           {5, 5, 1, 1, 1, 0}}) {
    out.push_back(testutil::Window(h, w, c, k, s, pad));
  }
  return out;
}

TEST_F(CudaBackendTest, Im2ColAndCol2ImMatchTheCpuBitForBit) {
  constexpr int kBatch = 3;
  for (const WindowGeometry& g : Geometries()) {
    SCOPED_TRACE(absl::StrCat(g.height, "x", g.width, "x", g.channels, " k",
                              g.kernel, " s", g.stride, " p", g.padding));
    const size_t inputs =
        static_cast<size_t>(kBatch) * g.height * g.width * g.channels;
    const size_t patches =
        static_cast<size_t>(kBatch) * g.out_height * g.out_width * g.patch();
    const std::vector<float> x = RandomValues(inputs, 41);
    const std::vector<float> cols = RandomValues(patches, 42);
    std::vector<float> want_cols(patches), want_dx(inputs);
    cpu_->Im2Col(g, kBatch, x.data(), want_cols.data());
    cpu_->Col2Im(g, kBatch, cols.data(), want_dx.data());
    float* device_cols = Allocate<float>(patches);
    float* device_dx = Allocate<float>(inputs);
    gpu_->Im2Col(g, kBatch, Upload(x), device_cols);
    gpu_->Col2Im(g, kBatch, Upload(cols), device_dx);
    EXPECT_TRUE(Identical(Download(device_cols, patches), want_cols));
    EXPECT_TRUE(Identical(Download(device_dx, inputs), want_dx));
  }
}

TEST_F(CudaBackendTest, MaxPoolAndItsBackwardMatchTheCpuBitForBit) {
  constexpr int kBatch = 3;
  for (WindowGeometry g : Geometries()) {
    g.padding = 0;  // pooling does not pad
    g.out_height = (g.height - g.kernel) / g.stride + 1;
    g.out_width = (g.width - g.kernel) / g.stride + 1;
    SCOPED_TRACE(absl::StrCat(g.height, "x", g.width, "x", g.channels, " k",
                              g.kernel, " s", g.stride));
    const size_t inputs =
        static_cast<size_t>(kBatch) * g.height * g.width * g.channels;
    const size_t outputs =
        static_cast<size_t>(kBatch) * g.out_height * g.out_width * g.channels;
    std::vector<float> x = RandomValues(inputs, 43);
    // Ties, which both must break by the first position.
    for (size_t i = 0; i < inputs; i += 5) x[i] = 0.25f;
    const std::vector<float> dy = RandomValues(outputs, 44);
    std::vector<float> want_y(outputs), want_dx(inputs);
    std::vector<int32_t> want_argmax(outputs);
    cpu_->MaxPool(g, kBatch, x.data(), want_y.data(), want_argmax.data());
    cpu_->MaxPoolBackward(g, kBatch, dy.data(), want_argmax.data(),
                          want_dx.data());
    float* device_y = Allocate<float>(outputs);
    int32_t* device_argmax = Allocate<int32_t>(outputs);
    float* device_dx = Allocate<float>(inputs);
    gpu_->MaxPool(g, kBatch, Upload(x), device_y, device_argmax);
    gpu_->MaxPoolBackward(g, kBatch, Upload(dy), device_argmax, device_dx);
    EXPECT_TRUE(Identical(Download(device_y, outputs), want_y));
    EXPECT_EQ(Download(device_argmax, outputs), want_argmax);
    EXPECT_TRUE(Identical(Download(device_dx, inputs), want_dx));
  }
}

// Whole training steps: the same Model on both backends, forward,
// backward and a momentum update, several times over.
void ExpectStepsMatch(ComputeBackend* gpu, ComputeBackend* cpu,
                      const common::ModelLayout& layout) {
  constexpr int kBatch = 32;
  constexpr int kSteps = 6;
  const int inputs = static_cast<int>(layout.input().size());
  const int classes = layout.num_classes();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> gpu_model,
                       Model::Create(gpu, layout, kBatch));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> cpu_model,
                       Model::Create(cpu, layout, kBatch));
  const std::vector<float> params = RandomValues(layout.num_params(), 1, 0.3f);
  ASSERT_OK(gpu_model->SetParams(params));
  ASSERT_OK(cpu_model->SetParams(params));
  const size_t p = layout.num_params();
  std::vector<float> gpu_values(p), cpu_values(p);
  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const auto images = RandomValues(kBatch * inputs, 100 + step);
    const auto labels = RandomLabels(kBatch, classes, 200 + step);
    ASSERT_OK_AND_ASSIGN(
        BatchResult gpu_result,
        gpu_model->ComputeGradients(images.data(), labels.data(), kBatch));
    ASSERT_OK_AND_ASSIGN(
        BatchResult cpu_result,
        cpu_model->ComputeGradients(images.data(), labels.data(), kBatch));
    EXPECT_NEAR(gpu_result.loss, cpu_result.loss, kTolerance * cpu_result.loss);
    EXPECT_EQ(gpu_result.correct, cpu_result.correct);
    EXPECT_EQ(gpu_result.examples, kBatch);
    ASSERT_OK(gpu_model->GetGradients(absl::MakeSpan(gpu_values)));
    ASSERT_OK(cpu_model->GetGradients(absl::MakeSpan(cpu_values)));
    EXPECT_TRUE(CloseTo(gpu_values, cpu_values));

    ASSERT_OK(gpu_model->ApplyGradients(0.1f, 0.9f));
    ASSERT_OK(cpu_model->ApplyGradients(0.1f, 0.9f));
    ASSERT_OK(gpu_model->GetParams(absl::MakeSpan(gpu_values)));
    ASSERT_OK(cpu_model->GetParams(absl::MakeSpan(cpu_values)));
    EXPECT_TRUE(CloseTo(gpu_values, cpu_values));
  }
  // Evaluation over more examples than one batch (32 + 32 + 36).
  constexpr int kExamples = 100;
  const auto images = RandomValues(kExamples * inputs, 300);
  const auto labels = RandomLabels(kExamples, classes, 301);
  ASSERT_OK_AND_ASSIGN(
      BatchResult gpu_eval,
      gpu_model->Evaluate(images.data(), labels.data(), kExamples));
  ASSERT_OK_AND_ASSIGN(
      BatchResult cpu_eval,
      cpu_model->Evaluate(images.data(), labels.data(), kExamples));
  EXPECT_NEAR(gpu_eval.loss, cpu_eval.loss, kTolerance * cpu_eval.loss);
  EXPECT_EQ(gpu_eval.correct, cpu_eval.correct);
}

TEST_F(CudaBackendTest, TrainingStepsOfAnMlpMatchTheCpu) {
  ExpectStepsMatch(gpu_.get(), cpu_.get(),
                   common::ModelLayout({61, 47, 33, 10}));
}

TEST_F(CudaBackendTest, TrainingStepsOfAConvModelMatchTheCpu) {
  // LeNet's layers on 16x14x2 images and 7 classes: padded and unpadded
  // convs, pooling, dense layers.
  TrainingConfig config;
  config.set_model(LENET);
  common::DataShape data;
  data.example = {16, 14, 2};
  data.num_classes = 7;
  ASSERT_OK_AND_ASSIGN(TrainingConfig resolved,
                       common::ResolveConfig(config, &data));
  ExpectStepsMatch(gpu_.get(), cpu_.get(),
                   common::ModelLayout::FromConfig(resolved));
}

// Runs in every build: what --device=cuda and auto give here.
TEST(CudaSelectionTest, CudaIsAGpuOrSaysWhyNot) {
  absl::StatusOr<std::unique_ptr<ComputeBackend>> gpu = MakeBackend("cuda", 1);
  std::string why_no_gpu;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ComputeBackend> automatic,
                       MakeBackend("auto", 1, &why_no_gpu));
  if (gpu.ok()) {
    EXPECT_THAT((*gpu)->Name(), StartsWith("cuda:0 ("));
    EXPECT_THAT(automatic->Name(), StartsWith("cuda:0 ("));
    EXPECT_EQ(why_no_gpu, "");
    return;
  }
  EXPECT_THAT(gpu, StatusIs(absl::StatusCode::kFailedPrecondition,
                            HasSubstr("--device=cpu")));
  if (!BuiltWithCuda()) {
    EXPECT_THAT(gpu, StatusIs(absl::StatusCode::kFailedPrecondition,
                              HasSubstr("rebuild with --config=cuda")));
  } else {
    EXPECT_THAT(gpu, StatusIs(absl::StatusCode::kFailedPrecondition,
                              HasSubstr("--device=cuda: no usable GPU: ")));
  }
  EXPECT_THAT(automatic->Name(), StartsWith("cpu"));
  EXPECT_FALSE(why_no_gpu.empty());
  EXPECT_THAT(std::string(gpu.status().message()), HasSubstr(why_no_gpu));
  std::cout << "no GPU here: " << why_no_gpu << "\n";
}

TEST(CudaSelectionTest, BadGpuNamesAreInvalidArguments) {
  EXPECT_THAT(
      MakeBackend("cuda:x", 1),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cuda:N")));
  EXPECT_THAT(MakeBackend("cuda:-1", 1),
              StatusIs(absl::StatusCode::kInvalidArgument));
  if (BuiltWithCuda()) {
    EXPECT_THAT(MakeBackend("cuda:4096", 1),
                StatusIs(absl::StatusCode::kFailedPrecondition));
  }
}

}  // namespace
}  // namespace monsoon::worker
