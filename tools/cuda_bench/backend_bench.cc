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
#include "worker/model/layer.h"
#include "worker/model/model.h"

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
  if (o.layout.layers().empty()) {
    return absl::InvalidArgumentError("the model has no layers");
  }
  if (o.batch < 1 || o.iterations < 1 || o.warmup < 0 || o.bucket_size < 1 ||
      o.square < 0 || o.square_iterations < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "batch %d, iterations %d, square iterations %d and bucket size %d "
        "must be at least 1; warm-up %d and square %d at least 0",
        o.batch, o.iterations, o.square_iterations, o.bucket_size, o.warmup,
        o.square));
  }
  if (o.layout.LargestBufferPerExample() * o.batch >= (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError("the batch is too large for the model");
  }
  return absl::OkStatus();
}

// One layer's matrix products, as its Forward and Backward issue them
// (worker/model/dense_layer.cc, conv_layer.cc).
struct LayerGemms {
  int m_rows = 0;            // batch rows (times output positions for a conv)
  int fan_in = 0;            // K: inputs per row (a conv's patch)
  int units = 0;             // N: outputs per row
  bool units_major = false;  // W is units x fan_in (a conv's)
  const float* input = nullptr;  // the rows x fan_in matrix (patches)
  const float* weights = nullptr;
  float* output = nullptr;
  float* dout = nullptr;
  float* dweights = nullptr;
  float* dinput = nullptr;  // null for the first layer
  int calls() const { return dinput != nullptr ? 3 : 2; }
  double flops() const { return 2.0 * m_rows * fan_in * units * calls(); }
  void Queue(ComputeBackend* backend) const {
    if (units_major) {
      backend->Gemm(false, true, m_rows, units, fan_in, 1.0f, input, weights,
                    0.0f, output);
      backend->Gemm(true, false, units, fan_in, m_rows, 1.0f, dout, input, 0.0f,
                    dweights);
      if (dinput != nullptr) {
        backend->Gemm(false, false, m_rows, fan_in, units, 1.0f, dout, weights,
                      0.0f, dinput);
      }
      return;
    }
    backend->Gemm(false, false, m_rows, units, fan_in, 1.0f, input, weights,
                  0.0f, output);
    backend->Gemm(true, false, fan_in, units, m_rows, 1.0f, input, dout, 0.0f,
                  dweights);
    if (dinput != nullptr) {
      backend->Gemm(false, true, m_rows, fan_in, units, 1.0f, dout, weights,
                    0.0f, dinput);
    }
  }
};

}  // namespace

