// The model's layers and their shapes, its flattened parameter vector, how
// that vector is split among shards, and its initial values. Both servers
// and workers derive all of this from the resolved config alone, so they
// agree without exchanging it.
// Stateless functions and immutable values; thread-safe.
#ifndef MONSOON_COMMON_MODEL_LAYOUT_H_
#define MONSOON_COMMON_MODEL_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/config.pb.h"

namespace monsoon::common {

// One named float32 tensor within the flattened parameters.
// Row-major: a dense layer's weights are fan-in x units, a conv layer's
// filters x fan-in (one row per filter: the orientation whose products
// OpenBLAS runs fastest for a conv's few filters), a bias 1 x units.
struct TensorSpec {
  std::string name;  // "layer0/weights", "layer0/bias", ...
  uint64_t offset;   // first index in the flattened vector
  uint64_t rows;
  uint64_t cols;
  // Weights: the inputs each unit sums (He initialization's fan-in); a
  // bias: 0.
  uint64_t fan_in = 0;
  // Weights that start at 0 instead of He uniform (TrainingConfig's
  // output_init ZERO, on the output layer).
  bool starts_at_zero = false;
  uint64_t size() const { return rows * cols; }
};

// An activation's shape: height x width x channels, channels last (so a
// batch of them is a row-major [examples * height * width, channels]
// matrix). A dense layer's output is 1 x 1 x units.
struct Shape {
  int height = 1;
  int width = 1;
  int channels = 1;
  uint64_t size() const {
    return static_cast<uint64_t>(height) * width * channels;
  }
  bool operator==(const Shape& other) const {
    return height == other.height && width == other.width &&
           channels == other.channels;
  }
  bool operator!=(const Shape& other) const { return !(*this == other); }
};
std::string ShapeString(const Shape& shape);  // "28x28x1"

// One layer with its shapes resolved.
struct LayerSpec {
  enum class Kind { kDense, kConv, kMaxPool, kRelu };
  Kind kind;
  Shape in;
  Shape out;
  // kConv: the kernel's side; kMaxPool: the window's side.
  int kernel = 0;
  int stride = 1;
  int padding = 0;  // kConv
  // Indices into ModelLayout::tensors() (kDense and kConv), else -1. A
  // conv's fan-in is ordered (kernel row, kernel column, input channel), as
  // im2col lays out a patch.
  int weights = -1;
  int bias = -1;
};
std::string LayerString(const LayerSpec& layer);  // "conv 5x5x6 pad 2", ...

class ModelLayout {
 public:
  // A multilayer perceptron: layer_sizes is input first, classes last; a
  // dense layer between each pair, with ReLU after all but the last.
  // Requires at least 2 positive sizes.
  explicit ModelLayout(const std::vector<int>& layer_sizes);

  // The layers of `layers` on examples of shape `input`; Flatten layers are
  // skipped (they change nothing in memory). INVALID_ARGUMENT names the
  // layer (1-based) that does not fit its input, has a bad field, or makes
  // the model too large; a dense layer's units must be set.
  static absl::StatusOr<ModelLayout> Create(
      const Shape& input, absl::Span<const Layer* const> layers);

  // The parameters of an external model (TrainingConfig.tensors): no
  // layers, each tensor's rows its first side and cols the product of the
  // others. The tensors must have passed ResolveConfig.
  static ModelLayout FromTensors(
      const google::protobuf::RepeatedPtrField<ExternalTensor>& tensors);

  // The layout of a resolved config (common/config.h's ResolveConfig): its
  // tensors, layer_sizes or layers, with the output layer's weights
  // starting at 0 where its output_init says so. The config must have
  // passed ResolveConfig; otherwise the layout has no layers and no
  // parameters.
  static ModelLayout FromConfig(const TrainingConfig& config);

  const std::vector<LayerSpec>& layers() const { return layers_; }
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  const Shape& input() const { return input_; }
  // The last layer's units: the number of classes.
  int num_classes() const;
  uint64_t num_params() const { return num_params_; }
  // Multiply-adds times 2 of one example's forward pass through the dense
  // and conv layers (pooling and ReLU, which do no arithmetic worth the
  // name, are not counted).
  uint64_t ForwardFlops() const;
  // The most floats one example needs in any one buffer: an activation, or
  // a conv layer's patches (output height x width x fan-in). A batch of B
  // needs B times this, which must stay below 2^31 for the backends' ints.
  uint64_t LargestBufferPerExample() const;
  // "conv 5x5x6 pad 2, relu, max_pool 2, ..., dense 10".
  std::string Describe() const;

 private:
  ModelLayout() = default;
  // Appends a layer with weights (fan_in x units, or units x fan_in with
  // `units_major`) and a bias of `units`.
  void AddParameterized(LayerSpec layer, uint64_t fan_in, uint64_t units,
                        bool units_major);
  // Create's steps: append the layer `index` (1-based, for messages) of
  // that kind on an input of shape `in`, or say why it does not fit (as
  // Create does).
  absl::Status AddDense(int index, const Shape& in, const Layer::Dense& dense);
  absl::Status AddConv(int index, const Shape& in, const Layer::Conv& conv);
  absl::Status AddMaxPool(int index, const Shape& in,
                          const Layer::MaxPool& pool);

  Shape input_;
  std::vector<LayerSpec> layers_;
  std::vector<TensorSpec> tensors_;
  uint64_t num_params_ = 0;
};

// Shard s of S owns [s*P/S, (s+1)*P/S) (integer division, computed without
// overflow for any P below 2^63). Requires 0 <= s < S.
struct ShardRange {
  uint64_t begin;
  uint64_t end;
  uint64_t size() const { return end - begin; }
};
ShardRange ShardRangeFor(uint64_t num_params, int num_shards, int shard);

// The initial value of global parameter `index`: a pure function of (seed,
// index, layout). Weights are uniform in +-sqrt(6 / fan_in) (He uniform)
// unless they start at 0 (TensorSpec::starts_at_zero); biases are 0.
float InitialValue(const ModelLayout& layout, uint64_t seed, uint64_t index);

// Fills out[i] = InitialValue(layout, seed, begin + i).
void InitialValues(const ModelLayout& layout, uint64_t seed, uint64_t begin,
                   absl::Span<float> out);

// The values [range.begin, range.end) of an initial-weights file
// (TrainingConfig.initial_weights): num_params little-endian float32. A
// file that cannot be read, or whose size is not num_params * 4 bytes,
// gives INVALID_ARGUMENT naming the path and what was wrong; a value that
// is not finite, DATA_LOSS naming its index.
absl::StatusOr<std::vector<float>> ReadInitialWeights(const std::string& path,
                                                      uint64_t num_params,
                                                      ShardRange range);

// SplitMix64: a counter-based generator for reproducible randomness.
uint64_t SplitMix64(uint64_t x);

// n values uniform in [-scale, scale), value i drawn from
// SplitMix64(seed * 1000003 + i): the same on every platform. For tests and
// benchmarks that need arbitrary but repeatable inputs.
std::vector<float> UniformValues(size_t n, uint64_t seed, float scale = 1.0f);

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_MODEL_LAYOUT_H_
