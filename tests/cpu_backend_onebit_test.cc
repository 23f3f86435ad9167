// The CPU backend's 1-bit codec operations (ComputeBackend::OneBitEncode and
// OneBitDecode) against common/onebit, which defines the wire format: they
// must agree bit for bit. Also the defaults a backend without a codec gets.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/model_layout.h"
#include "common/onebit.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "worker/compute_backend.h"
#include "worker/cpu_backend.h"

namespace monsoon::worker {
namespace {

using ::monsoon::testutil::StatusIs;

// Uniform in [-scale, scale) with exact zeros and -0 sprinkled in, and a
// first bucket of up to 64 values with no negative one.
std::vector<float> CodecInput(size_t n, uint64_t seed, float scale) {
  std::vector<float> v = common::UniformValues(n, seed, scale);
  for (size_t i = 0; i < n; i += 97) v[i] = 0.0f;
  for (size_t i = 50; i < n; i += 101) v[i] = -0.0f;
  for (size_t i = 0; i < std::min<size_t>(n, 64); ++i) v[i] = std::abs(v[i]);
  return v;
}

// Bitwise equality, so that -0 and 0 (and NaN payloads) count.
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(CpuBackendOneBitTest, EncodeMatchesTheCodecBitForBit) {
  std::unique_ptr<ComputeBackend> backend = MakeCpuBackend(1);
  for (size_t n : {size_t{1}, size_t{8}, size_t{5003}}) {
    for (int bucket : {512, 10, 1, 7, 8, 64, 8192}) {
      SCOPED_TRACE(absl::StrCat("n ", n, ", bucket ", bucket));
      const size_t buckets = common::OneBitBuckets(n, bucket);
      std::vector<float> residual = CodecInput(n, bucket + 1, 0.001f);
      std::vector<float> want_residual = residual;
      // Canaries past the ends: nothing may be written there.
      std::vector<uint8_t> bits(common::OneBitBitsBytes(n, bucket) + 1, 0xa5);
      std::vector<float> scales(2 * buckets + 1, 7.0f);
      for (int round = 0; round < 2; ++round) {
        SCOPED_TRACE(absl::StrCat("round ", round));
        const std::vector<float> grad =
            CodecInput(n, 10 * bucket + round, 0.01f);
        ASSERT_OK(backend->OneBitEncode(grad.data(), residual.data(), n, bucket,
                                        bits.data(), scales.data()));
        common::OneBitEncoded want;
        common::OneBitEncode(grad, absl::MakeSpan(want_residual), bucket,
                             &want);
        EXPECT_EQ(std::string(bits.begin(), bits.end() - 1), want.bits);
        EXPECT_EQ(bits.back(), 0xa5);
        std::vector<float> want_scales(2 * buckets);
        std::memcpy(want_scales.data(), want.scales.data(), want.scales.size());
        EXPECT_TRUE(SameBits(
            std::vector<float>(scales.begin(), scales.end() - 1), want_scales));
        EXPECT_EQ(scales.back(), 7.0f);
        EXPECT_TRUE(SameBits(residual, want_residual));
      }
    }
  }
}

TEST(CpuBackendOneBitTest, DecodeMatchesTheCodecBitForBit) {
  std::unique_ptr<ComputeBackend> backend = MakeCpuBackend(1);
  constexpr size_t kN = 5003;
  for (int bucket : {512, 10, 1, 7, 8192}) {
    SCOPED_TRACE(absl::StrCat("bucket ", bucket));
    std::vector<float> residual(kN, 0.0f);
    common::OneBitEncoded encoded;
    common::OneBitEncode(CodecInput(kN, bucket, 0.01f),
                         absl::MakeSpan(residual), bucket, &encoded);
    std::vector<float> want(kN);
    ASSERT_OK(common::OneBitDecode(encoded.bits, encoded.scales, bucket,
                                   absl::MakeSpan(want)));
    std::vector<float> scales(encoded.scales.size() / sizeof(float));
    std::memcpy(scales.data(), encoded.scales.data(), encoded.scales.size());
    std::vector<float> got(kN, 123.0f);
    ASSERT_OK(backend->OneBitDecode(
        reinterpret_cast<const uint8_t*>(encoded.bits.data()), scales.data(),
        kN, bucket, got.data()));
    EXPECT_TRUE(SameBits(got, want));
  }
}

TEST(CpuBackendOneBitTest, DecodeOfEncodePlusResidualGivesBackTheInput) {
  // decoded + new residual == gradient + old residual, up to rounding.
  std::unique_ptr<ComputeBackend> backend = MakeCpuBackend(1);
  constexpr size_t kN = 1000;
  constexpr int kBucket = 64;
  const std::vector<float> grad = CodecInput(kN, 3, 1.0f);
  std::vector<float> residual = CodecInput(kN, 4, 0.1f);
  const std::vector<float> old_residual = residual;
  std::vector<uint8_t> bits(common::OneBitBitsBytes(kN, kBucket));
  std::vector<float> scales(2 * common::OneBitBuckets(kN, kBucket));
  ASSERT_OK(backend->OneBitEncode(grad.data(), residual.data(), kN, kBucket,
                                  bits.data(), scales.data()));
  std::vector<float> decoded(kN);
  ASSERT_OK(backend->OneBitDecode(bits.data(), scales.data(), kN, kBucket,
                                  decoded.data()));
  for (size_t i = 0; i < kN; ++i) {
    EXPECT_NEAR(decoded[i] + residual[i], grad[i] + old_residual[i], 1e-6) << i;
  }
}

TEST(CpuBackendOneBitTest, ABadBucketSizeIsInvalidArgument) {
  std::unique_ptr<ComputeBackend> backend = MakeCpuBackend(1);
  std::vector<float> f(8, 1.0f);
  std::vector<uint8_t> bits(8);
  EXPECT_THAT(backend->OneBitEncode(f.data(), f.data() + 4, 4, 0, bits.data(),
                                    f.data()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       testing::HasSubstr("bucket size")));
  EXPECT_THAT(backend->OneBitDecode(bits.data(), f.data(), 4, -3, f.data() + 4),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(CpuBackendOneBitTest, AllocatedBytesHoldAPayload) {
  std::unique_ptr<ComputeBackend> backend = MakeCpuBackend(1);
  ASSERT_OK_AND_ASSIGN(uint8_t * bytes, backend->AllocateBytes(13));
  const std::string in = "thirteen byte";
  ASSERT_OK(backend->CopyToDevice(in.data(), bytes, 13));
  std::string out(13, '\0');
  ASSERT_OK(backend->CopyToHost(bytes, out.data(), 13));
  EXPECT_EQ(out, in);
  backend->Free(bytes);
}

// A backend with only the required operations: AllocateBytes comes from
// AllocateInts, and its memory is not the host's.
class MinimalBackend : public ComputeBackend {
 public:
  std::string Name() const override { return "minimal"; }
  absl::StatusOr<float*> AllocateFloats(size_t n) override {
    return absl::UnimplementedError("floats");
  }
  absl::StatusOr<int32_t*> AllocateInts(size_t n) override {
    ints_.resize((n + 1) * 2);
    requested_ints_ = n;
    return ints_.data();
  }
  void Free(void*) override {}
  absl::Status CopyToDevice(const void*, void*, size_t) override {
    return absl::OkStatus();
  }
  absl::Status CopyToHost(const void*, void*, size_t) override {
    return absl::OkStatus();
  }
  void Gemm(bool, bool, int, int, int, float, const float*, const float*, float,
            float*) override {}
  void AddBias(int, int, const float*, float*) override {}
  void Relu(size_t, float*) override {}
  void ReluBackward(size_t, const float*, float*) override {}
  void ColumnSums(int, int, const float*, float*) override {}
  void SoftmaxCrossEntropy(int, int, const float*, const int32_t*, float*,
                           float*) override {}
  void Im2Col(const WindowGeometry&, int, const float*, float*) override {}
  void Col2Im(const WindowGeometry&, int, const float*, float*) override {}
  void MaxPool(const WindowGeometry&, int, const float*, float*,
               int32_t*) override {}
  void MaxPoolBackward(const WindowGeometry&, int, const float*, const int32_t*,
                       float*) override {}
  void Axpy(size_t, float, const float*, float*) override {}
  void Scale(size_t, float, float*) override {}
  void Fill(size_t, float, float*) override {}
  absl::Status OneBitEncode(const float*, float*, size_t, int, uint8_t*,
                            float*) override {
    return absl::OkStatus();
  }
  absl::Status OneBitDecode(const uint8_t*, const float*, size_t, int,
                            float*) override {
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

  std::vector<int32_t> ints_;
  size_t requested_ints_ = 0;
};

TEST(ComputeBackendDefaultsTest, AllocateBytesRoundsUpToWholeInts) {
  MinimalBackend backend;
  EXPECT_FALSE(backend.HostMemory());
  ASSERT_OK_AND_ASSIGN(uint8_t * bytes, backend.AllocateBytes(13));
  EXPECT_EQ(backend.requested_ints_, 4u);
  EXPECT_EQ(static_cast<void*>(bytes),
            static_cast<void*>(backend.ints_.data()));
}

}  // namespace
}  // namespace monsoon::worker
