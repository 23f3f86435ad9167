// backend_bench: times one training step's parts on a compute backend and
// compares the model's matrix products with a large square sgemm on the
// same device (see backend_bench.h). Says first whether a GPU is present.
//
//   bazel build --config=cuda //tools/cuda_bench:backend_bench
//   bazel-bin/tools/cuda_bench/backend_bench --device=cuda
//   bazel-bin/tools/cuda_bench/backend_bench --device=cpu
//
// Exit codes: 0 after a report, 2 for a bad flag or an unavailable device,
// 1 for any other failure.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/model_config.h"
#include "tools/cuda_bench/backend_bench.h"
#include "worker/backend_factory.h"
#include "worker/cpu_backend.h"

ABSL_FLAG(std::string, device, "auto", "auto, cpu, cuda or cuda:N.");
ABSL_FLAG(int, cpu_threads, 0,
          "OpenBLAS threads for the CPU backend; 0 keeps OpenBLAS's default "
          "(every core), which is what the CPU's sgemm rate needs.");
ABSL_FLAG(std::string, model, "mlp",
          "The model: mlp (the default 784-256-128-10 on Fashion-MNIST's "
          "shape) or lenet.");
ABSL_FLAG(std::string, input_shape, "28,28,1",
          "The examples' height,width,channels (Fashion-MNIST's by default).");
ABSL_FLAG(int, classes, 10, "The number of classes.");
ABSL_FLAG(std::string, layers, "",
          "An MLP's layer sizes instead of --model, input first, e.g. "
          "784,256,128,10.");
ABSL_FLAG(int, batch, 64, "Examples per step (the config's default).");
ABSL_FLAG(int, iterations, 200, "Timed runs of each phase.");
ABSL_FLAG(int, warmup, 10, "Untimed runs before them.");
ABSL_FLAG(int, bucket_size, 512, "1-bit bucket size.");
ABSL_FLAG(int, square, -1,
          "Size n of the n^3 sgemm that gives the device's rate: -1 picks "
          "8192 on a GPU and 2048 on the CPU; 0 skips it.");
ABSL_FLAG(int, square_iterations, 5, "Timed runs of the square sgemm.");
ABSL_FLAG(bool, small_gemm_kernels, true,
          "On the CPU with one thread: run products with a side of 16 or less "
          "(a convolution over few filters) on the backend's AVX2 kernels, "
          "and time every product group with OpenBLAS alone beside them. "
          "false leaves every product to OpenBLAS.");

namespace {

constexpr int kUsageError = 2;

int Fail(int code, const absl::Status& status) {
  std::fprintf(stderr, "backend_bench: error: %s\n", status.ToString().c_str());
  return code;
}

// The model of --layers, or of --model on --input_shape and --classes,
// resolved as a training config would be; and its name.
absl::StatusOr<std::pair<monsoon::common::ModelLayout, std::string>>
LayoutFromFlags() {
  monsoon::TrainingConfig config;
  std::string name;
  if (!absl::GetFlag(FLAGS_layers).empty()) {
    auto sizes = monsoon::common::ParseIntList(absl::GetFlag(FLAGS_layers));
    if (!sizes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--layers: ", sizes.status().message()));
    }
    for (int size : *sizes) config.add_layer_sizes(size);
    name = absl::StrJoin(*sizes, "-");
  } else {
    auto model = monsoon::common::ParseModel(absl::GetFlag(FLAGS_model));
    if (!model.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model: ", model.status().message()));
    }
    if (*model == monsoon::SPARSE_LR) {
      return absl::InvalidArgumentError(
          "--model: the backends run the layer models, mlp and lenet");
    }
    config.set_model(*model);
    name = monsoon::common::ModelName(*model);
  }
  auto shape = monsoon::common::ParseIntList(absl::GetFlag(FLAGS_input_shape));
  if (!shape.ok() || shape->size() != 3) {
    return absl::InvalidArgumentError(
        "--input_shape: height,width,channels, e.g. 28,28,1");
  }
  monsoon::common::DataShape data;
  data.example = {(*shape)[0], (*shape)[1], (*shape)[2]};
  data.num_classes = absl::GetFlag(FLAGS_classes);
  config.set_batch_size(absl::GetFlag(FLAGS_batch));
  auto resolved = monsoon::common::ResolveConfig(config, &data);
  if (!resolved.ok()) return resolved.status();
  return std::make_pair(monsoon::common::ModelLayout::FromConfig(*resolved),
                        name);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times a training step's parts on a compute backend (medians), layer "
      "by layer, and the model's matrix products against a large square "
      "sgemm on the same device.\n\n  backend_bench --device=cuda\n  "
      "backend_bench --device=cpu --model=lenet --cpu_threads=1");
  absl::ParseCommandLine(argc, argv);

