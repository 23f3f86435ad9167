// Model: a list of layers (layer.h) on a ComputeBackend, from the model of
// a common::ModelLayout (an MLP, LeNet, or the config's own layers), ending
// in softmax cross-entropy. Parameters, gradients and activations stay in
// the backend's memory, allocated once for the largest batch; host data
// crosses only in the calls that take or return host spans. The parameters
// and gradients are each one flat vector in the layout's order: what the
// shards hold and the wire carries.
// Not thread-safe: one worker thread owns it.
#ifndef MONSOON_WORKER_MODEL_MODEL_H_
#define MONSOON_WORKER_MODEL_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model_layout.h"
#include "worker/compute_backend.h"
#include "worker/model/layer.h"

namespace monsoon::worker {

struct BatchResult {
  double loss = 0;  // mean over the examples
  int64_t correct = 0;
  int64_t examples = 0;
};

class Model {
 public:
  // `backend` is not owned and must outlive the Model. INVALID_ARGUMENT
  // for a layout without layers or a max_batch whose buffers would not fit
  // the backends' int indices; RESOURCE_EXHAUSTED when memory runs out.
  static absl::StatusOr<std::unique_ptr<Model>> Create(
      ComputeBackend* backend, const common::ModelLayout& layout,
      int max_batch);
  ~Model();

  const common::ModelLayout& layout() const { return layout_; }
  ComputeBackend* backend() { return backend_; }

  absl::Status SetParams(absl::Span<const float> params);
  absl::Status GetParams(absl::Span<float> params);

  // Called by ComputeGradients each time the backward pass has made the
  // gradients of parameters [from, num_params) final (weight decay and
  // scale included), from the output layer down: after each layer with
  // parameters, `from` its weights' first index rounded up to a multiple
  // of 32 (0 at the end). The pass does not touch those gradients again,
  // nor read those parameters.
  using GradientsReady = std::function<void(uint64_t from)>;

  // Forward and backward on `batch` examples (host memory): the gradient of
  // the mean loss lands in the device gradient buffer, layer by layer
  // (`ready`, if set, hears of each).
  absl::StatusOr<BatchResult> ComputeGradients(
      const float* images, const int32_t* labels, int batch,
      const GradientsReady& ready = nullptr);
  absl::Status GetGradients(absl::Span<float> grads);
  // The device gradient buffer, for backends that process it in place.
  float* device_gradients() { return grads_; }
  float* device_params() { return params_; }

  // From the next ComputeGradients on, the gradients include
  // weight_decay * params (L2 regularization; config's weight_decay).
  void set_weight_decay(float weight_decay) { weight_decay_ = weight_decay; }
  // From the next ComputeGradients on, the gradients (weight decay
  // included) are multiplied by `scale` (the config's learning-rate
  // schedule; see LearningRateScale).
  void set_gradient_scale(float scale) { gradient_scale_ = scale; }

  // params -= learning_rate * gradients, on the device. With momentum > 0:
  // velocity = momentum * velocity + gradients; params -= lr * velocity
  // (velocity starts at 0, allocated on first use).
  absl::Status ApplyGradients(float learning_rate, float momentum = 0);

  // Loss and accuracy over n examples, forward only, max_batch at a time.
  absl::StatusOr<BatchResult> Evaluate(const float* images,
                                       const int32_t* labels, int64_t n);

 private:
  Model(ComputeBackend* backend, const common::ModelLayout& layout,
        int max_batch)
      : backend_(backend), layout_(layout), max_batch_(max_batch) {}
  absl::Status Allocate();
  // Runs the layers on the batch in activations_[0] / labels_ and adds its
  // loss and correct count to stats_; with `backward`, the logits'
  // gradient lands in deltas_.back().
  void Forward(int batch, bool backward);
  absl::StatusOr<BatchResult> ReadStats(int batch);
  // Adds weight decay to the gradients of parameters [begin, end) and
  // scales them (set_weight_decay, set_gradient_scale): one layer's, as
  // backward finishes it.
  void FinishGradients(uint64_t begin, uint64_t end);
  absl::Status Upload(const float* images, const int32_t* labels, int batch);

  ComputeBackend* const backend_;
  const common::ModelLayout layout_;
  const int max_batch_;
  float weight_decay_ = 0;
  float gradient_scale_ = 1;
  std::vector<std::unique_ptr<Layer>> layers_;
  float* params_ = nullptr;
  float* grads_ = nullptr;
  float* velocity_ = nullptr;
  float* stats_ = nullptr;
  int32_t* labels_ = nullptr;
  // activations_[0] is the input, [i + 1] layer i's output; deltas_[i] is
  // dLoss/d activations_[i] (null for the input unless the first layer
  // works in place). An in-place layer's output and delta are its input's
  // buffers.
  std::vector<float*> activations_;
  std::vector<float*> deltas_;
  std::vector<float*> owned_;  // the distinct buffers above, freed at the end
};

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_MODEL_MODEL_H_
