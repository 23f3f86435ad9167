// Dense: out = in * W + b over the flattened input, W stored fan-in x units.
// The gradients are those of the MLP this project started with, in the
// same order of operations, so that an MLP trains bit for bit as before.
#include "worker/model/layer.h"

namespace monsoon::worker {
namespace {

class DenseLayer : public Layer {
 public:
  DenseLayer(ComputeBackend* backend, const common::TensorSpec& weights,
             const common::TensorSpec& bias)
      : backend_(backend),
        fan_in_(static_cast<int>(weights.fan_in)),
        units_(static_cast<int>(weights.cols)),
        weights_(weights.offset),
        bias_(bias.offset) {}

  void Forward(int batch, const float* params, const float* in,
               float* out) override {
    backend_->Gemm(false, false, batch, units_, fan_in_, 1.0f, in,
                   params + weights_, 0.0f, out);
    backend_->AddBias(batch, units_, params + bias_, out);
  }

  void Backward(int batch, const float* params, const float* in,
                const float* /*out*/, float* dout, float* din,
                float* grads) override {
    // dW = in^T * dout; db = column sums of dout; din = dout * W^T.
    backend_->Gemm(true, false, fan_in_, units_, batch, 1.0f, in, dout, 0.0f,
                   grads + weights_);
    backend_->ColumnSums(batch, units_, dout, grads + bias_);
    if (din != nullptr) {
      backend_->Gemm(false, true, batch, fan_in_, units_, 1.0f, dout,
                     params + weights_, 0.0f, din);
    }
  }

 private:
  ComputeBackend* const backend_;
  const int fan_in_;
  const int units_;
  const uint64_t weights_;
  const uint64_t bias_;
};

}  // namespace

std::unique_ptr<Layer> MakeDenseLayer(ComputeBackend* backend,
                                      const common::ModelLayout& layout,
                                      const common::LayerSpec& spec) {
  return std::make_unique<DenseLayer>(backend, layout.tensors()[spec.weights],
                                      layout.tensors()[spec.bias]);
}

}  // namespace monsoon::worker
