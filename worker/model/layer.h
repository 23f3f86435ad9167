// Layer: one layer of a Model (model.h) on a ComputeBackend, one file per
// kind (dense_layer.cc, conv_layer.cc, max_pool_layer.cc, relu_layer.cc),
// made by MakeLayer from the layer's spec in common::ModelLayout.
//
// A layer reads its parameters from the model's flat parameter vector and
// writes its gradients into the flat gradient vector, at its tensors'
// offsets, so that the layers share the one buffer that is pushed and
// pulled. Activations are batches of examples stored channels last
// (common::Shape). A layer owns the scratch buffers it needs (a conv
// layer's patches, a pooling layer's arg-max), allocated once for the
// largest batch and freed by its destructor. Not thread-safe: the model's
// one thread uses it.
#ifndef MONSOON_WORKER_MODEL_LAYER_H_
#define MONSOON_WORKER_MODEL_LAYER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/model_layout.h"
#include "worker/compute_backend.h"

namespace monsoon::worker {

class Layer {
 public:
  virtual ~Layer() = default;

  // Whether the output overwrites the input (and the input's gradient the
  // output's): the model then gives both the same buffer.
  virtual bool InPlace() const { return false; }

  // out = the layer applied to `in`, for `batch` examples.
  virtual void Forward(int batch, const float* params, const float* in,
                       float* out) = 0;

  // From dout (dLoss/dout, which the layer may overwrite) and the
  // Forward's `in` and `out` of the same batch: adds nothing but writes the
  // gradient of its parameters into `grads` at their offsets, and
  // dLoss/din into din unless din is null (the first layer's input needs
  // none). An in-place layer works on dout in place and ignores din.
  virtual void Backward(int batch, const float* params, const float* in,
                        const float* out, float* dout, float* din,
                        float* grads) = 0;
};

// The window of a conv or max pooling layer (max pooling pads nothing).
WindowGeometry WindowOf(const common::LayerSpec& spec);

// The layer of `spec` (one of layout.layers()), with scratch buffers for
// `max_batch` examples. `input_gradient`: whether Backward will be asked for
// dLoss/din (false for a model's first layer, unless it works in place).
// RESOURCE_EXHAUSTED when the backend cannot hold them.
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(
    ComputeBackend* backend, const common::ModelLayout& layout,
    const common::LayerSpec& spec, int max_batch, bool input_gradient);

// One per kind, for MakeLayer.
std::unique_ptr<Layer> MakeDenseLayer(ComputeBackend* backend,
                                      const common::ModelLayout& layout,
                                      const common::LayerSpec& spec);
absl::StatusOr<std::unique_ptr<Layer>> MakeConvLayer(
    ComputeBackend* backend, const common::ModelLayout& layout,
    const common::LayerSpec& spec, int max_batch, bool input_gradient);
absl::StatusOr<std::unique_ptr<Layer>> MakeMaxPoolLayer(
    ComputeBackend* backend, const common::LayerSpec& spec, int max_batch);
std::unique_ptr<Layer> MakeReluLayer(ComputeBackend* backend,
                                     const common::LayerSpec& spec);

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_MODEL_LAYER_H_
