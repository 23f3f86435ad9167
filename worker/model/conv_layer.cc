// 2-D convolution as im2col plus one GEMM: the patches of a batch form a
// (batch * out_height * out_width) x (kernel * kernel * channels) matrix,
// which times W^T (W has a row of that many weights per filter) is the
// output, channels last. The backward pass reuses the patches for dW and then
// the same buffer for the patches' gradient, which col2im folds back onto the
// input. Where the backend computes the window directly from the images
// (ComputeBackend::DirectConvScratch), the layer keeps that scratch instead,
// and the patches' buffer only if its input needs a gradient.
#include "worker/model/layer.h"

namespace monsoon::worker {
namespace {

class ConvLayer : public Layer {
 public:
  ConvLayer(ComputeBackend* backend, const common::LayerSpec& spec,
            const common::TensorSpec& weights, const common::TensorSpec& bias,
            float* patches, float* direct_scratch)
      : backend_(backend),
        weights_(weights.offset),
        bias_(bias.offset),
        patches_(patches),
        direct_scratch_(direct_scratch),
        geometry_(WindowOf(spec)),
        filters_(spec.out.channels) {}
  ~ConvLayer() override {
    if (patches_ != nullptr) backend_->Free(patches_);
    if (direct_scratch_ != nullptr) backend_->Free(direct_scratch_);
  }

  void Forward(int batch, const float* params, const float* in,
               float* out) override {
    if (direct_scratch_ != nullptr) {
      backend_->DirectConvForward(geometry_, batch, filters_, in,
                                  params + weights_, params + bias_, out,
                                  direct_scratch_);
      return;
    }
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
    if (direct_scratch_ != nullptr) {
      backend_->DirectConvBackward(geometry_, batch, filters_, dout,
                                   grads + weights_, grads + bias_,
                                   direct_scratch_);
    } else {
      // dW = dout^T * patches; db = column sums of dout.
      backend_->Gemm(true, false, filters_, geometry_.patch(), rows, 1.0f, dout,
                     patches_, 0.0f, grads + weights_);
      backend_->ColumnSums(rows, filters_, dout, grads + bias_);
    }
    if (din == nullptr) return;
    if (backend_->ConvInputGradient(geometry_, batch, filters_, dout,
                                    params + weights_, din)) {
      return;
    }
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
  float* const patches_;         // owned; null where not needed
  float* const direct_scratch_;  // owned; null unless computed directly
  const WindowGeometry geometry_;
  const int filters_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeConvLayer(
    ComputeBackend* backend, const common::ModelLayout& layout,
    const common::LayerSpec& spec, int max_batch, bool input_gradient) {
  const common::TensorSpec& weights = layout.tensors()[spec.weights];
  const size_t direct =
      backend->DirectConvScratch(WindowOf(spec), spec.out.channels, max_batch);
  float* direct_scratch = nullptr;
  if (direct > 0) {
    absl::StatusOr<float*> scratch = backend->AllocateFloats(direct);
    if (!scratch.ok()) return scratch.status();
    direct_scratch = *scratch;
  }
  float* patches = nullptr;
  if (direct == 0 || input_gradient) {
    absl::StatusOr<float*> allocated = backend->AllocateFloats(
        static_cast<size_t>(max_batch) * spec.out.height * spec.out.width *
        weights.fan_in);
    if (!allocated.ok()) {
      if (direct_scratch != nullptr) backend->Free(direct_scratch);
      return allocated.status();
    }
    patches = *allocated;
  }
  return std::make_unique<ConvLayer>(backend, spec, weights,
                                     layout.tensors()[spec.bias], patches,
                                     direct_scratch);
}

}  // namespace monsoon::worker
