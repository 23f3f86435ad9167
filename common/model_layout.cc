#include "common/model_layout.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "absl/base/config.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace monsoon::common {

#if !defined(ABSL_IS_LITTLE_ENDIAN)
#error "initial_weights files are little-endian float32; port ReadInitialWeights."
#endif

namespace {

// Bounds that keep every index and GEMM dimension of a batch within int
// (the backends' BLAS calls take ints): a side of an activation, its
// values, and the parameters.
constexpr int kMaxSide = 1 << 15;
constexpr uint64_t kMaxActivation = uint64_t{1} << 24;
constexpr uint64_t kMaxParams = uint64_t{1} << 31;

absl::Status LayerError(int index, const std::string& what,
                        const std::string& message) {
  return absl::InvalidArgumentError(
      absl::StrCat("layer ", index, " (", what, "): ", message));
}

}  // namespace

std::string ShapeString(const Shape& shape) {
  return absl::StrCat(shape.height, "x", shape.width, "x", shape.channels);
}

std::string LayerString(const LayerSpec& layer) {
  switch (layer.kind) {
    case LayerSpec::Kind::kDense:
      return absl::StrCat("dense ", layer.out.channels);
    case LayerSpec::Kind::kConv:
      return absl::StrCat(
          "conv ", layer.kernel, "x", layer.kernel, "x", layer.out.channels,
          layer.stride != 1 ? absl::StrCat(" stride ", layer.stride) : "",
          layer.padding != 0 ? absl::StrCat(" pad ", layer.padding) : "");
    case LayerSpec::Kind::kMaxPool:
      return absl::StrCat("max_pool ", layer.kernel,
                          layer.stride != layer.kernel
                              ? absl::StrCat(" stride ", layer.stride)
                              : "");
    case LayerSpec::Kind::kRelu:
      return "relu";
  }
  return "?";
}

void ModelLayout::AddParameterized(LayerSpec layer, uint64_t fan_in,
                                   uint64_t units, bool units_major) {
  const int ordinal = static_cast<int>(tensors_.size() / 2);
  layer.weights = static_cast<int>(tensors_.size());
  tensors_.push_back({absl::StrCat("layer", ordinal, "/weights"), num_params_,
                      units_major ? units : fan_in,
                      units_major ? fan_in : units, fan_in});
  num_params_ += fan_in * units;
  layer.bias = static_cast<int>(tensors_.size());
  tensors_.push_back(
      {absl::StrCat("layer", ordinal, "/bias"), num_params_, 1, units, 0});
  num_params_ += units;
  layers_.push_back(layer);
}

ModelLayout::ModelLayout(const std::vector<int>& layer_sizes) {
  input_ = {1, 1, layer_sizes.empty() ? 1 : layer_sizes[0]};
  for (size_t l = 0; l + 1 < layer_sizes.size(); ++l) {
    LayerSpec dense{LayerSpec::Kind::kDense};
    dense.in = {1, 1, layer_sizes[l]};
    dense.out = {1, 1, layer_sizes[l + 1]};
    AddParameterized(dense, layer_sizes[l], layer_sizes[l + 1],
                     /*units_major=*/false);
    if (l + 2 < layer_sizes.size()) {
      LayerSpec relu{LayerSpec::Kind::kRelu};
      relu.in = relu.out = dense.out;
      layers_.push_back(relu);
    }
  }
}

absl::Status ModelLayout::AddDense(int index, const Shape& in,
                                   const Layer::Dense& dense) {
  const int units = dense.units();
  if (!dense.has_units() || units < 1 || units > (1 << 20)) {
    return LayerError(index, "dense", "units must be from 1 to 1048576");
  }
  LayerSpec spec;
  spec.in = in;
  spec.kind = LayerSpec::Kind::kDense;
  spec.out = {1, 1, units};
  if (in.size() * units > kMaxParams) {
    return LayerError(
        index, "dense",
        absl::StrCat(in.size(), " x ", units, " weights are too many (at most ",
                     kMaxParams, ")"));
  }
  AddParameterized(spec, in.size(), units, /*units_major=*/false);
  return absl::OkStatus();
}

