// ReLU, in place: out = max(in, 0); the gradient passes where out > 0.
#include "worker/model/layer.h"

namespace monsoon::worker {
namespace {

class ReluLayer : public Layer {
 public:
  ReluLayer(ComputeBackend* backend, uint64_t values)
      : backend_(backend), values_(values) {}

  bool InPlace() const override { return true; }

  void Forward(int batch, const float* /*params*/, const float* /*in*/,
               float* out) override {
    backend_->Relu(batch * values_, out);
  }

  void Backward(int batch, const float* /*params*/, const float* /*in*/,
                const float* out, float* dout, float* /*din*/,
                float* /*grads*/) override {
    backend_->ReluBackward(batch * values_, out, dout);
  }

 private:
  ComputeBackend* const backend_;
  const uint64_t values_;  // per example
};

}  // namespace

std::unique_ptr<Layer> MakeReluLayer(ComputeBackend* backend,
                                     const common::LayerSpec& spec) {
  return std::make_unique<ReluLayer>(backend, spec.out.size());
}

}  // namespace monsoon::worker
