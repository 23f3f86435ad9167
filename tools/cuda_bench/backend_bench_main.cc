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
#include "absl/strings/str_split.h"
#include "tools/cuda_bench/backend_bench.h"
#include "worker/backend_factory.h"

ABSL_FLAG(std::string, device, "auto", "auto, cpu, cuda or cuda:N.");
ABSL_FLAG(int, cpu_threads, 0,
          "OpenBLAS threads for the CPU backend; 0 keeps OpenBLAS's default "
          "(every core), which is what the CPU's sgemm rate needs.");
ABSL_FLAG(std::string, layers, "784,256,128,10",
          "The MLP's layer sizes, input first (the config's default).");
ABSL_FLAG(int, batch, 64, "Examples per step (the config's default).");
ABSL_FLAG(int, iterations, 200, "Timed runs of each phase.");
ABSL_FLAG(int, warmup, 10, "Untimed runs before them.");
ABSL_FLAG(int, bucket_size, 512, "1-bit bucket size.");
ABSL_FLAG(int, square, -1,
          "Size n of the n^3 sgemm that gives the device's rate: -1 picks "
          "8192 on a GPU and 2048 on the CPU; 0 skips it.");
ABSL_FLAG(int, square_iterations, 5, "Timed runs of the square sgemm.");

namespace {

constexpr int kUsageError = 2;

int Fail(int code, const absl::Status& status) {
  std::fprintf(stderr, "backend_bench: error: %s\n", status.ToString().c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times a training step's parts on a compute backend (medians) and the "
      "MLP's matrix products against a large square sgemm on the same "
      "device.\n\n  backend_bench --device=cuda\n  backend_bench "
      "--device=cpu --square=2048");
  absl::ParseCommandLine(argc, argv);

  monsoon::tools::BenchOptions options;
  options.layer_sizes.clear();
  for (absl::string_view size :
       absl::StrSplit(absl::GetFlag(FLAGS_layers), ',')) {
    int value = 0;
    if (!absl::SimpleAtoi(size, &value)) {
      return Fail(kUsageError,
                  absl::InvalidArgumentError(
                      "--layers: comma-separated sizes, e.g. 784,256,128,10"));
    }
    options.layer_sizes.push_back(value);
  }
  options.batch = absl::GetFlag(FLAGS_batch);
  options.iterations = absl::GetFlag(FLAGS_iterations);
  options.warmup = absl::GetFlag(FLAGS_warmup);
  options.bucket_size = absl::GetFlag(FLAGS_bucket_size);
  options.square_iterations = absl::GetFlag(FLAGS_square_iterations);

  const std::string device = absl::GetFlag(FLAGS_device);
  std::string why_no_gpu;
  auto backend = monsoon::worker::MakeBackend(
      device, absl::GetFlag(FLAGS_cpu_threads), &why_no_gpu);
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
