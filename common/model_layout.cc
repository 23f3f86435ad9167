#include "common/model_layout.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace monsoon::common {

ModelLayout::ModelLayout(const std::vector<int>& layer_sizes)
    : layer_sizes_(layer_sizes) {
  uint64_t offset = 0;
  for (size_t l = 0; l + 1 < layer_sizes.size(); ++l) {
    const uint64_t in = layer_sizes[l];
    const uint64_t out = layer_sizes[l + 1];
    tensors_.push_back({absl::StrCat("layer", l, "/weights"), offset, in, out});
    offset += in * out;
    tensors_.push_back({absl::StrCat("layer", l, "/bias"), offset, 1, out});
    offset += out;
  }
  num_params_ = offset;
}

ModelLayout ModelLayout::FromConfig(const TrainingConfig& config) {
  return ModelLayout(std::vector<int>(config.layer_sizes().begin(),
                                      config.layer_sizes().end()));
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
  for (int l = 0; l < layout.num_layers(); ++l) {
    const TensorSpec& w = layout.weights(l);
    if (index >= w.offset && index < w.offset + w.size()) {
      const uint64_t bits = SplitMix64(SplitMix64(seed) ^ index);
      // 24 random bits -> uniform in [-1, 1).
      const double u = static_cast<double>(bits >> 40) / (1ull << 23) - 1.0;
      const double limit = std::sqrt(6.0 / static_cast<double>(w.rows));
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
