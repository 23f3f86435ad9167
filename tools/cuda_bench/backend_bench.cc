#include "tools/cuda_bench/backend_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "common/model_layout.h"
#include "common/onebit.h"
#include "worker/mlp.h"

namespace monsoon::tools {
namespace {

using worker::ComputeBackend;

// Device buffers, freed when the run ends.
class Buffers {
 public:
  explicit Buffers(ComputeBackend* backend) : backend_(backend) {}
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  ~Buffers() {
    for (void* p : owned_) backend_->Free(p);
  }

  absl::StatusOr<float*> Floats(size_t n) {
    return Keep(backend_->AllocateFloats(n));
  }
  absl::StatusOr<int32_t*> Ints(size_t n) {
    return Keep(backend_->AllocateInts(n));
  }
  absl::StatusOr<uint8_t*> Bytes(size_t n) {
    return Keep(backend_->AllocateBytes(n));
  }

 private:
  template <typename T>
  absl::StatusOr<T*> Keep(absl::StatusOr<T*> p) {
    if (p.ok()) owned_.push_back(*p);
    return p;
  }

  ComputeBackend* const backend_;
  std::vector<void*> owned_;
};

double Percentile(std::vector<double> sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t i = static_cast<size_t>(q * (sorted.size() - 1) + 0.5);
  return sorted[std::min(i, sorted.size() - 1)];
}

// Runs `queue` (which queues work on the backend) and then Synchronize,
// `warmup` times untimed and `iterations` times timed.
absl::StatusOr<PhaseTiming> Time(ComputeBackend* backend, std::string name,
                                 int64_t bytes, int warmup, int iterations,
                                 const std::function<absl::Status()>& queue) {
  std::vector<double> seconds;
  seconds.reserve(iterations);
  for (int i = 0; i < warmup + iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = queue();
    absl::Status synced = backend->Synchronize();
    const auto end = std::chrono::steady_clock::now();
    if (!status.ok()) return status;
    if (!synced.ok()) return synced;
    if (i >= warmup) {
      seconds.push_back(std::chrono::duration<double>(end - start).count());
    }
  }
  std::sort(seconds.begin(), seconds.end());
  PhaseTiming timing;
  timing.name = std::move(name);
  timing.bytes = bytes;
  timing.median_s = Percentile(seconds, 0.5);
  timing.p10_s = Percentile(seconds, 0.1);
  timing.p90_s = Percentile(seconds, 0.9);
  return timing;
}

std::string Seconds(double s) {
  if (s >= 1) return absl::StrFormat("%.3g s", s);
  if (s >= 1e-3) return absl::StrFormat("%.3g ms", s * 1e3);
  return absl::StrFormat("%.3g us", s * 1e6);
}

std::string Bytes(int64_t bytes) {
  if (bytes <= 0) return "";
  if (bytes >= (int64_t{1} << 20)) {
    return absl::StrFormat("%.1f MiB", bytes / double{1 << 20});
  }
  return absl::StrFormat("%.1f KiB", bytes / 1024.0);
}

std::string Rate(double flops_per_s) {
  if (flops_per_s >= 1e12)
    return absl::StrFormat("%.3g TFLOP/s", flops_per_s / 1e12);
  return absl::StrFormat("%.3g GFLOP/s", flops_per_s / 1e9);
}

absl::Status Validate(const BenchOptions& o) {
  if (o.layer_sizes.size() < 2 ||
      *std::min_element(o.layer_sizes.begin(), o.layer_sizes.end()) < 1) {
    return absl::InvalidArgumentError(
        "layer sizes: at least two, each at least 1");
  }
  if (o.batch < 1 || o.iterations < 1 || o.warmup < 0 || o.bucket_size < 1 ||
      o.square < 0 || o.square_iterations < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "batch %d, iterations %d, square iterations %d and bucket size %d "
        "must be at least 1; warm-up %d and square %d at least 0",
        o.batch, o.iterations, o.square_iterations, o.bucket_size, o.warmup,
        o.square));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BenchReport> RunBackendBench(ComputeBackend* backend,
                                            const BenchOptions& options) {
  if (auto s = Validate(options); !s.ok()) return s;
  BenchReport report;
  report.backend = backend->Name();
  report.options = options;
  const common::ModelLayout layout(options.layer_sizes);
  const std::vector<int>& sizes = layout.layer_sizes();
  const int layers = layout.num_layers();
  const int batch = options.batch;
  const size_t p = layout.num_params();
  report.num_params = static_cast<int64_t>(p);

  Buffers buffers(backend);
  // Parameters, gradients, optimizer and 1-bit state, activations and
  // deltas, as Mlp allocates them.
  absl::StatusOr<float*> params = buffers.Floats(p);
  absl::StatusOr<float*> grads = buffers.Floats(p);
  absl::StatusOr<float*> velocity = buffers.Floats(p);
  absl::StatusOr<float*> residual = buffers.Floats(p);
  absl::StatusOr<float*> stats = buffers.Floats(2);
  absl::StatusOr<int32_t*> labels = buffers.Ints(batch);
  const size_t bits_bytes = common::OneBitBitsBytes(p, options.bucket_size);
  const size_t scale_count = 2 * common::OneBitBuckets(p, options.bucket_size);
  absl::StatusOr<uint8_t*> bits = buffers.Bytes(bits_bytes);
  absl::StatusOr<float*> scales = buffers.Floats(scale_count);
  for (const absl::Status& s :
       {params.status(), grads.status(), velocity.status(), residual.status(),
        stats.status(), labels.status(), bits.status(), scales.status()}) {
    if (!s.ok()) return s;
  }
  std::vector<float*> activations(sizes.size(), nullptr);
  std::vector<float*> deltas(sizes.size(), nullptr);
  for (size_t l = 0; l < sizes.size(); ++l) {
    const size_t n = static_cast<size_t>(batch) * sizes[l];
    absl::StatusOr<float*> a = buffers.Floats(n);
    if (!a.ok()) return a.status();
    activations[l] = *a;
    if (l > 0) {
      absl::StatusOr<float*> d = buffers.Floats(n);
      if (!d.ok()) return d.status();
      deltas[l] = *d;
    }
  }

  std::vector<float> host_params(p);
  common::InitialValues(layout, /*seed=*/1, 0, absl::MakeSpan(host_params));
  const std::vector<float> images =
      common::UniformValues(static_cast<size_t>(batch) * sizes[0], 2);
  std::vector<int32_t> host_labels(batch);
  for (int i = 0; i < batch; ++i) {
    host_labels[i] =
        static_cast<int32_t>(common::SplitMix64(i) % sizes[layers]);
  }
  if (auto s =
          backend->CopyToDevice(host_params.data(), *params, p * sizeof(float));
      !s.ok()) {
    return s;
  }
  backend->Fill(p, 0.0f, *velocity);
  backend->Fill(p, 0.0f, *residual);
  if (auto s = backend->Synchronize(); !s.ok()) return s;

  auto run = [&](std::string name, int64_t bytes,
                 const std::function<absl::Status()>& queue) -> absl::Status {
    absl::StatusOr<PhaseTiming> timing =
        Time(backend, std::move(name), bytes, options.warmup,
             options.iterations, queue);
    if (!timing.ok()) return timing.status();
    report.phases.push_back(*std::move(timing));
    return absl::OkStatus();
  };

  const int64_t upload_bytes = static_cast<int64_t>(batch) *
                               (sizes[0] * sizeof(float) + sizeof(int32_t));
  if (auto s = run("upload batch (images + labels)", upload_bytes,
                   [&] {
                     if (auto s = backend->CopyToDevice(
                             images.data(), activations[0],
                             images.size() * sizeof(float));
                         !s.ok()) {
                       return s;
                     }
                     return backend->CopyToDevice(host_labels.data(), *labels,
                                                  batch * sizeof(int32_t));
                   });
      !s.ok()) {
    return s;
  }

  // As Mlp::Forward with backward = true.
  auto forward = [&] {
    backend->Fill(2, 0.0f, *stats);
    for (int l = 0; l < layers; ++l) {
      const float* w = *params + layout.weights(l).offset;
      const float* b = *params + layout.bias(l).offset;
      backend->Gemm(false, false, batch, sizes[l + 1], sizes[l], 1.0f,
                    activations[l], w, 0.0f, activations[l + 1]);
      backend->AddBias(batch, sizes[l + 1], b, activations[l + 1]);
      if (l + 1 < layers) {
        backend->Relu(static_cast<size_t>(batch) * sizes[l + 1],
                      activations[l + 1]);
      }
    }
    backend->SoftmaxCrossEntropy(batch, sizes[layers], activations[layers],
                                 *labels, deltas[layers], *stats);
    return absl::OkStatus();
  };
  // As the backward half of Mlp::ComputeGradients.
  auto backward = [&] {
    for (int l = layers - 1; l >= 0; --l) {
      backend->Gemm(true, false, sizes[l], sizes[l + 1], batch, 1.0f,
                    activations[l], deltas[l + 1], 0.0f,
                    *grads + layout.weights(l).offset);
      backend->ColumnSums(batch, sizes[l + 1], deltas[l + 1],
                          *grads + layout.bias(l).offset);
      if (l > 0) {
        backend->Gemm(false, true, batch, sizes[l], sizes[l + 1], 1.0f,
                      deltas[l + 1], *params + layout.weights(l).offset, 0.0f,
                      deltas[l]);
        backend->ReluBackward(static_cast<size_t>(batch) * sizes[l],
                              activations[l], deltas[l]);
      }
    }
    return absl::OkStatus();
  };
  if (auto s = run("forward (with loss gradient)", 0, forward); !s.ok()) {
    return s;
  }
  if (auto s = run("backward", 0, backward); !s.ok()) return s;

  std::vector<float> host_grads(p);
  if (auto s = run("gradient download", static_cast<int64_t>(p * sizeof(float)),
                   [&] {
                     return backend->CopyToHost(*grads, host_grads.data(),
                                                p * sizeof(float));
                   });
      !s.ok()) {
    return s;
  }

  // The 1-bit phases, where the backend has the codec.
  const absl::Status probe = backend->OneBitEncode(
      *grads, *residual, p, options.bucket_size, *bits, *scales);
  if (probe.ok()) {
    if (auto s = run(absl::StrCat("1-bit quantize (buckets of ",
                                  options.bucket_size, ")"),
                     0,
                     [&] {
                       return backend->OneBitEncode(*grads, *residual, p,
                                                    options.bucket_size, *bits,
                                                    *scales);
                     });
        !s.ok()) {
      return s;
    }
    std::vector<uint8_t> host_bits(bits_bytes);
    std::vector<float> host_scales(scale_count);
    if (auto s =
            run("1-bit download (bits + scales)",
                static_cast<int64_t>(bits_bytes + scale_count * sizeof(float)),
                [&] {
                  if (auto s = backend->CopyToHost(*bits, host_bits.data(),
                                                   bits_bytes);
                      !s.ok()) {
                    return s;
                  }
                  return backend->CopyToHost(*scales, host_scales.data(),
                                             scale_count * sizeof(float));
                });
        !s.ok()) {
      return s;
    }
  } else if (probe.code() != absl::StatusCode::kUnimplemented) {
    return probe;
  }

  // As Mlp::ApplyGradients with momentum; a tiny rate keeps the weights
  // where they are over many iterations.
  if (auto s = run("momentum update", 0,
                   [&] {
                     backend->Scale(p, 0.9f, *velocity);
                     backend->Axpy(p, 1.0f, *grads, *velocity);
                     backend->Axpy(p, -1e-6f, *velocity, *params);
                     return absl::OkStatus();
                   });
      !s.ok()) {
    return s;
  }

  {
    absl::StatusOr<std::unique_ptr<worker::Mlp>> mlp =
        worker::Mlp::Create(backend, layout, batch);
    if (!mlp.ok()) return mlp.status();
    if (auto s = (*mlp)->SetParams(host_params); !s.ok()) return s;
    if (auto s = run("whole step through Mlp (upload to update)", 0,
                     [&]() -> absl::Status {
                       absl::StatusOr<worker::BatchResult> result =
                           (*mlp)->ComputeGradients(images.data(),
                                                    host_labels.data(), batch);
                       if (!result.ok()) return result.status();
                       return (*mlp)->ApplyGradients(1e-6f, 0.9f);
                     });
        !s.ok()) {
      return s;
    }
  }

  // The step's matrix products alone.
  for (int l = 0; l < layers; ++l) {
    const double product = 2.0 * batch * sizes[l] * sizes[l + 1];
    report.step_gemm_flops += product * (l > 0 ? 3 : 2);
    report.step_gemms += l > 0 ? 3 : 2;
  }
  {
    absl::StatusOr<PhaseTiming> timing = Time(
        backend, "matrix products of one step", 0, options.warmup,
        options.iterations, [&] {
          for (int l = 0; l < layers; ++l) {
            backend->Gemm(false, false, batch, sizes[l + 1], sizes[l], 1.0f,
                          activations[l], *params + layout.weights(l).offset,
                          0.0f, activations[l + 1]);
          }
          for (int l = layers - 1; l >= 0; --l) {
            backend->Gemm(true, false, sizes[l], sizes[l + 1], batch, 1.0f,
                          activations[l], deltas[l + 1], 0.0f,
                          *grads + layout.weights(l).offset);
            if (l > 0) {
              backend->Gemm(false, true, batch, sizes[l], sizes[l + 1], 1.0f,
                            deltas[l + 1], *params + layout.weights(l).offset,
                            0.0f, deltas[l]);
            }
          }
          return absl::OkStatus();
        });
    if (!timing.ok()) return timing.status();
    report.step_gemm = *std::move(timing);
  }

  if (options.square > 0) {
    const int n = options.square;
    const size_t elements = static_cast<size_t>(n) * n;
    Buffers square_buffers(backend);
    absl::StatusOr<float*> a = square_buffers.Floats(elements);
    absl::StatusOr<float*> b = square_buffers.Floats(elements);
    absl::StatusOr<float*> c = square_buffers.Floats(elements);
    for (const absl::Status& s : {a.status(), b.status(), c.status()}) {
      if (!s.ok()) return s;
    }
    // Normal values (no denormals) whatever the size.
    backend->Fill(elements, 0.5f, *a);
    backend->Fill(elements, 0.25f, *b);
    absl::StatusOr<PhaseTiming> timing =
        Time(backend, absl::StrFormat("square sgemm %d^3", n), 0, 1,
             options.square_iterations, [&] {
               backend->Gemm(false, false, n, n, n, 1.0f, *a, *b, 0.0f, *c);
               return absl::OkStatus();
             });
    if (!timing.ok()) return timing.status();
    report.square_gemm = *std::move(timing);
    report.square_flops = 2.0 * n * n * static_cast<double>(n);
  }
  return report;
}

std::string FormatReport(const BenchReport& report) {
  const BenchOptions& o = report.options;
  std::string out = absl::StrFormat("backend: %s\n", report.backend);
  absl::StrAppendFormat(
      &out,
      "model %s: %d parameters (%s); batch %d; medians of %d runs after %d "
      "warm-up, each ending in Synchronize\n",
      absl::StrJoin(o.layer_sizes, "-"), report.num_params,
      Bytes(report.num_params * 4), o.batch, o.iterations, o.warmup);
  absl::StrAppendFormat(&out, "  %-42s %10s   %-22s %s\n", "phase", "median",
                        "p10 .. p90", "host link");
  for (const PhaseTiming& t : report.phases) {
    absl::StrAppendFormat(
        &out, "  %-42s %10s   %-22s %s\n", t.name, Seconds(t.median_s),
        absl::StrCat(Seconds(t.p10_s), " .. ", Seconds(t.p90_s)),
        t.bytes > 0 ? absl::StrFormat("%s, %.3g GB/s", Bytes(t.bytes),
                                      t.bytes / t.median_s / 1e9)
                    : "");
  }
  const double step_rate = report.step_gemm_flops / report.step_gemm.median_s;
  absl::StrAppendFormat(
      &out,
      "matrix products of one step: %d sgemm calls, %.4g GFLOP: median %s "
      "= %s\n",
      report.step_gemms, report.step_gemm_flops / 1e9,
      Seconds(report.step_gemm.median_s), Rate(step_rate));
  if (report.square_flops > 0) {
    const double square_rate =
        report.square_flops / report.square_gemm.median_s;
    absl::StrAppendFormat(
        &out, "%s through the same backend: %.4g GFLOP: median %s = %s\n",
        report.square_gemm.name, report.square_flops / 1e9,
        Seconds(report.square_gemm.median_s), Rate(square_rate));
    absl::StrAppendFormat(&out,
                          "roofline ratio: the step's products run at %.3g%% "
                          "of the square sgemm's rate\n",
                          100.0 * step_rate / square_rate);
  }
  return out;
}

}  // namespace monsoon::tools
