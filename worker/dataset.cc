#include "worker/dataset.h"

#include <algorithm>
#include <fstream>
#include <memory>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/data_shape.h"
#include "common/idx_reader.h"
#include "common/libsvm_reader.h"
#include "common/model_config.h"
#include "common/model_layout.h"

namespace monsoon::worker {
absl::StatusOr<Dataset> LoadIdxDataset(const std::string& dir, Split split) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  absl::StatusOr<std::string> images_path =
      common::FindIdxFile(dir, prefix + "-images-idx3-ubyte");
  if (!images_path.ok()) return images_path.status();
  absl::StatusOr<std::string> labels_path =
      common::FindIdxFile(dir, prefix + "-labels-idx1-ubyte");
  if (!labels_path.ok()) return labels_path.status();
  absl::StatusOr<common::IdxArray> images = common::ReadIdxFile(*images_path);
  if (!images.ok()) return images.status();
  absl::StatusOr<common::IdxArray> labels = common::ReadIdxFile(*labels_path);
  if (!labels.ok()) return labels.status();
  if (images->dims.size() < 2 || labels->dims.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", *images_path, "' must hold images (rank >= 2) and '",
                     *labels_path, "' labels (rank 1)"));
  }
  if (images->dims[0] != labels->dims[0]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", *images_path, "' has ", images->dims[0], " images but '",
        *labels_path, "' has ", labels->dims[0], " labels"));
  }
  absl::StatusOr<common::Shape> shape =
      common::ExampleShapeFromIdxDims(images->dims);
  if (!shape.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", *images_path, "': ", shape.status().message()));
  }
  Dataset data;
  data.shape = *shape;
  data.size = images->dims[0];
  data.dim = static_cast<int64_t>(images->item_size());
  data.images.resize(images->data.size());
  for (size_t i = 0; i < images->data.size(); ++i) {
    data.images[i] = static_cast<float>(images->data[i]) * (1.0f / 255.0f);
  }
  data.labels.assign(labels->data.begin(), labels->data.end());
  return data;
}

absl::Status CheckIdxDatasetFiles(const std::string& dir) {
  for (const char* name :
       {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    absl::StatusOr<std::string> path = common::FindIdxFile(dir, name);
    if (!path.ok()) return path.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<Dataset> LoadDatasetFor(const TrainingConfig& config,
                                       Split split) {
  absl::StatusOr<Dataset> data = LoadIdxDataset(config.data_dir(), split);
  if (!data.ok()) return data.status();
  absl::Status fits = CheckDatasetFits(*data, config);
  if (!fits.ok()) return fits;
  const float mean = config.input_mean();
  const float inverse_std = 1.0f / config.input_std();
  for (float& x : data->images) x = (x - mean) * inverse_std;
  return data;
}

absl::Status CheckDatasetFits(const Dataset& data,
                              const TrainingConfig& config) {
  const int classes = common::ModelLayout::FromConfig(config).num_classes();
  int32_t largest = 0;
  for (int64_t i = 0; i < data.size; ++i) {
    if (data.labels[i] < 0 || data.labels[i] >= classes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label ", data.labels[i], " of example ", i,
          " is not one of the model's ", classes,
          " classes: remove num_classes (or layer_sizes) from the config to "
          "take the classes from the data"));
    }
    largest = std::max(largest, data.labels[i]);
  }
  return common::CheckDataFitsModel(config, data.shape, largest + 1);
}

Partition PartitionFor(int64_t size, int num_workers, int rank) {
  const common::ShardRange range =
      common::ShardRangeFor(static_cast<uint64_t>(size), num_workers, rank);
  return {static_cast<int64_t>(range.begin), static_cast<int64_t>(range.end)};
}

int64_t SmallestPartition(int64_t size, int num_workers) {
  return size / num_workers;
}

std::vector<int64_t> ShuffledOrder(Partition partition, uint64_t seed, int rank,
                                   int epoch) {
  std::vector<int64_t> order(partition.end - partition.begin);
  std::iota(order.begin(), order.end(), partition.begin);
  uint64_t state = common::SplitMix64(common::SplitMix64(seed ^ 0x5eedull) ^
                                      (static_cast<uint64_t>(rank) << 32) ^
                                      static_cast<uint64_t>(epoch));
  // Fisher-Yates with SplitMix64, so the order is the same on every platform
  // (std::shuffle's is implementation-defined).
  for (size_t i = order.size(); i > 1; --i) {
    state = common::SplitMix64(state);
    std::swap(order[i - 1], order[state % i]);
  }
  return order;
}

absl::StatusOr<std::string> LibsvmFile(const std::string& dir,
                                       const std::string& split) {
  const std::string plain = absl::StrCat(dir, "/", split, ".libsvm");
  for (const std::string& path : {plain, plain + ".gz"}) {
    if (std::ifstream(path).good()) return path;
  }
  return absl::NotFoundError(absl::StrCat(
      "no ", plain, " (nor ", plain,
      ".gz): a sparse model reads libsvm files (README \"Sparse models\"; "
      "make_click_data writes some); set data_dir or --data_dir"));
}

absl::StatusOr<int64_t> CountLibsvmExamples(const std::string& path) {
  absl::StatusOr<std::unique_ptr<common::LibsvmReader>> reader =
      common::LibsvmReader::Open(path);
  if (!reader.ok()) return reader.status();
  int64_t count = 0;
  while (true) {
    absl::StatusOr<bool> more = (*reader)->Skip();
    if (!more.ok()) return more.status();
    if (!*more) return count;
    ++count;
  }
}

absl::Status CheckDataFilesFor(const TrainingConfig& config) {
  if (config.model() != SPARSE_LR) {
    return CheckIdxDatasetFiles(config.data_dir());
  }
  for (const char* split : {"train", "test"}) {
    if (absl::StatusOr<std::string> file = LibsvmFile(config.data_dir(), split);
        !file.ok()) {
      return file.status();
    }
  }
  return absl::OkStatus();
}

}  // namespace monsoon::worker
