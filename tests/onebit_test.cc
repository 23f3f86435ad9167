#include "common/onebit.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace monsoon::common {
namespace {

using ::monsoon::testutil::IsOk;
using ::monsoon::testutil::StatusIs;

std::vector<float> Scales(const OneBitEncoded& encoded) {
  std::vector<float> scales(encoded.scales.size() / sizeof(float));
  std::memcpy(scales.data(), encoded.scales.data(), encoded.scales.size());
  return scales;
}

TEST(OneBitTest, EncodesSignBitsAndSideMeansPerBucket) {
  // Bucket 0: {1, -2, 3, -4} -> negatives mean -3, non-negatives mean 2.
  // Bucket 1: {0.5, 0.5} -> no negatives (scale 0), non-negatives 0.5.
  const std::vector<float> gradient = {1, -2, 3, -4, 0.5f, 0.5f};
  std::vector<float> residual(6, 0.0f);
  OneBitEncoded encoded;
  OneBitEncode(gradient, absl::MakeSpan(residual), 4, &encoded);

  ASSERT_EQ(encoded.bits.size(), 2u);  // one byte per bucket
  EXPECT_EQ(static_cast<uint8_t>(encoded.bits[0]), 0b0101);
  EXPECT_EQ(static_cast<uint8_t>(encoded.bits[1]), 0b11);
  EXPECT_THAT(Scales(encoded), ::testing::ElementsAre(-3, 2, 0, 0.5f));
  EXPECT_THAT(residual, ::testing::ElementsAre(-1, 1, 1, -1, 0, 0));

  std::vector<float> decoded(6);
  ASSERT_THAT(
      OneBitDecode(encoded.bits, encoded.scales, 4, absl::MakeSpan(decoded)),
      IsOk());
  EXPECT_THAT(decoded, ::testing::ElementsAre(2, -3, 2, -3, 0.5f, 0.5f));
}

TEST(OneBitTest, ResidualIsAddedBeforeQuantizing) {
  const std::vector<float> gradient = {1, -2, 3, -4};
  std::vector<float> residual = {-1, 1, 1, -1};  // from the test above
  OneBitEncoded encoded;
  OneBitEncode(gradient, absl::MakeSpan(residual), 4, &encoded);
  // v = {0, -1, 4, -5}: negatives {-1, -5} mean -3; non-negatives {0, 4} 2.
  EXPECT_THAT(Scales(encoded), ::testing::ElementsAre(-3, 2));
  EXPECT_EQ(static_cast<uint8_t>(encoded.bits[0]), 0b0101);
  EXPECT_THAT(residual, ::testing::ElementsAre(-2, 2, 2, -2));
}

TEST(OneBitTest, DecodedPlusNewResidualEqualsGradientPlusOldResidual) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int n = 1000;  // not a multiple of the bucket: a short last bucket
  const int bucket = 64;
  std::vector<float> residual(n, 0.0f), gradient(n), decoded(n);
  float worst_residual = 0;
  for (int step = 0; step < 200; ++step) {
    for (float& g : gradient) g = normal(rng);
    const std::vector<float> old_residual = residual;
    OneBitEncoded encoded;
    OneBitEncode(gradient, absl::MakeSpan(residual), bucket, &encoded);
    ASSERT_EQ(encoded.bits.size(), OneBitBitsBytes(n, bucket));
    ASSERT_EQ(encoded.scales.size(), OneBitBuckets(n, bucket) * 8);
    ASSERT_THAT(OneBitDecode(encoded.bits, encoded.scales, bucket,
                             absl::MakeSpan(decoded)),
                IsOk());
    for (int i = 0; i < n; ++i) {
      // Exact up to the rounding of one float addition and subtraction.
      EXPECT_NEAR(decoded[i] + residual[i], gradient[i] + old_residual[i],
                  1e-5f * (1 + std::fabs(gradient[i] + old_residual[i])))
          << "step " << step << " index " << i;
      worst_residual = std::max(worst_residual, std::fabs(residual[i]));
    }
  }
  // Error feedback keeps the residual bounded rather than drifting: with
  // unit-variance gradients it stays within a few standard deviations.
  EXPECT_LT(worst_residual, 10.0f);
}

// The codec's definition written plainly, one value at a time: per bucket,
// each side's mean in double precision, then the bits and the loss.
void ReferenceEncode(const std::vector<float>& gradient,
                     std::vector<float>* residual, int bucket,
                     OneBitEncoded* out) {
  const size_t n = gradient.size();
  for (size_t begin = 0; begin < n; begin += bucket) {
    const size_t end = std::min(n, begin + bucket);
    double sums[2] = {0, 0};
    int64_t counts[2] = {0, 0};
    for (size_t i = begin; i < end; ++i) {
      const float v = gradient[i] + (*residual)[i];
      (*residual)[i] = v;
      sums[v >= 0 ? 1 : 0] += v;
      ++counts[v >= 0 ? 1 : 0];
    }
    float scales[2];
    for (int side = 0; side < 2; ++side) {
      scales[side] =
          counts[side] > 0 ? static_cast<float>(sums[side] / counts[side]) : 0;
    }
    std::string bits((end - begin + 7) / 8, '\0');
    for (size_t i = begin; i < end; ++i) {
      const float v = (*residual)[i];
      const int side = v >= 0 ? 1 : 0;
      if (side == 1)
        bits[(i - begin) / 8] |= static_cast<char>(1 << ((i - begin) % 8));
      (*residual)[i] = v - scales[side];
    }
    out->bits += bits;
    out->scales.append(reinterpret_cast<const char*>(scales), sizeof(scales));
  }
}

