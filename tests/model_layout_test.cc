#include "common/model_layout.h"

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"
#include "tests/status_matchers.h"

namespace monsoon::common {
namespace {

using ::monsoon::testutil::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

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
  EXPECT_EQ(layout.Describe(), "dense 256, relu, dense 128, relu, dense 10");
  EXPECT_EQ(layout.num_classes(), 10);
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
  EXPECT_EQ(layout.layers()[2].weights, 2);
  EXPECT_EQ(layout.layers()[4].bias, 5);
  EXPECT_EQ(layout.layers()[1].weights, -1);  // a ReLU has none
  EXPECT_EQ(layout.tensors()[5].offset + layout.tensors()[5].size(),
            layout.num_params());
  EXPECT_EQ(layout.ForwardFlops(), 2u * (784 * 256 + 256 * 128 + 128 * 10));
}

// The layers of a text-format config's `layers`.
std::vector<Layer> Layers(const std::string& text) {
  TrainingConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &config));
  return {config.layers().begin(), config.layers().end()};
}

absl::StatusOr<ModelLayout> Create(const Shape& input,
                                   const std::vector<Layer>& layers) {
  std::vector<const Layer*> pointers;
  for (const Layer& layer : layers) pointers.push_back(&layer);
  return ModelLayout::Create(input, pointers);
}

TEST(ModelLayoutTest, ConvAndPoolingShapesFollowTheirDefinitions) {
  ASSERT_OK_AND_ASSIGN(
      ModelLayout layout,
      Create({9, 7, 3},
             Layers("layers { conv { filters: 4 kernel: 3 stride: 2 padding: "
                    "1 } } layers { max_pool { size: 3 stride: 1 } } "
                    "layers { flatten {} } layers { dense { units: 5 } }")));
  ASSERT_EQ(layout.layers().size(), 3u);  // the flatten is no layer
  // (9 + 2 - 3) / 2 + 1 = 5, (7 + 2 - 3) / 2 + 1 = 4; then 3 and 2.
  EXPECT_EQ(layout.layers()[0].out, (Shape{5, 4, 4}));
  EXPECT_EQ(layout.layers()[1].out, (Shape{3, 2, 4}));
  EXPECT_EQ(layout.layers()[2].in, (Shape{3, 2, 4}));
  ASSERT_EQ(layout.tensors().size(), 4u);
  // Conv weights: a row per filter of fan-in 3 * 3 * 3; dense weights a
  // row per input.
  EXPECT_EQ(layout.tensors()[0].name, "layer0/weights");
  EXPECT_EQ(layout.tensors()[0].rows, 4u);
  EXPECT_EQ(layout.tensors()[0].cols, 27u);
  EXPECT_EQ(layout.tensors()[0].fan_in, 27u);
  EXPECT_EQ(layout.tensors()[1].offset, 108u);
  EXPECT_EQ(layout.tensors()[2].name, "layer1/weights");
  EXPECT_EQ(layout.tensors()[2].offset, 112u);
  EXPECT_EQ(layout.tensors()[2].rows, 24u);
  EXPECT_EQ(layout.tensors()[2].fan_in, 24u);
  EXPECT_EQ(layout.tensors()[3].fan_in, 0u);  // a bias
  EXPECT_EQ(layout.num_params(), 108u + 4 + 24 * 5 + 5);
  EXPECT_EQ(layout.ForwardFlops(), 2u * (5 * 4 * 27 * 4 + 24 * 5));
  // The patches: 5 * 4 positions of 27 values.
  EXPECT_EQ(layout.LargestBufferPerExample(), 540u);
  EXPECT_EQ(layout.Describe(),
            "conv 3x3x4 stride 2 pad 1, max_pool 3 stride 1, dense 5");
}

