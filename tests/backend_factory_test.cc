#include "worker/backend_factory.h"

#include <memory>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace monsoon::worker {
namespace {

using ::monsoon::testutil::StatusIs;
using ::testing::HasSubstr;

TEST(MakeBackendTest, CpuAndAutoGiveTheCpuBackend) {
  for (const char* device : {"cpu", "auto"}) {
    SCOPED_TRACE(device);
    absl::StatusOr<std::unique_ptr<ComputeBackend>> backend =
        MakeBackend(device, 1);
    ASSERT_OK(backend.status());
    EXPECT_THAT((*backend)->Name(), HasSubstr("cpu"));
  }
}

TEST(MakeBackendTest, CudaWithoutACudaBuildIsFailedPrecondition) {
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
