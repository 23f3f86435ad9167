#include "worker/backend_factory.h"

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace monsoon::worker {
namespace {

using ::monsoon::testutil::StatusIs;
using ::testing::HasSubstr;

TEST(MakeBackendTest, CpuGivesTheCpuBackend) {
  absl::StatusOr<std::unique_ptr<ComputeBackend>> backend =
      MakeBackend("cpu", 1);
  ASSERT_OK(backend.status());
  EXPECT_THAT((*backend)->Name(), HasSubstr("cpu"));
}

TEST(MakeBackendTest, AutoGivesTheCpuWhereNoGpuIsUsableAndSaysWhy) {
  std::string why_no_gpu;
  absl::StatusOr<std::unique_ptr<ComputeBackend>> backend =
      MakeBackend("auto", 1, &why_no_gpu);
  ASSERT_OK(backend.status());
  if (absl::StartsWith((*backend)->Name(), "cuda")) {
    GTEST_SKIP() << "a GPU is usable here: " << (*backend)->Name();
  }
  EXPECT_THAT((*backend)->Name(), HasSubstr("cpu"));
  // Either "this build has no CUDA backend ..." or "no usable GPU: ...".
  EXPECT_FALSE(why_no_gpu.empty());
}

TEST(MakeBackendTest, CudaWithoutACudaBuildIsFailedPrecondition) {
  if (BuiltWithCuda()) GTEST_SKIP() << "built with --config=cuda";
  EXPECT_THAT(MakeBackend("cuda", 1),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("--device=cpu")));
}

TEST(MakeBackendTest, UnknownDeviceIsInvalidArgument) {
  EXPECT_THAT(MakeBackend("tpu", 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'tpu'")));
}

}  // namespace
}  // namespace monsoon::worker