TEST(ModelLayoutTest, LayersThatDoNotFitAreRefusedNamingTheLayer) {
  struct Case {
    Shape input;
    const char* layers;
    const char* message;
  };
  const Case cases[] = {
      {{4, 4, 1},
       "layers { conv { filters: 2 kernel: 5 } }",
       "layer 1 (conv 5x5x2): its input is 4x4x1, smaller than the kernel"},
      {{8, 8, 1},
       "layers { max_pool { size: 2 } } layers { max_pool { size: 2 } } "
       "layers { max_pool { size: 2 } } layers { max_pool { size: 2 } }",
       "layer 4 (max_pool 2): its input is 1x1x1, smaller than the window"},
      {{8, 8, 1}, "layers { conv { kernel: 3 } }", "filters must be"},
      {{8, 8, 1},
       "layers { conv { filters: 1 kernel: 3 padding: 3 } }",
       "padding must be from 0 to kernel - 1"},
      {{8, 8, 1}, "layers { conv { filters: 1 stride: 0 } }", "stride"},
      {{8, 8, 1}, "layers { dense {} }", "units must be"},
      {{8, 8, 1}, "layers { }", "layer 1 (empty)"},
      {{1 << 12, 1 << 12, 2}, "layers { relu {} }", "input shape"},
      {{1 << 10, 1 << 10, 1},
       "layers { dense { units: 4096 } }",
       "weights are too many"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(
        Create(c.input, Layers(c.layers)),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.layers;
  }
}

TEST(ModelLayoutTest, FromConfigUsesTheConfigsLayerSizes) {
  TrainingConfig config;
  for (int size : {6, 5, 3}) config.add_layer_sizes(size);
  const ModelLayout layout = ModelLayout::FromConfig(config);
  EXPECT_EQ(layout.input(), (Shape{1, 1, 6}));
  EXPECT_EQ(layout.Describe(), "dense 5, relu, dense 3");
  EXPECT_EQ(layout.num_params(), 6u * 5 + 5 + 5 * 3 + 3);
}

TEST(ModelLayoutTest, FromConfigUsesTheConfigsLayersAndInputShape) {
  TrainingConfig config;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      "layers { conv { filters: 2 kernel: 3 } } layers { dense { units: 3 } } "
      "input_shape: [5, 5, 1]",
      &config));
  const ModelLayout layout = ModelLayout::FromConfig(config);
  EXPECT_EQ(layout.Describe(), "conv 3x3x2, dense 3");
  EXPECT_EQ(layout.num_params(), 9u * 2 + 2 + 18 * 3 + 3);
  // A config that did not resolve has no layout rather than a wrong one.
  config.clear_input_shape();
  EXPECT_EQ(ModelLayout::FromConfig(config).num_params(), 0u);
}

TEST(InitialValueTest, BiasesAreZeroAndWeightsWithinHeUniformLimits) {
  const ModelLayout layout({784, 256, 128, 10});
  std::vector<float> values(layout.num_params());
  InitialValues(layout, /*seed=*/1, 0, absl::MakeSpan(values));
  for (const LayerSpec& layer : layout.layers()) {
    if (layer.weights < 0) continue;
    const TensorSpec& w = layout.tensors()[layer.weights];
    const float limit = static_cast<float>(std::sqrt(6.0 / w.fan_in));
    float lowest = 0, highest = 0;
    for (uint64_t i = w.offset; i < w.offset + w.size(); ++i) {
      ASSERT_LE(std::abs(values[i]), limit) << "index " << i;
      lowest = std::min(lowest, values[i]);
      highest = std::max(highest, values[i]);
    }
    // The values fill the range rather than collapsing near 0.
    EXPECT_LT(lowest, -0.9f * limit) << w.name;
    EXPECT_GT(highest, 0.9f * limit) << w.name;
    const TensorSpec& b = layout.tensors()[layer.bias];
    for (uint64_t i = b.offset; i < b.offset + b.size(); ++i) {
      ASSERT_EQ(values[i], 0.0f) << "index " << i;
    }
  }
}

