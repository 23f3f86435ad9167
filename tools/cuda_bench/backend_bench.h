// Times one training step's parts on a ComputeBackend: upload of a batch,
// forward, backward, gradient download, 1-bit quantization on the device
// and download of the compressed gradient, the momentum update, and a whole
// step through Mlp, each over many iterations (medians). Also times the
// step's matrix products alone and a large square sgemm through the same
// backend (cuBLAS on a GPU, OpenBLAS on the CPU), whose ratio says how far
// the model's small products are from the device's sgemm peak (the
// roofline ratio).
//
// The forward and backward phases issue the same operations as
// Mlp::ComputeGradients (worker/mlp.cc), one phase at a time, so that each
// can be timed alone; the "whole step" phase runs Mlp itself as a check.
// Stateless functions; the backend is used by the calling thread only.
#ifndef MONSOON_TOOLS_CUDA_BENCH_BACKEND_BENCH_H_
#define MONSOON_TOOLS_CUDA_BENCH_BACKEND_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/compute_backend.h"

namespace monsoon::tools {

struct BenchOptions {
  std::vector<int> layer_sizes = {784, 256, 128, 10};
  int batch = 64;
  int warmup = 10;
  int iterations = 200;
  int bucket_size = 512;  // 1-bit buckets
  int square = 8192;      // the square sgemm's size; 0 skips it
  int square_iterations = 5;
};

struct PhaseTiming {
  std::string name;
  int64_t bytes = 0;  // moved across the host link, where it applies
  double median_s = 0;
  double p10_s = 0;
  double p90_s = 0;
};

struct BenchReport {
  std::string backend;
  BenchOptions options;
  int64_t num_params = 0;
  std::vector<PhaseTiming> phases;
  // The step's matrix products (forward, weight gradients, input
  // gradients), issued back to back.
  int step_gemms = 0;
  double step_gemm_flops = 0;
  PhaseTiming step_gemm;
  // The square sgemm (2 * square^3 flops per call); 0 when skipped.
  double square_flops = 0;
  PhaseTiming square_gemm;
};

// Runs every measurement. INVALID_ARGUMENT for options out of range;
// otherwise the first error the backend reports.
absl::StatusOr<BenchReport> RunBackendBench(worker::ComputeBackend* backend,
                                            const BenchOptions& options);

// The report as aligned text lines, ending with the FLOP/s comparison.
std::string FormatReport(const BenchReport& report);

}  // namespace monsoon::tools

#endif  // MONSOON_TOOLS_CUDA_BENCH_BACKEND_BENCH_H_
