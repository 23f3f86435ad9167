#include "worker/mlp.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace monsoon::worker {

absl::StatusOr<std::unique_ptr<Mlp>> Mlp::Create(
    ComputeBackend* backend, const common::ModelLayout& layout, int max_batch) {
  if (max_batch < 1) {
    return absl::InvalidArgumentError("the batch size must be at least 1");
  }
  std::unique_ptr<Mlp> mlp(new Mlp(backend, layout, max_batch));
  absl::Status status = mlp->Allocate();
  if (!status.ok()) return status;
  return mlp;
}

Mlp::~Mlp() {
  for (void* p : {static_cast<void*>(params_), static_cast<void*>(grads_),
                  static_cast<void*>(velocity_), static_cast<void*>(stats_),
                  static_cast<void*>(labels_)}) {
    if (p != nullptr) backend_->Free(p);
  }
  for (float* p : activations_) {
    if (p != nullptr) backend_->Free(p);
  }
  for (float* p : deltas_) {
    if (p != nullptr) backend_->Free(p);
  }
}

absl::Status Mlp::Allocate() {
  auto floats = [&](size_t n, float** out) -> absl::Status {
    absl::StatusOr<float*> p = backend_->AllocateFloats(n);
    if (!p.ok()) return p.status();
    *out = *p;
    return absl::OkStatus();
  };
  const size_t p = layout_.num_params();
  if (auto s = floats(p, &params_); !s.ok()) return s;
  if (auto s = floats(p, &grads_); !s.ok()) return s;
  if (auto s = floats(2, &stats_); !s.ok()) return s;
  absl::StatusOr<int32_t*> labels = backend_->AllocateInts(max_batch_);
  if (!labels.ok()) return labels.status();
  labels_ = *labels;
  const std::vector<int>& sizes = layout_.layer_sizes();
  activations_.assign(sizes.size(), nullptr);
  deltas_.assign(sizes.size(), nullptr);
  for (size_t l = 0; l < sizes.size(); ++l) {
    const size_t n = static_cast<size_t>(max_batch_) * sizes[l];
    if (auto s = floats(n, &activations_[l]); !s.ok()) return s;
    if (l > 0) {
      if (auto s = floats(n, &deltas_[l]); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Mlp::SetParams(absl::Span<const float> params) {
  if (params.size() != layout_.num_params()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected ", layout_.num_params(), " parameters, got ", params.size()));
  }
  return backend_->CopyToDevice(params.data(), params_,
                                params.size() * sizeof(float));
}

absl::Status Mlp::GetParams(absl::Span<float> params) {
  if (params.size() != layout_.num_params()) {
    return absl::InvalidArgumentError("parameter buffer of the wrong size");
  }
  return backend_->CopyToHost(params_, params.data(),
                              params.size() * sizeof(float));
}

absl::Status Mlp::GetGradients(absl::Span<float> grads) {
  if (grads.size() != layout_.num_params()) {
    return absl::InvalidArgumentError("gradient buffer of the wrong size");
  }
  return backend_->CopyToHost(grads_, grads.data(),
                              grads.size() * sizeof(float));
}

absl::Status Mlp::Upload(const float* images, const int32_t* labels,
                         int batch) {
  if (batch < 1 || batch > max_batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", batch, " outside [1, ", max_batch_, "]"));
  }
  const size_t in = layout_.layer_sizes()[0];
  if (auto s = backend_->CopyToDevice(images, activations_[0],
                                      batch * in * sizeof(float));
      !s.ok()) {
    return s;
  }
  return backend_->CopyToDevice(labels, labels_, batch * sizeof(int32_t));
}

void Mlp::Forward(int batch, bool backward) {
  const int layers = layout_.num_layers();
  const std::vector<int>& sizes = layout_.layer_sizes();
  for (int l = 0; l < layers; ++l) {
    const float* w = params_ + layout_.weights(l).offset;
    const float* b = params_ + layout_.bias(l).offset;
    float* out = activations_[l + 1];
    backend_->Gemm(false, false, batch, sizes[l + 1], sizes[l], 1.0f,
                   activations_[l], w, 0.0f, out);
    backend_->AddBias(batch, sizes[l + 1], b, out);
    if (l + 1 < layers) {
      backend_->Relu(static_cast<size_t>(batch) * sizes[l + 1], out);
    }
  }
  backend_->SoftmaxCrossEntropy(batch, sizes[layers], activations_[layers],
                                labels_, backward ? deltas_[layers] : nullptr,
                                stats_);
}

absl::StatusOr<BatchResult> Mlp::ReadStats(int examples) {
  float stats[2];
  if (auto s = backend_->CopyToHost(stats_, stats, sizeof(stats)); !s.ok()) {
    return s;
  }
  if (auto s = backend_->Synchronize(); !s.ok()) return s;
  BatchResult result;
  result.examples = examples;
  result.loss = examples > 0 ? stats[0] / examples : 0;
  result.correct = static_cast<int64_t>(stats[1] + 0.5f);
  return result;
}

absl::StatusOr<BatchResult> Mlp::ComputeGradients(const float* images,
                                                  const int32_t* labels,
                                                  int batch) {
  if (auto s = Upload(images, labels, batch); !s.ok()) return s;
  backend_->Fill(2, 0.0f, stats_);
  Forward(batch, /*backward=*/true);
  const std::vector<int>& sizes = layout_.layer_sizes();
  for (int l = layout_.num_layers() - 1; l >= 0; --l) {
    float* dw = grads_ + layout_.weights(l).offset;
    float* db = grads_ + layout_.bias(l).offset;
    // dW = A_l^T * D_{l+1}; db = column sums of D_{l+1}.
    backend_->Gemm(true, false, sizes[l], sizes[l + 1], batch, 1.0f,
                   activations_[l], deltas_[l + 1], 0.0f, dw);
    backend_->ColumnSums(batch, sizes[l + 1], deltas_[l + 1], db);
    if (l > 0) {
      // D_l = (D_{l+1} * W_l^T) masked by the ReLU.
      const float* w = params_ + layout_.weights(l).offset;
      backend_->Gemm(false, true, batch, sizes[l], sizes[l + 1], 1.0f,
                     deltas_[l + 1], w, 0.0f, deltas_[l]);
      backend_->ReluBackward(static_cast<size_t>(batch) * sizes[l],
                             activations_[l], deltas_[l]);
    }
  }
  return ReadStats(batch);
}

absl::Status Mlp::ApplyGradients(float learning_rate, float momentum) {
  const size_t p = layout_.num_params();
  if (momentum <= 0) {
    backend_->Axpy(p, -learning_rate, grads_, params_);
    return absl::OkStatus();
  }
  if (velocity_ == nullptr) {
    absl::StatusOr<float*> velocity = backend_->AllocateFloats(p);
    if (!velocity.ok()) return velocity.status();
    velocity_ = *velocity;
    backend_->Fill(p, 0.0f, velocity_);
  }
  backend_->Scale(p, momentum, velocity_);
  backend_->Axpy(p, 1.0f, grads_, velocity_);
  backend_->Axpy(p, -learning_rate, velocity_, params_);
  return absl::OkStatus();
}

absl::StatusOr<BatchResult> Mlp::Evaluate(const float* images,
                                          const int32_t* labels, int64_t n) {
  const size_t in = layout_.layer_sizes()[0];
  backend_->Fill(2, 0.0f, stats_);
  for (int64_t start = 0; start < n; start += max_batch_) {
    const int batch =
        static_cast<int>(std::min<int64_t>(max_batch_, n - start));
    if (auto s = Upload(images + start * in, labels + start, batch); !s.ok()) {
      return s;
    }
    Forward(batch, /*backward=*/false);
  }
  return ReadStats(static_cast<int>(n));
}

}  // namespace monsoon::worker