TEST(InitialValueTest, OutputInitZeroZeroesTheOutputLayersWeightsOnly) {
  TrainingConfig he;
  he.add_layer_sizes(6);
  he.add_layer_sizes(5);
  he.add_layer_sizes(3);
  TrainingConfig zero = he;
  zero.set_output_init(ZERO);
  const ModelLayout he_layout = ModelLayout::FromConfig(he);
  const ModelLayout zero_layout = ModelLayout::FromConfig(zero);
  ASSERT_EQ(zero_layout.num_params(), 6 * 5 + 5 + 5 * 3 + 3);
  std::vector<float> he_values(he_layout.num_params());
  std::vector<float> zero_values(zero_layout.num_params());
  InitialValues(he_layout, /*seed=*/3, 0, absl::MakeSpan(he_values));
  InitialValues(zero_layout, /*seed=*/3, 0, absl::MakeSpan(zero_values));
  // layer0/weights (30) and layer0/bias (5) as with He; layer1/weights
  // (15) zero where He's are not; layer1/bias zero either way.
  for (int i = 0; i < 35; ++i) EXPECT_EQ(zero_values[i], he_values[i]) << i;
  for (int i = 35; i < 50; ++i) {
    EXPECT_EQ(zero_values[i], 0.0f) << i;
    EXPECT_NE(he_values[i], 0.0f) << i;
  }
  for (int i = 50; i < 53; ++i) EXPECT_EQ(zero_values[i], 0.0f) << i;
  EXPECT_TRUE(zero_layout.tensors()[2].starts_at_zero);
  EXPECT_FALSE(zero_layout.tensors()[0].starts_at_zero);
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

TEST(ModelLayoutTest, ExternalTensorsAreLaidOutInOrder) {
  TrainingConfig config;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      "tensors { name: 'conv.weight' dims: [6, 1, 5, 5] } "
      "tensors { name: 'conv.bias' dims: 6 } tensors { name: 'scale' }",
      &config));
  const ModelLayout layout = ModelLayout::FromConfig(config);
  EXPECT_TRUE(layout.layers().empty());
  ASSERT_EQ(layout.tensors().size(), 3u);
  EXPECT_EQ(layout.tensors()[0].rows, 6u);
  EXPECT_EQ(layout.tensors()[0].cols, 25u);
  EXPECT_EQ(layout.tensors()[0].fan_in, 25u);  // He's bound for weights
  EXPECT_EQ(layout.tensors()[1].offset, 150u);
  EXPECT_EQ(layout.tensors()[1].fan_in, 0u);  // a bias starts at 0
  EXPECT_EQ(layout.tensors()[2].offset, 156u);
  EXPECT_EQ(layout.tensors()[2].size(), 1u);  // a scalar
  EXPECT_EQ(layout.num_params(), 157u);
}

TEST(ReadInitialWeightsTest, ReadsAShardsSliceAndRefusesDamage) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::vector<float> values = {1, 2, 3, 4, 5};
  {
    std::ofstream out(dir + "/w", std::ios::binary);
    out.write(reinterpret_cast<const char*>(values.data()), 20);
  }
  EXPECT_THAT(ReadInitialWeights(dir + "/w", 5, ShardRangeFor(5, 2, 1)),
              testutil::IsOkAndHolds(ElementsAre(3, 4, 5)));
  EXPECT_THAT(ReadInitialWeights(dir + "/w", 6, ShardRangeFor(6, 1, 0)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("holds 20 bytes, but the model's 6 "
                                 "parameters need 24")));
  EXPECT_THAT(ReadInitialWeights(dir + "/none", 5, ShardRangeFor(5, 1, 0)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cannot be read")));
  const float nan = std::nanf("");
  {
    std::ofstream out(dir + "/nan", std::ios::binary);
    out.write(reinterpret_cast<const char*>(&nan), 4);
  }
  EXPECT_THAT(ReadInitialWeights(dir + "/nan", 1, ShardRangeFor(1, 1, 0)),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("parameter 0 is nan")));
}

}  // namespace
}  // namespace monsoon::common
