#include "tools/cuda_bench/backend_bench.h"

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/config.h"
#include "common/model_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "worker/compute_backend.h"
#include "worker/cpu_backend.h"

namespace monsoon::tools {
namespace {

using ::monsoon::testutil::StatusIs;
using ::testing::HasSubstr;

BenchOptions Small() {
  BenchOptions options;
  options.layout = common::ModelLayout({20, 16, 8, 4});
  options.model_name = "20-16-8-4";
  options.batch = 8;
  options.warmup = 1;
  options.iterations = 5;
  options.bucket_size = 16;
  options.square = 64;
  options.square_iterations = 2;
  return options;
}

TEST(BackendBenchTest, TimesEveryPhaseOnTheCpu) {
  std::unique_ptr<worker::ComputeBackend> backend = worker::MakeCpuBackend(1);
  ASSERT_OK_AND_ASSIGN(BenchReport report,
                       RunBackendBench(backend.get(), Small()));
  EXPECT_EQ(report.num_params, 20 * 16 + 16 + 16 * 8 + 8 + 8 * 4 + 4);
  // Upload; 5 layers forward; the loss; 5 backward; download; 1-bit
  // quantize and download; momentum; the device step op by op (the CPU
  // cannot record it as one graph: no phase, no note); the whole step.
  ASSERT_EQ(report.phases.size(), 18u);
  EXPECT_EQ(report.phases[16].name,
            "device step, op by op (forward to update)");
  EXPECT_TRUE(report.notes.empty());
  for (const PhaseTiming& phase : report.phases) {
    EXPECT_GT(phase.median_s, 0) << phase.name;
    EXPECT_LE(phase.p10_s, phase.median_s) << phase.name;
    EXPECT_LE(phase.median_s, phase.p90_s) << phase.name;
  }
  // Each dense layer's products, then the step's: forward 3 products,
  // weight gradients 3, input gradients 2 (none for the first layer).
  ASSERT_EQ(report.gemms.size(), 4u);
  EXPECT_EQ(report.gemms[0].name, "layer 1: dense 16");
  EXPECT_EQ(report.gemms[0].calls, 2);
  EXPECT_DOUBLE_EQ(report.gemms[0].flops, 2.0 * 8 * 20 * 16 * 2);
  EXPECT_EQ(report.gemms[2].name, "layer 5: dense 4");
  EXPECT_EQ(report.gemms[3].name, "the whole step");
  EXPECT_EQ(report.gemms[3].calls, 8);
  EXPECT_DOUBLE_EQ(report.gemms[3].flops,
                   2.0 * 8 * (20 * 16 * 2 + 16 * 8 * 3 + 8 * 4 * 3));
  EXPECT_DOUBLE_EQ(report.square_flops, 2.0 * 64 * 64 * 64);

  const std::string text = FormatReport(report);
  for (const char* line :
       {"backend: cpu", "model 20-16-8-4 on 1x1x20 examples", "upload batch",
        "forward layer 1: dense 16", "forward layer 2: relu",
        "softmax cross-entropy", "backward layer 5: dense 4",
        "gradient download", "1-bit quantize (buckets of 16)", "1-bit download",
        "momentum update", "device step, op by op", "whole step through Model",
        "the whole step",
        "square sgemm 64^3", "roofline ratio"}) {
    EXPECT_THAT(text, HasSubstr(line));
  }
}

TEST(BackendBenchTest, TimesConvLayersAndTheirProductsApart) {
  TrainingConfig config;
  config.add_layers()->mutable_conv()->set_filters(2);  // 3x3: 6x6 to 4x4
  config.add_layers()->mutable_relu();
  config.add_layers()->mutable_max_pool()->set_size(2);  // to 2x2x2
  config.add_layers()->mutable_dense();
  for (int side : {6, 6, 1}) config.add_input_shape(side);
  config.set_num_classes(3);
  ASSERT_OK_AND_ASSIGN(TrainingConfig resolved, common::ResolveConfig(config));
  BenchOptions options = Small();
  options.layout = common::ModelLayout::FromConfig(resolved);
  options.model_name = "small conv";
  std::unique_ptr<worker::ComputeBackend> backend = worker::MakeCpuBackend(1);
  ASSERT_OK_AND_ASSIGN(BenchReport report,
                       RunBackendBench(backend.get(), options));
  ASSERT_EQ(report.gemms.size(), 4u);
  EXPECT_EQ(report.gemms[0].name, "layer 1: conv 3x3x2");
  // 8 examples x 16 positions, patches of 9, 2 filters; no input gradient.
  EXPECT_DOUBLE_EQ(report.gemms[0].flops, 2.0 * 8 * 16 * 9 * 2 * 2);
  EXPECT_EQ(report.gemms[1].name, "layer 4: dense 3");
  EXPECT_DOUBLE_EQ(report.gemms[1].flops, 2.0 * 8 * 8 * 3 * 3);
  EXPECT_EQ(report.gemms[2].name, "all conv layers");
  EXPECT_DOUBLE_EQ(report.gemms[2].flops, report.gemms[0].flops);
  EXPECT_EQ(report.gemms[3].name, "the whole step");
  EXPECT_EQ(report.gemms[3].calls, 5);
  EXPECT_THAT(FormatReport(report), HasSubstr("forward layer 3: max_pool 2"));
}

TEST(BackendBenchTest, TimesEachGroupOfProductsOnTheReferenceToo) {
  std::unique_ptr<worker::ComputeBackend> backend = worker::MakeCpuBackend(1);
  std::unique_ptr<worker::ComputeBackend> openblas =
      worker::MakeCpuBackend(1, /*small_gemm_kernels=*/false);
  BenchOptions options = Small();
  ASSERT_OK_AND_ASSIGN(BenchReport alone,
                       RunBackendBench(backend.get(), options));
  for (const GemmTiming& g : alone.gemms) EXPECT_EQ(g.reference.median_s, 0);
  EXPECT_THAT(FormatReport(alone), testing::Not(HasSubstr("OpenBLAS alone")));

  options.gemm_reference = openblas.get();
  options.gemm_reference_name = "OpenBLAS alone";
  ASSERT_OK_AND_ASSIGN(BenchReport report,
                       RunBackendBench(backend.get(), options));
  ASSERT_EQ(report.gemms.size(), 4u);
  for (const GemmTiming& g : report.gemms) {
    EXPECT_GT(g.timing.median_s, 0) << g.name;
    EXPECT_GT(g.reference.median_s, 0) << g.name;
  }
  EXPECT_THAT(FormatReport(report),
              HasSubstr("OpenBLAS alone: median, rate, of square"));
}

TEST(BackendBenchTest, WithoutTheSquareThereIsNoRatio) {
  std::unique_ptr<worker::ComputeBackend> backend = worker::MakeCpuBackend(1);
  BenchOptions options = Small();
  options.square = 0;
  ASSERT_OK_AND_ASSIGN(BenchReport report,
                       RunBackendBench(backend.get(), options));
  EXPECT_EQ(report.square_flops, 0);
  EXPECT_THAT(FormatReport(report), testing::Not(HasSubstr("roofline")));
}

TEST(BackendBenchTest, BadOptionsAreInvalidArguments) {
  std::unique_ptr<worker::ComputeBackend> backend = worker::MakeCpuBackend(1);
  BenchOptions options = Small();
  options.batch = 0;
  EXPECT_THAT(RunBackendBench(backend.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument));
  options = Small();
  options.layout = common::ModelLayout({10});
  EXPECT_THAT(RunBackendBench(backend.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace monsoon::tools
