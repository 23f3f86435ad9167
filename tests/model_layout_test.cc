#include "common/model_layout.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"

namespace monsoon::common {
namespace {

using ::testing::ElementsAre;

// floor(s * p / n) computed exactly, as the reference for ShardRangeFor.
uint64_t ExactStart(uint64_t p, int n, int s) {
  return static_cast<uint64_t>(static_cast<unsigned __int128>(p) *
                               static_cast<unsigned __int128>(s) /
                               static_cast<unsigned __int128>(n));
}

TEST(ShardRangeForTest, CoversEveryIndexExactlyOnce) {
  const std::vector<std::pair<uint64_t, int>> cases = {
      {10, 3}, {11, 4}, {100, 7}, {53, 2}, {235146, 7},
      {7, 7},  {1, 1},  {13, 1},  {5, 5},  {1000, 999}};
  for (const auto& [p, n] : cases) {
    SCOPED_TRACE(testing::Message() << "P=" << p << " S=" << n);
    std::vector<int> owners(p, 0);
    uint64_t expected_begin = 0;
    for (int s = 0; s < n; ++s) {
      const ShardRange range = ShardRangeFor(p, n, s);
      EXPECT_EQ(range.begin, expected_begin) << "shard " << s;
      ASSERT_LE(range.begin, range.end);
      ASSERT_LE(range.end, p);
      // Sizes differ by at most one: floor(P/S) or ceil(P/S).
      EXPECT_GE(range.size(), p / n);
      EXPECT_LE(range.size(), (p + n - 1) / n);
      for (uint64_t i = range.begin; i < range.end; ++i) ++owners[i];
      expected_begin = range.end;
    }
    EXPECT_EQ(expected_begin, p);
    for (uint64_t i = 0; i < p; ++i) {
      ASSERT_EQ(owners[i], 1) << "index " << i;
    }
  }
}

TEST(ShardRangeForTest, MatchesTheDefinitionForHugeParameterCounts) {
  const std::vector<std::pair<uint64_t, int>> cases = {
      {(uint64_t{1} << 40) - 3, 3},          {(uint64_t{1} << 40) + 7, 7},
      {(uint64_t{1} << 40) - 1, 1000},       {(uint64_t{1} << 40) + 1, 65537},
      {(uint64_t{1} << 63) - 1, 2147483647},
  };
  for (const auto& [p, n] : cases) {
    SCOPED_TRACE(testing::Message() << "P=" << p << " S=" << n);
    // Every boundary for the small shard counts; a sample for the big ones.
    std::vector<int> shards;
    if (n <= 65537) {
      for (int s = 0; s < n; ++s) shards.push_back(s);
    } else {
      shards = {0, 1, 2, n / 2, n - 2, n - 1};
    }
    for (int s : shards) {
      const ShardRange range = ShardRangeFor(p, n, s);
      ASSERT_EQ(range.begin, ExactStart(p, n, s)) << "shard " << s;
      ASSERT_EQ(range.end, ExactStart(p, n, s + 1)) << "shard " << s;
    }
    EXPECT_EQ(ShardRangeFor(p, n, 0).begin, 0u);
    EXPECT_EQ(ShardRangeFor(p, n, n - 1).end, p);
  }
}

TEST(ModelLayoutTest, DefaultModelHasTheDocumentedOffsets) {
  const ModelLayout layout({784, 256, 128, 10});
  EXPECT_EQ(layout.num_layers(), 3);
  EXPECT_EQ(layout.num_params(), 235146u);
  ASSERT_EQ(layout.tensors().size(), 6u);
  struct Expected {
    const char* name;
    uint64_t offset, rows, cols;
  };
  const Expected expected[] = {
      {"layer0/weights", 0, 784, 256},      {"layer0/bias", 200704, 1, 256},
      {"layer1/weights", 200960, 256, 128}, {"layer1/bias", 233728, 1, 128},
      {"layer2/weights", 233856, 128, 10},  {"layer2/bias", 235136, 1, 10},
  };
  for (size_t t = 0; t < 6; ++t) {
    SCOPED_TRACE(expected[t].name);
    EXPECT_EQ(layout.tensors()[t].name, expected[t].name);
    EXPECT_EQ(layout.tensors()[t].offset, expected[t].offset);
    EXPECT_EQ(layout.tensors()[t].rows, expected[t].rows);
    EXPECT_EQ(layout.tensors()[t].cols, expected[t].cols);
  }
  EXPECT_EQ(&layout.weights(1), &layout.tensors()[2]);
  EXPECT_EQ(&layout.bias(2), &layout.tensors()[5]);
  EXPECT_EQ(layout.bias(2).size(), 10u);
  EXPECT_EQ(layout.bias(2).offset + layout.bias(2).size(), layout.num_params());
}

TEST(ModelLayoutTest, FromConfigUsesTheConfigsLayerSizes) {
  TrainingConfig config;
  for (int size : {6, 5, 3}) config.add_layer_sizes(size);
  const ModelLayout layout = ModelLayout::FromConfig(config);
  EXPECT_THAT(layout.layer_sizes(), ElementsAre(6, 5, 3));
  EXPECT_EQ(layout.num_params(), 6u * 5 + 5 + 5 * 3 + 3);
}

TEST(InitialValueTest, BiasesAreZeroAndWeightsWithinHeUniformLimits) {
  const ModelLayout layout({784, 256, 128, 10});
  std::vector<float> values(layout.num_params());
  InitialValues(layout, /*seed=*/1, 0, absl::MakeSpan(values));
  for (int l = 0; l < layout.num_layers(); ++l) {
    const TensorSpec& w = layout.weights(l);
    const float limit = static_cast<float>(std::sqrt(6.0 / w.rows));
    float lowest = 0, highest = 0;
    for (uint64_t i = w.offset; i < w.offset + w.size(); ++i) {
      ASSERT_LE(std::abs(values[i]), limit) << "index " << i;
      lowest = std::min(lowest, values[i]);
      highest = std::max(highest, values[i]);
    }
    // The values fill the range rather than collapsing near 0.
    EXPECT_LT(lowest, -0.9f * limit) << w.name;
    EXPECT_GT(highest, 0.9f * limit) << w.name;
    const TensorSpec& b = layout.bias(l);
    for (uint64_t i = b.offset; i < b.offset + b.size(); ++i) {
      ASSERT_EQ(values[i], 0.0f) << "index " << i;
    }
  }
}

TEST(InitialValueTest, IsTheSameWhicheverShardComputesIt) {
  const ModelLayout layout({6, 5, 3});
  std::vector<float> whole(layout.num_params());
  InitialValues(layout, /*seed=*/7, 0, absl::MakeSpan(whole));
  for (int shards = 1; shards <= 5; ++shards) {
    std::vector<float> joined;
    for (int s = 0; s < shards; ++s) {
      const ShardRange range = ShardRangeFor(layout.num_params(), shards, s);
      std::vector<float> part(range.size());
      InitialValues(layout, 7, range.begin, absl::MakeSpan(part));
      joined.insert(joined.end(), part.begin(), part.end());
    }
    EXPECT_EQ(joined, whole) << shards << " shards";
  }
  for (uint64_t i = 0; i < layout.num_params(); ++i) {
    EXPECT_EQ(InitialValue(layout, 7, i), whole[i]) << "index " << i;
  }
}

TEST(InitialValueTest, DependsOnTheSeed) {
  const ModelLayout layout({6, 5, 3});
  std::vector<float> a(layout.num_params()), b(layout.num_params()),
      a_again(layout.num_params());
  InitialValues(layout, 1, 0, absl::MakeSpan(a));
  InitialValues(layout, 2, 0, absl::MakeSpan(b));
  InitialValues(layout, 1, 0, absl::MakeSpan(a_again));
  EXPECT_EQ(a, a_again);
  EXPECT_NE(a, b);
}

TEST(SplitMix64Test, MatchesTheReferenceSequence) {
  // The reference generator's first outputs from state 0: each output is
  // SplitMix64 of the previous state, the state advancing by the golden
  // gamma 0x9e3779b97f4a7c15.
  EXPECT_EQ(SplitMix64(0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(SplitMix64(0x9e3779b97f4a7c15ull), 0x6e789e6aa1b965f4ull);
}

TEST(UniformValuesTest, RepeatableAndWithinScale) {
  const std::vector<float> a = UniformValues(10000, 7, 2.0f);
  EXPECT_EQ(a, UniformValues(10000, 7, 2.0f));
  EXPECT_NE(a, UniformValues(10000, 8, 2.0f));
  double sum = 0;
  for (float v : a) {
    ASSERT_GE(v, -2.0f);
    ASSERT_LT(v, 2.0f);
    sum += v;
  }
  EXPECT_NEAR(sum / a.size(), 0.0, 0.05);
  // The scale only stretches the same draws.
  const std::vector<float> unit = UniformValues(10000, 7);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], 2.0f * unit[i]);
}

}  // namespace
}  // namespace monsoon::common