absl::StatusOr<BenchReport> RunBackendBench(ComputeBackend* backend,
                                            const BenchOptions& options) {
  if (auto s = Validate(options); !s.ok()) return s;
  if (options.gemm_reference != nullptr &&
      !(backend->HostMemory() && options.gemm_reference->HostMemory())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the products' reference backend (", options.gemm_reference->Name(),
        ") runs on the measured backend's buffers, so both need host memory (",
        backend->Name(), ")"));
  }
  BenchReport report;
  report.backend = backend->Name();
  report.options = options;
  const common::ModelLayout& layout = options.layout;
  const std::vector<common::LayerSpec>& specs = layout.layers();
  const int batch = options.batch;
  const size_t p = layout.num_params();
  const int classes = layout.num_classes();
  report.num_params = static_cast<int64_t>(p);

  Buffers buffers(backend);
  // Parameters, gradients, optimizer and 1-bit state, activations and
  // deltas, as Model allocates them.
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
  std::vector<std::unique_ptr<worker::Layer>> layers;
  std::vector<float*> activations(specs.size() + 1, nullptr);
  std::vector<float*> deltas(specs.size() + 1, nullptr);
  {
    absl::StatusOr<float*> input =
        buffers.Floats(static_cast<size_t>(batch) * layout.input().size());
    if (!input.ok()) return input.status();
    activations[0] = *input;
    absl::StatusOr<float*> input_delta =
        buffers.Floats(static_cast<size_t>(batch) * layout.input().size());
    if (!input_delta.ok()) return input_delta.status();
    deltas[0] = *input_delta;
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    absl::StatusOr<std::unique_ptr<worker::Layer>> layer =
        worker::MakeLayer(backend, layout, specs[i], batch,
                          /*input_gradient=*/i > 0);
    if (!layer.ok()) return layer.status();
    layers.push_back(*std::move(layer));
    if (layers.back()->InPlace()) {
      activations[i + 1] = activations[i];
      deltas[i + 1] = deltas[i];
      continue;
    }
    const size_t n = static_cast<size_t>(batch) * specs[i].out.size();
    absl::StatusOr<float*> a = buffers.Floats(n);
    if (!a.ok()) return a.status();
    activations[i + 1] = *a;
    absl::StatusOr<float*> d = buffers.Floats(n);
    if (!d.ok()) return d.status();
    deltas[i + 1] = *d;
  }

  std::vector<float> host_params(p);
  common::InitialValues(layout, /*seed=*/1, 0, absl::MakeSpan(host_params));
  const std::vector<float> images = common::UniformValues(
      static_cast<size_t>(batch) * layout.input().size(), 2);
  std::vector<int32_t> host_labels(batch);
  for (int i = 0; i < batch; ++i) {
    host_labels[i] = static_cast<int32_t>(common::SplitMix64(i) % classes);
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

  const int64_t upload_bytes =
      static_cast<int64_t>(batch) *
      (layout.input().size() * sizeof(float) + sizeof(int32_t));
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

  // As Model::ComputeGradients, a layer at a time, after one whole pass so
  // that every buffer holds what the step would leave there. Repeats are
  // harmless: ReLU in place is idempotent, and the values a repeat leaves
  // are as finite as the first pass's.
  auto layer_name = [&](size_t i) {
    return absl::StrCat("layer ", i + 1, ": ", common::LayerString(specs[i]));
  };
  for (size_t i = 0; i < layers.size(); ++i) {
    layers[i]->Forward(batch, *params, activations[i], activations[i + 1]);
  }
  backend->Fill(2, 0.0f, *stats);
  backend->SoftmaxCrossEntropy(batch, classes, activations.back(), *labels,
                               deltas.back(), *stats);
  if (auto s = backend->Synchronize(); !s.ok()) return s;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (auto s = run(absl::StrCat("forward ", layer_name(i)), 0,
                     [&] {
                       layers[i]->Forward(batch, *params, activations[i],
                                          activations[i + 1]);
                       return absl::OkStatus();
                     });
        !s.ok()) {
      return s;
    }
  }
  if (auto s = run("softmax cross-entropy (loss and its gradient)", 0,
                   [&] {
                     backend->Fill(2, 0.0f, *stats);
                     backend->SoftmaxCrossEntropy(batch, classes,
                                                  activations.back(), *labels,
                                                  deltas.back(), *stats);
                     return absl::OkStatus();
                   });
      !s.ok()) {
    return s;
  }
  for (size_t i = layers.size(); i-- > 0;) {
    float* din = i == 0 && !layers[0]->InPlace() ? nullptr : deltas[i];
    if (auto s = run(absl::StrCat("backward ", layer_name(i)), 0,
                     [&] {
                       layers[i]->Backward(batch, *params, activations[i],
                                           activations[i + 1], deltas[i + 1],
                                           din, *grads);
                       return absl::OkStatus();
                     });
        !s.ok()) {
      return s;
    }
  }

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

  // As Model::ApplyGradients with momentum; a tiny rate keeps the weights
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

  // The step's device work (forward, loss, backward, momentum update: no
  // host copies) issued op by op, then recorded once and replayed as one
  // launch (a CUDA graph) where the backend can record: at small batches a
  // step's time is mostly launches, which the graph saves.
  auto device_step = [&] {
    for (size_t i = 0; i < layers.size(); ++i) {
      layers[i]->Forward(batch, *params, activations[i], activations[i + 1]);
    }
    backend->Fill(2, 0.0f, *stats);
    backend->SoftmaxCrossEntropy(batch, classes, activations.back(), *labels,
                                 deltas.back(), *stats);
    for (size_t i = layers.size(); i-- > 0;) {
      float* din = i == 0 && !layers[0]->InPlace() ? nullptr : deltas[i];
      layers[i]->Backward(batch, *params, activations[i], activations[i + 1],
                          deltas[i + 1], din, *grads);
    }
    backend->Scale(p, 0.9f, *velocity);
    backend->Axpy(p, 1.0f, *grads, *velocity);
    backend->Axpy(p, -1e-6f, *velocity, *params);
  };
  if (auto s = run("device step, op by op (forward to update)", 0,
                   [&] {
                     device_step();
                     return absl::OkStatus();
                   });
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<worker::CapturedWork>> graph =
      backend->CaptureWork(device_step);
  if (graph.ok()) {
    if (auto s = run("device step, one CUDA graph launch", 0,
                     [&] { return (*graph)->Replay(); });
        !s.ok()) {
      return s;
    }
  } else if (graph.status().code() != absl::StatusCode::kUnimplemented) {
    report.notes.push_back(
        absl::StrCat("recording the step failed: ", graph.status().ToString()));
  }

  {
    absl::StatusOr<std::unique_ptr<worker::Model>> model =
        worker::Model::Create(backend, layout, batch);
    if (!model.ok()) return model.status();
    if (auto s = (*model)->SetParams(host_params); !s.ok()) return s;
    if (auto s = run("whole step through Model (upload to update)", 0,
                     [&]() -> absl::Status {
                       absl::StatusOr<worker::BatchResult> result =
                           (*model)->ComputeGradients(
                               images.data(), host_labels.data(), batch);
                       if (!result.ok()) return result.status();
                       return (*model)->ApplyGradients(1e-6f, 0.9f);
                     });
        !s.ok()) {
      return s;
    }
  }

  // The matrix products alone: each layer's, the conv layers' together and
  // the step's. A conv layer's products run on its patches' buffer, which
  // this bench fills by one Im2Col; values do not change the time.
  std::vector<LayerGemms> all;
  std::vector<LayerGemms> convs;
  Buffers gemm_buffers(backend);
  for (size_t i = 0; i < specs.size(); ++i) {
    const common::LayerSpec& spec = specs[i];
    if (spec.weights < 0) continue;
    const common::TensorSpec& w = layout.tensors()[spec.weights];
    LayerGemms g;
    g.m_rows = batch * spec.out.height * spec.out.width;
    g.fan_in = static_cast<int>(w.fan_in);
    g.units = static_cast<int>(w.size() / w.fan_in);
    g.units_major = spec.kind == common::LayerSpec::Kind::kConv;
    g.weights = *params + w.offset;
    g.output = activations[i + 1];
    g.dout = deltas[i + 1];
    g.dweights = *grads + w.offset;
    if (spec.kind == common::LayerSpec::Kind::kConv) {
      absl::StatusOr<float*> patches =
          gemm_buffers.Floats(static_cast<size_t>(g.m_rows) * g.fan_in);
      absl::StatusOr<float*> dpatches =
          gemm_buffers.Floats(static_cast<size_t>(g.m_rows) * g.fan_in);
      if (!patches.ok()) return patches.status();
      if (!dpatches.ok()) return dpatches.status();
      backend->Im2Col(worker::WindowOf(spec), batch, activations[i], *patches);
      g.input = *patches;
      g.dinput = i == 0 ? nullptr : *dpatches;
    } else {
      g.input = activations[i];
      g.dinput = i == 0 ? nullptr : deltas[i];
    }
    all.push_back(g);
    if (spec.kind == common::LayerSpec::Kind::kConv) convs.push_back(g);
  }
  // Each layer's products, the conv layers' together and the step's, on
  // the backend and then on the reference (if any), group by group.
  auto group = [&](const std::string& name,
                   const std::vector<LayerGemms>& members) -> absl::Status {
    GemmTiming total;
    total.name = name;
    for (const LayerGemms& g : members) {
      total.calls += g.calls();
      total.flops += g.flops();
    }
    for (ComputeBackend* on : {backend, options.gemm_reference}) {
      if (on == nullptr) continue;
      absl::StatusOr<PhaseTiming> timing =
          Time(on, name, 0, options.warmup, options.iterations, [&] {
            for (const LayerGemms& g : members) g.Queue(on);
            return absl::OkStatus();
          });
      if (!timing.ok()) return timing.status();
      (on == backend ? total.timing : total.reference) = *std::move(timing);
    }
    report.gemms.push_back(std::move(total));
    return absl::OkStatus();
  };
  for (size_t g = 0, i = 0; i < specs.size(); ++i) {
    if (specs[i].weights < 0) continue;
    if (auto s = group(layer_name(i), {all[g++]}); !s.ok()) return s;
  }
  if (!convs.empty()) {
    if (auto s = group("all conv layers", convs); !s.ok()) return s;
  }
  if (auto s = group("the whole step", all); !s.ok()) return s;

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
      "model %s on %s examples: %s; %d parameters (%s), %.3g MFLOP forward "
      "per example; batch %d; medians of %d runs after %d warm-up, each "
      "ending in Synchronize\n",
      o.model_name, common::ShapeString(o.layout.input()), o.layout.Describe(),
      report.num_params, Bytes(report.num_params * 4),
      o.layout.ForwardFlops() / 1e6, o.batch, o.iterations, o.warmup);
  absl::StrAppendFormat(&out, "  %-52s %10s   %-22s %s\n", "phase", "median",
                        "p10 .. p90", "host link");
  for (const PhaseTiming& t : report.phases) {
    absl::StrAppendFormat(
        &out, "  %-52s %10s   %-22s %s\n", t.name, Seconds(t.median_s),
        absl::StrCat(Seconds(t.p10_s), " .. ", Seconds(t.p90_s)),
        t.bytes > 0 ? absl::StrFormat("%s, %.3g GB/s", Bytes(t.bytes),
                                      t.bytes / t.median_s / 1e9)
                    : "");
  }
  for (const std::string& note : report.notes) {
    absl::StrAppend(&out, "  note: ", note, "\n");
  }
  const double square_rate =
      report.square_flops > 0
          ? report.square_flops / report.square_gemm.median_s
          : 0;
  absl::StrAppendFormat(&out,
                        "matrix products (forward, weight gradient, "
                        "input gradient):\n");
  const bool reference = o.gemm_reference != nullptr;
  // "0.61x" of the square sgemm's rate, where it was measured.
  auto of_square = [&](double rate) {
    return square_rate > 0 ? absl::StrFormat("%.2fx", rate / square_rate)
                           : std::string();
  };
  absl::StrAppendFormat(&out, "  %-52s %6s %10s %10s %16s %9s%s\n", "of",
                        "sgemms", "MFLOP", "median", "rate",
                        square_rate > 0 ? "of square" : "",
                        reference ? absl::StrCat("   ", o.gemm_reference_name,
                                                 ": median, rate, of square")
                                  : "");
  for (const GemmTiming& g : report.gemms) {
    const double rate = g.flops / g.timing.median_s;
    std::string line = absl::StrFormat(
        "  %-52s %6d %10.4g %10s %16s %9s", g.name, g.calls, g.flops / 1e6,
        Seconds(g.timing.median_s), Rate(rate), of_square(rate));
    if (reference) {
      const double reference_rate = g.flops / g.reference.median_s;
      absl::StrAppendFormat(&line, "   %10s %16s %9s",
                            Seconds(g.reference.median_s), Rate(reference_rate),
                            of_square(reference_rate));
    }
    absl::StrAppend(&out, line, "\n");
  }
  if (square_rate > 0) {
    absl::StrAppendFormat(
        &out, "%s through the same backend: %.4g GFLOP: median %s = %s\n",
        report.square_gemm.name, report.square_flops / 1e9,
        Seconds(report.square_gemm.median_s), Rate(square_rate));
    const GemmTiming& step = report.gemms.back();
    absl::StrAppendFormat(
        &out,
        "roofline ratio: the step's products run at %.3g%% "
        "of the square sgemm's rate\n",
        100.0 * step.flops / step.timing.median_s / square_rate);
  }
  return out;
}

}  // namespace monsoon::tools
