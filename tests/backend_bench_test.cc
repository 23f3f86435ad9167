#include "tools/cuda_bench/backend_bench.h"

#include <memory>
#include <string>

#include "absl/status/status.h"
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
  options.layer_sizes = {20, 16, 8, 4};
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
  ASSERT_EQ(report.phases.size(), 8u);
  for (const PhaseTiming& phase : report.phases) {
    EXPECT_GT(phase.median_s, 0) << phase.name;
    EXPECT_LE(phase.p10_s, phase.median_s) << phase.name;
    EXPECT_LE(phase.median_s, phase.p90_s) << phase.name;
  }
  // Forward 3 products, weight gradients 3, input gradients 2.
  EXPECT_EQ(report.step_gemms, 8);
  EXPECT_DOUBLE_EQ(report.step_gemm_flops,
                   2.0 * 8 * (20 * 16 * 2 + 16 * 8 * 3 + 8 * 4 * 3));
  EXPECT_DOUBLE_EQ(report.square_flops, 2.0 * 64 * 64 * 64);

  const std::string text = FormatReport(report);
  for (const char* line :
       {"backend: cpu", "model 20-16-8-4", "upload batch", "forward",
        "backward", "gradient download", "1-bit quantize (buckets of 16)",
        "1-bit download", "momentum update", "whole step through Mlp",
        "matrix products of one step: 8 sgemm calls", "square sgemm 64^3",
        "roofline ratio"}) {
    EXPECT_THAT(text, HasSubstr(line));
  }
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
  options.layer_sizes = {10};
  EXPECT_THAT(RunBackendBench(backend.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace monsoon::tools
