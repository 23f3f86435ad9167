// The model's flattened parameter vector, how it is split among shards, and
// its initial values. Both servers and workers derive all of this from the
// resolved config alone, so they agree without exchanging it.
// Stateless functions and immutable values; thread-safe.
#ifndef MONSOON_COMMON_MODEL_LAYOUT_H_
#define MONSOON_COMMON_MODEL_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "proto/config.pb.h"

namespace monsoon::common {

// One named float32 tensor within the flattened parameters.
struct TensorSpec {
  std::string name;  // "layer0/weights", "layer0/bias", ...
  uint64_t offset;   // first index in the flattened vector
  uint64_t rows;     // weights: fan-in; bias: 1
  uint64_t cols;     // units of the layer
  uint64_t size() const { return rows * cols; }
};

// For layer l (l = 0 .. layers-1): weights [in x out] row-major, then bias
// [out], in layer order.
class ModelLayout {
 public:
  explicit ModelLayout(const std::vector<int>& layer_sizes);
  static ModelLayout FromConfig(const TrainingConfig& config);

  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  const std::vector<int>& layer_sizes() const { return layer_sizes_; }
  int num_layers() const { return static_cast<int>(layer_sizes_.size()) - 1; }
  uint64_t num_params() const { return num_params_; }
  const TensorSpec& weights(int layer) const { return tensors_[2 * layer]; }
  const TensorSpec& bias(int layer) const { return tensors_[2 * layer + 1]; }

 private:
  std::vector<int> layer_sizes_;
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
// index, layout). Weights are uniform in +-sqrt(6 / fan_in) (He uniform);
// biases are 0.
float InitialValue(const ModelLayout& layout, uint64_t seed, uint64_t index);

// Fills out[i] = InitialValue(layout, seed, begin + i).
void InitialValues(const ModelLayout& layout, uint64_t seed, uint64_t begin,
                   absl::Span<float> out);

// SplitMix64: a counter-based generator for reproducible randomness.
uint64_t SplitMix64(uint64_t x);

// n values uniform in [-scale, scale), value i drawn from
// SplitMix64(seed * 1000003 + i): the same on every platform. For tests and
// benchmarks that need arbitrary but repeatable inputs.
std::vector<float> UniformValues(size_t n, uint64_t seed, float scale = 1.0f);

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_MODEL_LAYOUT_H_
