// Times one training step's parts on a ComputeBackend: upload of a batch,
// each layer's forward and backward pass, the loss, gradient download,
// 1-bit quantization on the device and download of the compressed
// gradient, the momentum update, and a whole step through worker::Model,
// each over many iterations (medians). Also times the matrix products of
// each dense and conv layer alone (forward, weight gradient, input
// gradient) and a large square sgemm through the same backend (cuBLAS on a
// GPU, OpenBLAS on the CPU), whose ratio says how far the model's products
// are from the device's sgemm peak (the roofline ratio).
//
// The layers are worker/model's own (MakeLayer), run one at a time in the
// order Model::ComputeGradients runs them, so that each can be timed
// alone; the "whole step" phase runs Model itself as a check.
// Stateless functions; the backend is used by the calling thread only.
#ifndef MONSOON_TOOLS_CUDA_BENCH_BACKEND_BENCH_H_
#define MONSOON_TOOLS_CUDA_BENCH_BACKEND_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_layout.h"
#include "worker/compute_backend.h"

namespace monsoon::tools {

struct BenchOptions {
  // The model: the default MLP on Fashion-MNIST's shape unless set.
  common::ModelLayout layout = common::ModelLayout({784, 256, 128, 10});
  std::string model_name = "784-256-128-10";
  int batch = 64;
  int warmup = 10;
  int iterations = 200;
  int bucket_size = 512;  // 1-bit buckets
  int square = 8192;      // the square sgemm's size; 0 skips it
  int square_iterations = 5;
  // Where set, each group of matrix products is timed on this backend too,
  // on the same buffers (so both backends must have host memory): the CPU
  // backend with every product left to OpenBLAS, beside the one whose
  // narrow products run on kernels of its own.
  worker::ComputeBackend* gemm_reference = nullptr;
  std::string gemm_reference_name;  // its column's heading
};

struct PhaseTiming {
  std::string name;
  int64_t bytes = 0;  // moved across the host link, where it applies
  double median_s = 0;
  double p10_s = 0;
  double p90_s = 0;
};

// The matrix products of some layers (forward, weight gradient and, but
// for the first layer, input gradient), issued back to back.
struct GemmTiming {
  std::string name;  // "layer 1: conv 5x5x6 pad 2", "all conv layers", ...
  int calls = 0;
  double flops = 0;
  PhaseTiming timing;
  PhaseTiming reference;  // on options.gemm_reference; 0 without one
};

struct BenchReport {
  std::string backend;
  BenchOptions options;
  int64_t num_params = 0;
  std::vector<PhaseTiming> phases;
  // Each dense and conv layer's products, then all conv layers' together
  // (where there are any), then the whole step's.
  std::vector<GemmTiming> gemms;
  // The square sgemm (2 * square^3 flops per call); 0 when skipped.
  double square_flops = 0;
  PhaseTiming square_gemm;
  // What could not be measured, and why (printed after the phases).
  std::vector<std::string> notes;
};

// Runs every measurement. INVALID_ARGUMENT for options out of range, or a
// reference backend where either backend has memory of its own; otherwise
// the first error the backend reports.
absl::StatusOr<BenchReport> RunBackendBench(worker::ComputeBackend* backend,
                                            const BenchOptions& options);

// The report as aligned text lines, ending with the FLOP/s comparison.
std::string FormatReport(const BenchReport& report);

}  // namespace monsoon::tools

#endif  // MONSOON_TOOLS_CUDA_BENCH_BACKEND_BENCH_H_