TEST(OneBitTest, EncoderMatchesThePlainDefinitionBitForBit) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int bucket : {1, 5, 8, 13, 64, 512}) {
    for (int n : {0, 1, 7, 8, 9, 100, 1031}) {
      SCOPED_TRACE(testing::Message() << "bucket " << bucket << " n " << n);
      std::vector<float> gradient(n), residual(n), expected_residual(n);
      for (int i = 0; i < n; ++i) {
        // Zeros and negative zeros too, which sit on the sign boundary.
        gradient[i] = i % 17 == 0 ? 0.0f : i % 19 == 0 ? -0.0f : normal(rng);
        residual[i] = expected_residual[i] = i % 3 == 0 ? 0.0f : normal(rng);
      }
      for (int step = 0; step < 3; ++step) {
        OneBitEncoded encoded, expected;
        OneBitEncode(gradient, absl::MakeSpan(residual), bucket, &encoded);
        ReferenceEncode(gradient, &expected_residual, bucket, &expected);
        ASSERT_EQ(encoded.bits, expected.bits);
        ASSERT_EQ(encoded.scales, expected.scales);
        ASSERT_EQ(0, std::memcmp(residual.data(), expected_residual.data(),
                                 n * sizeof(float)));
      }
    }
  }
}

TEST(OneBitTest, EncoderMatchesThePlainDefinitionOnAnyMagnitudes) {
  // Buckets whose values span many orders of magnitude (where the sides'
  // double sums round, so only their order of summation defines them),
  // denormals, huge values, and buckets of one magnitude (sums exact).
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-149, 127);
  for (int bucket : {7, 8, 64, 512}) {
    for (int kind = 0; kind < 4; ++kind) {
      SCOPED_TRACE(testing::Message()
                   << "bucket " << bucket << " kind " << kind);
      const int n = 3 * bucket + 5;
      std::vector<float> gradient(n), residual(n, 0.0f);
      for (int i = 0; i < n; ++i) {
        const float u = unit(rng);
        switch (kind) {
          case 0:  // every magnitude a float has
            gradient[i] = std::ldexp(u, exponent(rng));
            break;
          case 1:  // denormals and zeros
            gradient[i] = i % 5 == 0 ? 0.0f : u * 1e-40f;
            break;
          case 2:  // 1e30 with 1s: sums that round in double
            gradient[i] = i % 3 == 0 ? 1e30f * u : u;
            break;
          default:  // one magnitude
            gradient[i] = 0.001f * u;
        }
      }
      std::vector<float> expected_residual = residual;
      for (int step = 0; step < 2; ++step) {
        OneBitEncoded encoded, expected;
        OneBitEncode(gradient, absl::MakeSpan(residual), bucket, &encoded);
        ReferenceEncode(gradient, &expected_residual, bucket, &expected);
        ASSERT_EQ(encoded.bits, expected.bits);
        ASSERT_EQ(encoded.scales, expected.scales);
        ASSERT_EQ(0, std::memcmp(residual.data(), expected_residual.data(),
                                 n * sizeof(float)));
      }
    }
  }
}

TEST(OneBitTest, WireSizeIsOneBitPerValuePlusTwoFloatsPerBucket) {
  EXPECT_EQ(OneBitBitsBytes(1024, 512), 128u);
  EXPECT_EQ(OneBitBuckets(1024, 512), 2u);
  EXPECT_EQ(OneBitBitsBytes(1025, 512), 129u);  // a 1-value last bucket
  EXPECT_EQ(OneBitBitsBytes(10, 3), 4u);        // buckets of 3, 3, 3, 1
  std::vector<float> gradient(1025, 1.0f), residual(1025, 0.0f);
  OneBitEncoded encoded;
  OneBitEncode(gradient, absl::MakeSpan(residual), 512, &encoded);
  EXPECT_EQ(encoded.bits.size(), 129u);
  EXPECT_EQ(encoded.scales.size(), 3u * 2 * sizeof(float));
}

TEST(OneBitTest, DecodeRefusesWrongBitLength) {
  std::vector<float> out(16);
  const std::string scales(2 * 8, '\0');
  EXPECT_THAT(
      OneBitDecode(std::string(3, '\0'), scales, 8, absl::MakeSpan(out)),
      StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(OneBitTest, DecodeRefusesWrongBucketCount) {
  std::vector<float> out(16);
  EXPECT_THAT(OneBitDecode(std::string(2, '\0'), std::string(3 * 8, '\0'), 8,
                           absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(OneBitTest, DecodeRefusesNonFiniteScales) {
  std::vector<float> out(8);
  for (float bad : {std::nanf(""), INFINITY}) {
    float pair[2] = {-1.0f, bad};
    std::string scales(reinterpret_cast<const char*>(pair), sizeof(pair));
    EXPECT_THAT(
        OneBitDecode(std::string(1, '\xff'), scales, 8, absl::MakeSpan(out)),
        StatusIs(absl::StatusCode::kInvalidArgument));
  }
}

}  // namespace
}  // namespace monsoon::common
