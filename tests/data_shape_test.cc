#include "common/data_shape.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/idx_reader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace monsoon::common {
namespace {

using ::monsoon::testutil::FreshDir;
using ::monsoon::testutil::IdxBytes;
using ::monsoon::testutil::StatusIs;
using ::monsoon::testutil::TempPath;
using ::monsoon::testutil::WriteFile;
using ::monsoon::testutil::WriteGzipFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ExampleShapeFromIdxDimsTest, ReadsHeightWidthAndChannels) {
  EXPECT_EQ(*ExampleShapeFromIdxDims({60000, 28, 28}), (Shape{28, 28, 1}));
  EXPECT_EQ(*ExampleShapeFromIdxDims({10, 32, 30, 3}), (Shape{32, 30, 3}));
  EXPECT_EQ(*ExampleShapeFromIdxDims({10, 17}), (Shape{1, 17, 1}));
  EXPECT_THAT(
      ExampleShapeFromIdxDims({10}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 dimensions")));
  EXPECT_THAT(ExampleShapeFromIdxDims({10, 0, 3}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("dimension 1 is 0")));
}

TEST(ReadIdxDimsTest, ReadsOnlyTheHeaderOfAGzipFile) {
  const std::string dir = FreshDir("dims");
  // A header that promises more data than the file has: only the header
  // is read, so this is not noticed here (ReadIdxFile would refuse it).
  WriteGzipFile(dir + "/short.gz", IdxBytes({1000, 9, 7}, {1, 2, 3}));
  EXPECT_THAT(ReadIdxDims(dir + "/short.gz"),
              testutil::IsOkAndHolds(ElementsAre(1000, 9, 7)));
  WriteFile(dir + "/bad", "not idx");
  EXPECT_THAT(ReadIdxDims(dir + "/bad"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("two zero bytes")));
  EXPECT_THAT(ReadIdxDims(dir + "/absent"),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(ReadDataShapeTest, TakesTheShapeFromTheImagesAndClassesFromTheLabels) {
  const std::string dir = FreshDir("shape");
  WriteGzipFile(dir + "/train-images-idx3-ubyte.gz",
                IdxBytes({4, 5, 3}, std::vector<uint8_t>(60, 1)));
  WriteFile(dir + "/train-labels-idx1-ubyte", IdxBytes({4}, {0, 6, 2, 2}));
  ASSERT_OK_AND_ASSIGN(DataShape shape, ReadDataShape(dir));
  EXPECT_EQ(shape.example, (Shape{5, 3, 1}));
  EXPECT_EQ(shape.num_classes, 7);
}

TEST(ReadDataShapeTest, DamagedOrMismatchedFilesAreRefusedNamingThem) {
  const std::string dir = FreshDir("damaged");
  EXPECT_THAT(ReadDataShape(dir),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("train-images-idx3-ubyte[.gz]' not found")));
  WriteFile(dir + "/train-images-idx3-ubyte",
            IdxBytes({3, 2, 2}, std::vector<uint8_t>(12, 1)));
  WriteFile(dir + "/train-labels-idx1-ubyte", IdxBytes({2}, {0, 1}));
  EXPECT_THAT(ReadDataShape(dir), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("has 3 images but")));
  WriteFile(dir + "/train-labels-idx1-ubyte", IdxBytes({3}, {0, 0, 0}));
  EXPECT_THAT(ReadDataShape(dir), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("at least 2 classes")));
  WriteFile(dir + "/train-labels-idx1-ubyte", IdxBytes({3}, {0, 1}));
  EXPECT_THAT(ReadDataShape(dir), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("truncated")));
}

}  // namespace
}  // namespace monsoon::common
