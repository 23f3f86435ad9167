#include "worker/model/layer.h"

namespace monsoon::worker {

WindowGeometry WindowOf(const common::LayerSpec& spec) {
  WindowGeometry g;
  g.height = spec.in.height;
  g.width = spec.in.width;
  g.channels = spec.in.channels;
  g.kernel = spec.kernel;
  g.stride = spec.stride;
  g.padding = spec.padding;
  g.out_height = spec.out.height;
  g.out_width = spec.out.width;
  return g;
}

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(
    ComputeBackend* backend, const common::ModelLayout& layout,
    const common::LayerSpec& spec, int max_batch, bool input_gradient) {
  switch (spec.kind) {
    case common::LayerSpec::Kind::kDense:
      return MakeDenseLayer(backend, layout, spec);
    case common::LayerSpec::Kind::kConv:
      return MakeConvLayer(backend, layout, spec, max_batch, input_gradient);
    case common::LayerSpec::Kind::kMaxPool:
      return MakeMaxPoolLayer(backend, spec, max_batch);
    case common::LayerSpec::Kind::kRelu:
      return MakeReluLayer(backend, spec);
  }
  return absl::InternalError("a layer of an unknown kind");
}

}  // namespace monsoon::worker
