#include "worker/dataset.h"

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace monsoon::worker {
namespace {

using ::monsoon::testutil::FreshDir;
using ::monsoon::testutil::IdxBytes;
using ::monsoon::testutil::StatusIs;
using ::monsoon::testutil::TempPath;
using ::monsoon::testutil::WriteFile;
using ::monsoon::testutil::WriteGzipFile;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// Three 2x2 training images (gzip) with plain labels, and two test images
// with gzip labels.
std::string MakeDataDir(const std::string& name) {
  const std::string dir = FreshDir(name);
  WriteGzipFile(dir + "/train-images-idx3-ubyte.gz",
                IdxBytes({3, 2, 2}, {0, 255, 51, 102, 1, 2, 3, 4, 5, 6, 7, 8}));
  WriteFile(dir + "/train-labels-idx1-ubyte", IdxBytes({3}, {2, 0, 1}));
  WriteFile(dir + "/t10k-images-idx3-ubyte",
            IdxBytes({2, 2, 2}, {255, 255, 255, 255, 0, 0, 0, 0}));
  WriteGzipFile(dir + "/t10k-labels-idx1-ubyte.gz", IdxBytes({2}, {1, 1}));
  return dir;
}

TEST(LoadIdxDatasetTest, LoadsTheTrainingSplitScaledToUnitRange) {
  const std::string dir = MakeDataDir("train");
  absl::StatusOr<Dataset> data = LoadIdxDataset(dir, Split::kTrain);
  ASSERT_OK(data.status());
  EXPECT_EQ(data->size, 3);
  EXPECT_EQ(data->dim, 4);
  ASSERT_EQ(data->images.size(), 12u);
  EXPECT_FLOAT_EQ(data->images[0], 0.0f);
  EXPECT_FLOAT_EQ(data->images[1], 1.0f);
  EXPECT_FLOAT_EQ(data->images[2], 0.2f);
  EXPECT_FLOAT_EQ(data->images[3], 0.4f);
  EXPECT_FLOAT_EQ(data->images[11], 8.0f / 255.0f);
  EXPECT_EQ(data->example(2), data->images.data() + 8);
  EXPECT_THAT(data->labels, ElementsAre(2, 0, 1));
}

TEST(LoadIdxDatasetTest, LoadsTheTestSplit) {
  const std::string dir = MakeDataDir("test");
  absl::StatusOr<Dataset> data = LoadIdxDataset(dir, Split::kTest);
  ASSERT_OK(data.status());
  EXPECT_EQ(data->size, 2);
  EXPECT_EQ(data->dim, 4);
  EXPECT_THAT(data->images, ElementsAre(1, 1, 1, 1, 0, 0, 0, 0));
  EXPECT_THAT(data->labels, ElementsAre(1, 1));
}

TEST(LoadIdxDatasetTest, MissingFashionMnistFolderNamesTheDebianPackage) {
  const std::string dir = TempPath("absent/fashion-mnist");
  EXPECT_THAT(LoadIdxDataset(dir, Split::kTrain),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr(dir + "/train-images-idx3-ubyte"),
                             HasSubstr("dataset-fashion-mnist"))));
}

TEST(LoadIdxDatasetTest, MissingOtherFolderSuggestsDataDir) {
  const std::string dir = TempPath("absent/other");
  EXPECT_THAT(LoadIdxDataset(dir, Split::kTest),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr(dir + "/t10k-images-idx3-ubyte"),
                             HasSubstr("data_dir"),
                             Not(HasSubstr("dataset-fashion-mnist")))));
}

TEST(LoadIdxDatasetTest, MissingLabelsFileIsNotFoundNamingIt) {
  const std::string dir = MakeDataDir("no-labels");
  std::filesystem::remove(dir + "/train-labels-idx1-ubyte");
  EXPECT_THAT(LoadIdxDataset(dir, Split::kTrain),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("train-labels-idx1-ubyte")));
}

TEST(LoadIdxDatasetTest, CorruptFileIsInvalidNamingIt) {
  const std::string dir = MakeDataDir("corrupt");
  WriteFile(dir + "/train-labels-idx1-ubyte", IdxBytes({3}, {2, 0}));
  EXPECT_THAT(LoadIdxDataset(dir, Split::kTrain),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(dir + "/train-labels-idx1-ubyte")));
}