absl::Status ModelLayout::AddConv(int index, const Shape& in,
                                  const Layer::Conv& conv) {
  const std::string what = absl::StrCat("conv ", conv.kernel(), "x",
                                        conv.kernel(), "x", conv.filters());
  if (conv.filters() < 1 || conv.filters() > kMaxSide) {
    return LayerError(index, what,
                      absl::StrCat("filters must be from 1 to ", kMaxSide));
  }
  if (conv.kernel() < 1 || conv.kernel() > 64) {
    return LayerError(index, what, "kernel must be from 1 to 64");
  }
  if (conv.stride() < 1 || conv.stride() > 64) {
    return LayerError(index, what, "stride must be from 1 to 64");
  }
  if (conv.padding() < 0 || conv.padding() >= conv.kernel()) {
    return LayerError(index, what, "padding must be from 0 to kernel - 1");
  }
  const int64_t padded_h = in.height + 2 * conv.padding();
  const int64_t padded_w = in.width + 2 * conv.padding();
  if (padded_h < conv.kernel() || padded_w < conv.kernel()) {
    return LayerError(
        index, what,
        absl::StrCat("its input is ", ShapeString(in),
                     ", smaller than the kernel even with padding ",
                     conv.padding(),
                     ": use smaller kernels or fewer pooling layers "
                     "for images this small"));
  }
  LayerSpec spec;
  spec.in = in;
  spec.kind = LayerSpec::Kind::kConv;
  spec.kernel = conv.kernel();
  spec.stride = conv.stride();
  spec.padding = conv.padding();
  spec.out = {static_cast<int>((padded_h - conv.kernel()) / conv.stride() + 1),
              static_cast<int>((padded_w - conv.kernel()) / conv.stride() + 1),
              conv.filters()};
  const uint64_t fan_in =
      static_cast<uint64_t>(conv.kernel()) * conv.kernel() * in.channels;
  if (spec.out.size() > kMaxActivation ||
      spec.out.height * uint64_t(spec.out.width) * fan_in >
          kMaxActivation * 64) {
    return LayerError(index, what,
                      absl::StrCat("its output ", ShapeString(spec.out),
                                   " or its patches are too large"));
  }
  AddParameterized(spec, fan_in, conv.filters(), /*units_major=*/true);
  return absl::OkStatus();
}

absl::Status ModelLayout::AddMaxPool(int index, const Shape& in,
                                     const Layer::MaxPool& pool) {
  const int stride = pool.has_stride() ? pool.stride() : pool.size();
  const std::string what = absl::StrCat("max_pool ", pool.size());
  if (pool.size() < 1 || pool.size() > 64) {
    return LayerError(index, what, "size must be from 1 to 64");
  }
  if (stride < 1 || stride > 64) {
    return LayerError(index, what, "stride must be from 1 to 64");
  }
  if (in.height < pool.size() || in.width < pool.size()) {
    return LayerError(
        index, what,
        absl::StrCat("its input is ", ShapeString(in),
                     ", smaller than the window: use fewer pooling "
                     "layers for images this small"));
  }
  LayerSpec spec;
  spec.in = in;
  spec.kind = LayerSpec::Kind::kMaxPool;
  spec.kernel = pool.size();
  spec.stride = stride;
  spec.out = {(in.height - pool.size()) / stride + 1,
              (in.width - pool.size()) / stride + 1, in.channels};
  layers_.push_back(spec);
  return absl::OkStatus();
}

absl::StatusOr<ModelLayout> ModelLayout::Create(
    const Shape& input, absl::Span<const Layer* const> layers) {
  if (input.height < 1 || input.width < 1 || input.channels < 1 ||
      input.height > kMaxSide || input.width > kMaxSide ||
      input.channels > kMaxSide || input.size() > kMaxActivation) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input shape ", ShapeString(input), " must have sides from 1 to ",
        kMaxSide, " and at most ", kMaxActivation, " values"));
  }
  ModelLayout layout;
  layout.input_ = input;
  Shape shape = input;
  for (size_t i = 0; i < layers.size(); ++i) {
    const Layer& layer = *layers[i];
    const int index = static_cast<int>(i) + 1;
    absl::Status added;
    switch (layer.kind_case()) {
      case Layer::kDense:
        added = layout.AddDense(index, shape, layer.dense());
        break;
      case Layer::kConv:
        added = layout.AddConv(index, shape, layer.conv());
        break;
      case Layer::kMaxPool:
        added = layout.AddMaxPool(index, shape, layer.max_pool());
        break;
      case Layer::kRelu: {
        LayerSpec relu{LayerSpec::Kind::kRelu};
        relu.in = relu.out = shape;
        layout.layers_.push_back(relu);
        break;
      }
      case Layer::kFlatten:
        continue;  // nothing changes in memory
      case Layer::KIND_NOT_SET:
        return LayerError(index, "empty",
                          "say which kind: dense, conv, max_pool, relu or "
                          "flatten");
    }
    if (!added.ok()) return added;
    if (layout.num_params_ > kMaxParams) {
      return LayerError(
          index, LayerString(layout.layers_.back()),
          absl::StrCat("the model has ", layout.num_params_,
                       " parameters so far, more than ", kMaxParams));
    }
    shape = layout.layers_.back().out;
  }
  return layout;
}

ModelLayout ModelLayout::FromTensors(
    const google::protobuf::RepeatedPtrField<ExternalTensor>& tensors) {
  ModelLayout layout;
  for (const ExternalTensor& t : tensors) {
    // rows: the first side; cols: the product of the others (He
    // initialization's fan-in where a tensor has more than one side).
    uint64_t rows = t.dims_size() > 0 ? static_cast<uint64_t>(t.dims(0)) : 1;
    uint64_t cols = 1;
    for (int d = 1; d < t.dims_size(); ++d) cols *= t.dims(d);
    TensorSpec spec{t.name(), layout.num_params_, rows, cols,
                    t.dims_size() > 1 ? cols : 0};
    layout.num_params_ += spec.size();
    layout.tensors_.push_back(std::move(spec));
  }
  return layout;
}

