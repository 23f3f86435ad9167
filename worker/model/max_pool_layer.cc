// Max pooling: each window's largest value per channel, and the gradient
// routed back to where it came from (the arg-max kept by Forward).
#include "worker/model/layer.h"

namespace monsoon::worker {
namespace {

class MaxPoolLayer : public Layer {
 public:
  MaxPoolLayer(ComputeBackend* backend, const common::LayerSpec& spec,
               int32_t* argmax)
      : backend_(backend), argmax_(argmax), geometry_(WindowOf(spec)) {}
  ~MaxPoolLayer() override { backend_->Free(argmax_); }

  void Forward(int batch, const float* /*params*/, const float* in,
               float* out) override {
    backend_->MaxPool(geometry_, batch, in, out, argmax_);
  }

  void Backward(int batch, const float* /*params*/, const float* /*in*/,
                const float* /*out*/, float* dout, float* din,
                float* /*grads*/) override {
    if (din != nullptr) {
      backend_->MaxPoolBackward(geometry_, batch, dout, argmax_, din);
    }
  }

 private:
  ComputeBackend* const backend_;
  int32_t* const argmax_;  // owned
  const WindowGeometry geometry_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeMaxPoolLayer(
    ComputeBackend* backend, const common::LayerSpec& spec, int max_batch) {
  absl::StatusOr<int32_t*> argmax =
      backend->AllocateInts(static_cast<size_t>(max_batch) * spec.out.size());
  if (!argmax.ok()) return argmax.status();
  return std::make_unique<MaxPoolLayer>(backend, spec, *argmax);
}

}  // namespace monsoon::worker
