// 2-D convolution as im2col plus one GEMM: the patches of a batch form a
// (batch * out_height * out_width) x (kernel * kernel * channels) matrix,
// which times W^T (W has a row of that many weights per filter) is the
// output, channels last. The backward pass reuses the patches for dW and then
// the same buffer for the patches' gradient, which col2im folds back onto the
// input.
#include "worker/model/layer.h"

namespace monsoon::worker {
namespace {

class ConvLayer : public Layer {
 public:
  ConvLayer(ComputeBackend* backend, const common::LayerSpec& spec,
            const common::TensorSpec& weights, const common::TensorSpec& bias,
            float* patches)
      : backend_(backend),
        weights_(weights.offset),
        bias_(bias.offset),
        patches_(patches),
        geometry_(WindowOf(spec)),
        filters_(spec.out.channels) {}
  ~ConvLayer() override { backend_->Free(patches_); }

  void Forward(int batch, const float* params, const float* in,
               float* out) override {
    const int rows = batch * geometry_.out_height * geometry_.out_width;
    backend_->Im2Col(geometry_, batch, in, patches_);
    backend_->Gemm(false, true, rows, filters_, geometry_.patch(), 1.0f,
                   patches_, params + weights_, 0.0f, out);
    backend_->AddBias(rows, filters_, params + bias_, out);
  }

  void Backward(int batch, const float* params, const float* /*in*/,
                const float* /*out*/, float* dout, float* din,
                float* grads) override {
    const int rows = batch * geometry_.out_height * geometry_.out_width;
    // dW = dout^T * patches; db = column sums of dout.
    backend_->Gemm(true, false, filters_, geometry_.patch(), rows, 1.0f, dout,
                   patches_, 0.0f, grads + weights_);
    backend_->ColumnSums(rows, filters_, dout, grads + bias_);
    if (din == nullptr) return;
    // d(patches) = dout * W, into the patches' buffer (no longer needed),
    // then folded back onto the input.
    backend_->Gemm(false, false, rows, geometry_.patch(), filters_, 1.0f, dout,
                   params + weights_, 0.0f, patches_);
    backend_->Col2Im(geometry_, batch, patches_, din);
  }

 private:
  ComputeBackend* const backend_;
  const uint64_t weights_;
  const uint64_t bias_;
  float* const patches_;  // owned
  const WindowGeometry geometry_;
  const int filters_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeConvLayer(
    ComputeBackend* backend, const common::ModelLayout& layout,
    const common::LayerSpec& spec, int max_batch) {
  const common::TensorSpec& weights = layout.tensors()[spec.weights];
  absl::StatusOr<float*> patches =
      backend->AllocateFloats(static_cast<size_t>(max_batch) * spec.out.height *
                              spec.out.width * weights.fan_in);
  if (!patches.ok()) return patches.status();
  return std::make_unique<ConvLayer>(backend, spec, weights,
                                     layout.tensors()[spec.bias], *patches);
}

}  // namespace monsoon::worker