ModelLayout ModelLayout::FromConfig(const TrainingConfig& config) {
  if (config.tensors_size() > 0) return FromTensors(config.tensors());
  ModelLayout layout;
  if (config.layer_sizes_size() > 0) {
    layout = ModelLayout(std::vector<int>(config.layer_sizes().begin(),
                                          config.layer_sizes().end()));
  } else if (config.input_shape_size() == 3) {
    std::vector<const Layer*> layers;
    for (const Layer& layer : config.layers()) layers.push_back(&layer);
    absl::StatusOr<ModelLayout> created = Create(
        {config.input_shape(0), config.input_shape(1), config.input_shape(2)},
        layers);
    if (!created.ok()) return ModelLayout();
    layout = *std::move(created);
  }
  if (config.output_init() == ZERO && !layout.layers_.empty() &&
      layout.layers_.back().weights >= 0) {
    layout.tensors_[layout.layers_.back().weights].starts_at_zero = true;
  }
  return layout;
}

int ModelLayout::num_classes() const {
  return layers_.empty() ? 0 : layers_.back().out.channels;
}

uint64_t ModelLayout::ForwardFlops() const {
  uint64_t flops = 0;
  for (const LayerSpec& layer : layers_) {
    if (layer.weights < 0) continue;
    const TensorSpec& w = tensors_[layer.weights];
    flops += 2 * w.size() * layer.out.height * layer.out.width;
  }
  return flops;
}

uint64_t ModelLayout::LargestBufferPerExample() const {
  uint64_t largest = input_.size();
  for (const LayerSpec& layer : layers_) {
    largest = std::max(largest, layer.out.size());
    if (layer.kind == LayerSpec::Kind::kConv) {
      largest = std::max(largest, static_cast<uint64_t>(layer.out.height) *
                                      layer.out.width *
                                      tensors_[layer.weights].fan_in);
    }
  }
  return largest;
}

std::string ModelLayout::Describe() const {
  std::vector<std::string> parts;
  for (const LayerSpec& layer : layers_) parts.push_back(LayerString(layer));
  return absl::StrJoin(parts, ", ");
}

ShardRange ShardRangeFor(uint64_t num_params, int num_shards, int shard) {
  // s*P/S without overflowing s*P: split P = q*S + r.
  const uint64_t s = static_cast<uint64_t>(num_shards);
  const uint64_t q = num_params / s;
  const uint64_t r = num_params % s;
  auto start = [&](uint64_t i) { return i * q + (i * r) / s; };
  return {start(static_cast<uint64_t>(shard)),
          start(static_cast<uint64_t>(shard) + 1)};
}

absl::StatusOr<std::vector<float>> ReadInitialWeights(const std::string& path,
                                                      uint64_t num_params,
                                                      ShardRange range) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        "initial_weights '", path, "' cannot be read: ", std::strerror(errno)));
  }
  const uint64_t bytes = static_cast<uint64_t>(in.tellg());
  if (bytes != num_params * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "initial_weights '", path, "' holds ", bytes, " bytes, but the model's ",
        num_params, " parameters need ", num_params * sizeof(float),
        ": write it again from the same model (monsoon.torch.export_layout)"));
  }
  std::vector<float> values(range.size());
  in.seekg(static_cast<std::streamoff>(range.begin * sizeof(float)));
  in.read(reinterpret_cast<char*>(values.data()),
          static_cast<std::streamsize>(values.size() * sizeof(float)));
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial_weights '", path, "': reading failed"));
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return absl::DataLossError(absl::StrCat(
          "initial_weights '", path, "': parameter ", range.begin + i,
          " is ", values[i], ", not a finite number"));
    }
  }
  return values;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::vector<float> UniformValues(size_t n, uint64_t seed, float scale) {
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t bits = SplitMix64(seed * 1000003 + i);
    values[i] =
        static_cast<float>(scale * (static_cast<double>(bits >> 11) /
                                        static_cast<double>(1ull << 52) -
                                    1.0));
  }
  return values;
}

float InitialValue(const ModelLayout& layout, uint64_t seed, uint64_t index) {
  for (const LayerSpec& layer : layout.layers()) {
    if (layer.weights < 0) continue;
    const TensorSpec& w = layout.tensors()[layer.weights];
    if (index >= w.offset && index < w.offset + w.size()) {
      if (w.starts_at_zero) return 0.0f;
      const uint64_t bits = SplitMix64(SplitMix64(seed) ^ index);
      // 24 random bits -> uniform in [-1, 1).
      const double u = static_cast<double>(bits >> 40) / (1ull << 23) - 1.0;
      const double limit = std::sqrt(6.0 / static_cast<double>(w.fan_in));
      return static_cast<float>(u * limit);
    }
  }
  return 0.0f;  // a bias
}

void InitialValues(const ModelLayout& layout, uint64_t seed, uint64_t begin,
                   absl::Span<float> out) {
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = InitialValue(layout, seed, begin + i);
  }
}

}  // namespace monsoon::common