  monsoon::tools::BenchOptions options;
  absl::StatusOr<std::pair<monsoon::common::ModelLayout, std::string>> model =
      LayoutFromFlags();
  if (!model.ok()) return Fail(kUsageError, model.status());
  options.layout = model->first;
  options.model_name = model->second;
  options.batch = absl::GetFlag(FLAGS_batch);
  options.iterations = absl::GetFlag(FLAGS_iterations);
  options.warmup = absl::GetFlag(FLAGS_warmup);
  options.bucket_size = absl::GetFlag(FLAGS_bucket_size);
  options.square_iterations = absl::GetFlag(FLAGS_square_iterations);

  const std::string device = absl::GetFlag(FLAGS_device);
  const int cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  std::string why_no_gpu;
  absl::StatusOr<std::unique_ptr<monsoon::worker::ComputeBackend>> backend =
      monsoon::worker::MakeBackend(device, cpu_threads, &why_no_gpu);
  if (backend.ok() && !absl::StartsWith((*backend)->Name(), "cuda")) {
    backend = monsoon::worker::MakeCpuBackend(
        cpu_threads, absl::GetFlag(FLAGS_small_gemm_kernels));
  }
  if (!backend.ok()) {
    return Fail(backend.status().code() == absl::StatusCode::kResourceExhausted
                    ? 1
                    : kUsageError,
                backend.status());
  }
  const bool on_gpu = absl::StartsWith((*backend)->Name(), "cuda");
  if (on_gpu) {
    std::printf("GPU: %s\n", (*backend)->Name().c_str());
  } else if (!why_no_gpu.empty()) {
    std::printf("NO GPU: --device=auto fell back to the CPU: %s\n",
                why_no_gpu.c_str());
  } else {
    // --device=cpu: say whether a GPU was there all the same.
    auto gpu = monsoon::worker::MakeBackend("cuda", 1);
    if (gpu.ok()) {
      std::printf("GPU present but not used (--device=%s): %s\n",
                  device.c_str(), (*gpu)->Name().c_str());
    } else {
      std::printf("NO GPU: %s\n", std::string(gpu.status().message()).c_str());
    }
  }
  // The CPU backend's own kernels, timed against OpenBLAS alone.
  std::unique_ptr<monsoon::worker::ComputeBackend> openblas_alone;
  if (!on_gpu && absl::StrContains((*backend)->Name(), "AVX2")) {
    openblas_alone = monsoon::worker::MakeCpuBackend(cpu_threads, false);
    options.gemm_reference = openblas_alone.get();
    options.gemm_reference_name = "OpenBLAS alone";
  }
  int square = absl::GetFlag(FLAGS_square);
  if (square < 0) square = on_gpu ? 8192 : 2048;
  options.square = square;
  std::fflush(stdout);

  auto report = monsoon::tools::RunBackendBench(backend->get(), options);
  if (!report.ok()) {
    return Fail(report.status().code() == absl::StatusCode::kInvalidArgument
                    ? kUsageError
                    : 1,
                report.status());
  }
  std::printf("%s", monsoon::tools::FormatReport(*report).c_str());
  if (!on_gpu) {
    std::printf(
        "(CPU backend: these are the CPU's numbers, not a GPU's; run with "
        "--device=cuda where a GPU is present)\n");
  }
  return 0;
}