TEST(LoadIdxDatasetTest, ImageAndLabelCountsMustAgree) {
  const std::string dir = MakeDataDir("counts");
  WriteFile(dir + "/train-labels-idx1-ubyte", IdxBytes({2}, {2, 0}));
  EXPECT_THAT(LoadIdxDataset(dir, Split::kTrain),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("has 3 images but")));
}

TEST(LoadIdxDatasetTest, LabelsMustHaveRankOne) {
  const std::string dir = MakeDataDir("rank");
  WriteFile(dir + "/train-labels-idx1-ubyte", IdxBytes({3, 1}, {2, 0, 1}));
  EXPECT_THAT(LoadIdxDataset(dir, Split::kTrain),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("labels (rank 1)")));
}

TEST(LoadDatasetForTest, LoadsTheConfigsDataDirAndChecksTheModel) {
  const std::string dir = MakeDataDir("for-config");
  TrainingConfig config;
  config.set_data_dir(dir);
  config.set_input_mean(0.0f);
  config.set_input_std(1.0f);
  for (int size : {4, 8, 3}) config.add_layer_sizes(size);
  absl::StatusOr<Dataset> data = LoadDatasetFor(config, Split::kTrain);
  ASSERT_OK(data.status());
  EXPECT_EQ(data->size, 3);
  EXPECT_FLOAT_EQ(data->images[1], 1.0f);
  EXPECT_THAT(data->labels, ElementsAre(2, 0, 1));

  config.set_layer_sizes(0, 5);
  EXPECT_THAT(LoadDatasetFor(config, Split::kTrain),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("4 values per example")));

  config.set_layer_sizes(0, 4);
  config.set_layer_sizes(2, 2);  // label 2 does not fit
  EXPECT_THAT(LoadDatasetFor(config, Split::kTrain),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("label 2 of example 0 is not one of the "
                                 "model's 2 classes")));
}

TEST(LoadDatasetForTest, StandardizesTheInputs) {
  const std::string dir = MakeDataDir("standardized");
  TrainingConfig config;
  config.set_data_dir(dir);
  config.set_input_mean(0.5f);
  config.set_input_std(0.25f);
  for (int size : {4, 3}) config.add_layer_sizes(size);
  absl::StatusOr<Dataset> data = LoadDatasetFor(config, Split::kTest);
  ASSERT_OK(data.status());
  // (1 - 0.5) / 0.25 = 2 and (0 - 0.5) / 0.25 = -2.
  EXPECT_THAT(data->images, ElementsAre(2, 2, 2, 2, -2, -2, -2, -2));
  // The defaults are Fashion-MNIST's statistics: (x - 0.286) / 0.353.
  TrainingConfig defaults;
  defaults.set_data_dir(dir);
  for (int size : {4, 3}) defaults.add_layer_sizes(size);
  data = LoadDatasetFor(defaults, Split::kTest);
  ASSERT_OK(data.status());
  EXPECT_NEAR(data->images[0], (1.0f - 0.286f) / 0.353f, 1e-5f);
  EXPECT_NEAR(data->images[4], (0.0f - 0.286f) / 0.353f, 1e-5f);
}

TEST(CheckIdxDatasetFilesTest, NeedsAllFourFiles) {
  const std::string dir = MakeDataDir("check-files");
  EXPECT_OK(CheckIdxDatasetFiles(dir));
  std::filesystem::remove(dir + "/t10k-labels-idx1-ubyte.gz");
  EXPECT_THAT(CheckIdxDatasetFiles(dir),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("t10k-labels-idx1-ubyte")));
  EXPECT_THAT(CheckIdxDatasetFiles(TempPath("absent/fashion-mnist")),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("dataset-fashion-mnist")));
}

