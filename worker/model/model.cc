#include "worker/model/model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace monsoon::worker {

absl::StatusOr<std::unique_ptr<Model>> Model::Create(
    ComputeBackend* backend, const common::ModelLayout& layout, int max_batch) {
  if (max_batch < 1) {
    return absl::InvalidArgumentError("the batch size must be at least 1");
  }
  if (layout.layers().empty()) {
    return absl::InvalidArgumentError("the model has no layers");
  }
  if (layout.LargestBufferPerExample() * max_batch >= (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batches of ", max_batch, " are too large for this model (",
        layout.LargestBufferPerExample(),
        " values per example in its largest buffer): use smaller batches"));
  }
  std::unique_ptr<Model> model(new Model(backend, layout, max_batch));
  absl::Status status = model->Allocate();
  if (!status.ok()) return status;
  return model;
}

Model::~Model() {
  layers_.clear();  // frees their scratch buffers
  for (void* p : {static_cast<void*>(params_), static_cast<void*>(grads_),
                  static_cast<void*>(velocity_), static_cast<void*>(stats_),
                  static_cast<void*>(labels_)}) {
    if (p != nullptr) backend_->Free(p);
  }
  for (float* p : owned_) backend_->Free(p);
}

absl::Status Model::Allocate() {
  auto floats = [&](size_t n) -> absl::StatusOr<float*> {
    absl::StatusOr<float*> p = backend_->AllocateFloats(n);
    if (p.ok()) owned_.push_back(*p);
    return p;
  };
  const size_t p = layout_.num_params();
  absl::StatusOr<float*> params = backend_->AllocateFloats(p);
  if (!params.ok()) return params.status();
  params_ = *params;
  absl::StatusOr<float*> grads = backend_->AllocateFloats(p);
  if (!grads.ok()) return grads.status();
  grads_ = *grads;
  absl::StatusOr<float*> stats = backend_->AllocateFloats(2);
  if (!stats.ok()) return stats.status();
  stats_ = *stats;
  absl::StatusOr<int32_t*> labels = backend_->AllocateInts(max_batch_);
  if (!labels.ok()) return labels.status();
  labels_ = *labels;

  const std::vector<common::LayerSpec>& specs = layout_.layers();
  const size_t batch = static_cast<size_t>(max_batch_);
  absl::StatusOr<float*> input = floats(batch * layout_.input().size());
  if (!input.ok()) return input.status();
  activations_.assign(specs.size() + 1, nullptr);
  deltas_.assign(specs.size() + 1, nullptr);
  activations_[0] = *input;
  for (size_t i = 0; i < specs.size(); ++i) {
    absl::StatusOr<std::unique_ptr<Layer>> layer =
        MakeLayer(backend_, layout_, specs[i], max_batch_,
                  /*input_gradient=*/i > 0);
    if (!layer.ok()) return layer.status();
    layers_.push_back(*std::move(layer));
    if (layers_.back()->InPlace()) {
      if (i == 0) {
        absl::StatusOr<float*> delta = floats(batch * specs[0].in.size());
        if (!delta.ok()) return delta.status();
        deltas_[0] = *delta;
      }
      activations_[i + 1] = activations_[i];
      deltas_[i + 1] = deltas_[i];
      continue;
    }
    const size_t n = batch * specs[i].out.size();
    absl::StatusOr<float*> out = floats(n);
    if (!out.ok()) return out.status();
    activations_[i + 1] = *out;
    absl::StatusOr<float*> delta = floats(n);
    if (!delta.ok()) return delta.status();
    deltas_[i + 1] = *delta;
  }
  return absl::OkStatus();
}

absl::Status Model::SetParams(absl::Span<const float> params) {
  if (params.size() != layout_.num_params()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected ", layout_.num_params(), " parameters, got ", params.size()));
  }
  return backend_->CopyToDevice(params.data(), params_,
                                params.size() * sizeof(float));
}

absl::Status Model::GetParams(absl::Span<float> params) {
  if (params.size() != layout_.num_params()) {
    return absl::InvalidArgumentError("parameter buffer of the wrong size");
  }
  return backend_->CopyToHost(params_, params.data(),
                              params.size() * sizeof(float));
}

absl::Status Model::GetGradients(absl::Span<float> grads) {
  if (grads.size() != layout_.num_params()) {
    return absl::InvalidArgumentError("gradient buffer of the wrong size");
  }
  return backend_->CopyToHost(grads_, grads.data(),
                              grads.size() * sizeof(float));
}

absl::Status Model::Upload(const float* images, const int32_t* labels,
                           int batch) {
  if (batch < 1 || batch > max_batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", batch, " outside [1, ", max_batch_, "]"));
  }
  const size_t in = layout_.input().size();
  if (auto s = backend_->CopyToDevice(images, activations_[0],
                                      batch * in * sizeof(float));
      !s.ok()) {
    return s;
  }
  return backend_->CopyToDevice(labels, labels_, batch * sizeof(int32_t));
}

void Model::Forward(int batch, bool backward) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->Forward(batch, params_, activations_[i], activations_[i + 1]);
  }
  backend_->SoftmaxCrossEntropy(batch, layout_.num_classes(),
                                activations_.back(), labels_,
                                backward ? deltas_.back() : nullptr, stats_);
}

absl::StatusOr<BatchResult> Model::ReadStats(int examples) {
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

absl::StatusOr<BatchResult> Model::ComputeGradients(
    const float* images, const int32_t* labels, int batch,
    const GradientsReady& ready) {
  if (auto s = Upload(images, labels, batch); !s.ok()) return s;
  backend_->Fill(2, 0.0f, stats_);
  Forward(batch, /*backward=*/true);
  // Parameters lie in the layers' order (each layer's weights, then its
  // bias), so backward makes them final from the end of the vector down.
  // Weight decay and the scale go over whole blocks of kBlock values from
  // the vector's start, so that every value is computed as one call over
  // the whole vector would (OpenBLAS's saxpy takes blocks of 32 with fused
  // multiply-adds and the rest one at a time): the same bits however the
  // pass is split. A layer's first values that share a block with the
  // layer below are finished with that layer.
  constexpr uint64_t kBlock = 32;
  uint64_t final_from = layout_.num_params();
  for (size_t i = layers_.size(); i-- > 0;) {
    // The input's gradient is needed by the layers below, not by the data.
    float* din = i == 0 && !layers_[0]->InPlace() ? nullptr : deltas_[i];
    layers_[i]->Backward(batch, params_, activations_[i], activations_[i + 1],
                         deltas_[i + 1], din, grads_);
    const int weights = layout_.layers()[i].weights;
    if (weights < 0) continue;
    const uint64_t offset = layout_.tensors()[weights].offset;
    const uint64_t from = (offset + kBlock - 1) / kBlock * kBlock;
    if (from >= final_from) continue;  // all within the block below
    FinishGradients(from, final_from);
    final_from = from;
    if (ready) ready(from);
  }
  return ReadStats(batch);
}

void Model::FinishGradients(uint64_t begin, uint64_t end) {
  if (weight_decay_ > 0) {
    backend_->Axpy(end - begin, weight_decay_, params_ + begin, grads_ + begin);
  }
  if (gradient_scale_ != 1) {
    backend_->Scale(end - begin, gradient_scale_, grads_ + begin);
  }
}

absl::Status Model::ApplyGradients(float learning_rate, float momentum) {
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

absl::StatusOr<BatchResult> Model::Evaluate(const float* images,
                                            const int32_t* labels, int64_t n) {
  const size_t in = layout_.input().size();
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
