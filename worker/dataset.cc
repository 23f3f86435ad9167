#include "worker/dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/model_layout.h"
#include "common/idx_reader.h"

namespace monsoon::worker {
namespace {

// Finds <dir>/<name>.gz or <dir>/<name>.
absl::StatusOr<std::string> FindFile(const std::string& dir,
                                     const std::string& name) {
  struct stat info;
  for (const std::string& candidate :
       {absl::StrCat(dir, "/", name, ".gz"), absl::StrCat(dir, "/", name)}) {
    if (::stat(candidate.c_str(), &info) == 0) return candidate;
  }
  std::string hint =
      "set data_dir in the config (or --data_dir) to a folder with the IDX "
      "files";
  if (dir.find("fashion-mnist") != std::string::npos) {
    hint = absl::StrCat(
        "install Debian's package dataset-fashion-mnist (apt-get install "
        "dataset-fashion-mnist), or ",
        hint);
  }
  return absl::NotFoundError(absl::StrCat("data set file '", dir, "/", name,
                                          "[.gz]' not found: ", hint));
}

}  // namespace

absl::StatusOr<Dataset> LoadIdxDataset(const std::string& dir, Split split) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  absl::StatusOr<std::string> images_path =
      FindFile(dir, prefix + "-images-idx3-ubyte");
  if (!images_path.ok()) return images_path.status();
  absl::StatusOr<std::string> labels_path =
      FindFile(dir, prefix + "-labels-idx1-ubyte");
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
  Dataset data;
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
    absl::StatusOr<std::string> path = FindFile(dir, name);
    if (!path.ok()) return path.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<Dataset> LoadDatasetFor(const TrainingConfig& config,
                                       Split split) {
  absl::StatusOr<Dataset> data = LoadIdxDataset(config.data_dir(), split);
  if (!data.ok()) return data.status();
  const auto& sizes = config.layer_sizes();
  absl::Status fits =
      CheckDatasetFits(*data, sizes[0], sizes[sizes.size() - 1]);
  if (!fits.ok()) return fits;
  const float mean = config.input_mean();
  const float inverse_std = 1.0f / config.input_std();
  for (float& x : data->images) x = (x - mean) * inverse_std;
  return data;
}

absl::Status CheckDatasetFits(const Dataset& data, int64_t dim, int classes) {
  if (data.dim != dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("the data has ", data.dim,
                     " values per example but the model's "
                     "input layer has ",
                     dim, ": fix layer_sizes in the config"));
  }
  for (int64_t i = 0; i < data.size; ++i) {
    if (data.labels[i] < 0 || data.labels[i] >= classes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label ", data.labels[i], " of example ", i, " is not below the ",
          classes, " classes of the model's last layer"));
    }
  }
  return absl::OkStatus();
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

}  // namespace monsoon::worker