TEST(CheckDatasetFitsTest, AcceptsMatchingDataAndRefusesTheRest) {
  Dataset data;
  data.size = 2;
  data.shape = {1, 3, 1};
  data.dim = 3;
  data.images.assign(6, 0.5f);
  data.labels = {0, 9};
  TrainingConfig mlp;
  for (int size : {3, 10}) mlp.add_layer_sizes(size);
  EXPECT_OK(CheckDatasetFits(data, mlp));
  mlp.set_layer_sizes(0, 4);
  EXPECT_THAT(CheckDatasetFits(data, mlp),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("input layer has 4")));
  mlp.set_layer_sizes(0, 3);
  mlp.set_layer_sizes(1, 9);
  EXPECT_THAT(CheckDatasetFits(data, mlp),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("label 9 of example 1 is not one of the "
                                 "model's 9 classes")));
  data.labels = {-1, 0};
  EXPECT_THAT(
      CheckDatasetFits(data, mlp),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("label -1")));
}

TEST(CheckDatasetFitsTest, AModelWithLayersNeedsTheSameShape) {
  Dataset data;
  data.size = 1;
  data.shape = {4, 4, 1};
  data.dim = 16;
  data.images.assign(16, 0.5f);
  data.labels = {2};
  TrainingConfig config;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      "layers { conv { filters: 2 kernel: 3 } } layers { dense { units: 3 } } "
      "input_shape: [4, 4, 1] num_classes: 3",
      &config));
  ASSERT_OK_AND_ASSIGN(TrainingConfig resolved, common::ResolveConfig(config));
  EXPECT_OK(CheckDatasetFits(data, resolved));
  // The same number of values in another shape is not the same image.
  data.shape = {2, 8, 1};
  EXPECT_THAT(CheckDatasetFits(data, resolved),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the data's examples are 2x8x1 but the "
                                 "model's input_shape is 4x4x1")));
}

TEST(PartitionForTest, CoversEveryExampleExactlyOnce) {
  for (const auto& [size, workers] : {std::pair<int64_t, int>{60000, 7},
                                      {10, 3},
                                      {10, 1},
                                      {5, 5},
                                      {101, 4}}) {
    SCOPED_TRACE(testing::Message()
                 << size << " examples, " << workers << " workers");
    std::vector<int> owners(size, 0);
    int64_t next = 0;
    for (int rank = 0; rank < workers; ++rank) {
      const Partition p = PartitionFor(size, workers, rank);
      EXPECT_EQ(p.begin, next);
      EXPECT_GE(p.end - p.begin, SmallestPartition(size, workers));
      EXPECT_LE(p.end - p.begin, SmallestPartition(size, workers) + 1);
      for (int64_t i = p.begin; i < p.end; ++i) ++owners[i];
      next = p.end;
    }
    EXPECT_EQ(next, size);
    EXPECT_EQ(std::count(owners.begin(), owners.end(), 1), size);
  }
}

TEST(PartitionForTest, SmallestPartitionIsTheFloor) {
  EXPECT_EQ(SmallestPartition(10, 3), 3);
  EXPECT_EQ(SmallestPartition(60000, 7), 8571);
  EXPECT_EQ(SmallestPartition(4, 8), 0);
}

TEST(ShuffledOrderTest, IsAPermutationOfThePartition) {
  const Partition partition{100, 357};
  std::vector<int64_t> order = ShuffledOrder(partition, 1, 2, 0);
  ASSERT_EQ(order.size(), 257u);
  std::vector<int64_t> expected(257);
  std::iota(expected.begin(), expected.end(), 100);
  EXPECT_NE(order, expected);  // shuffled at all
  std::sort(order.begin(), order.end());
  EXPECT_EQ(order, expected);
}

TEST(ShuffledOrderTest, IsAPureFunctionOfSeedRankAndEpoch) {
  const Partition partition{0, 500};
  const std::vector<int64_t> order = ShuffledOrder(partition, 7, 1, 3);
  EXPECT_EQ(ShuffledOrder(partition, 7, 1, 3), order);
  EXPECT_NE(ShuffledOrder(partition, 7, 1, 4), order);
  EXPECT_NE(ShuffledOrder(partition, 7, 2, 3), order);
  EXPECT_NE(ShuffledOrder(partition, 8, 1, 3), order);
}

TEST(ShuffledOrderTest, HandlesEmptyAndSingleExamplePartitions) {
  EXPECT_TRUE(ShuffledOrder(Partition{5, 5}, 1, 0, 0).empty());
  EXPECT_THAT(ShuffledOrder(Partition{5, 6}, 1, 0, 0), ElementsAre(5));
}

}  // namespace
}  // namespace monsoon::worker
