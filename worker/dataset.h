// Datasets in memory: images as float32 in [0, 1], labels as int32 classes;
// loading an IDX data set (Fashion-MNIST layout), a worker's partition and
// its per-epoch shuffle. Values are immutable after loading; thread-safe.
#ifndef MONSOON_WORKER_DATASET_H_
#define MONSOON_WORKER_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_layout.h"
#include "proto/config.pb.h"

namespace monsoon::worker {

struct Dataset {
  int64_t size = 0;           // examples
  common::Shape shape;        // of an example (height x width x channels)
  int64_t dim = 0;            // values per example: shape.size()
  std::vector<float> images;  // size * dim, row-major
  std::vector<int32_t> labels;

  const float* example(int64_t i) const { return images.data() + i * dim; }
};

enum class Split { kTrain, kTest };

// Loads <dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]. Pixels are
// scaled to [0, 1]. Errors name the missing or corrupt file; a missing
// Fashion-MNIST folder names the Debian package that provides it.
absl::StatusOr<Dataset> LoadIdxDataset(const std::string& dir, Split split);

// NOT_FOUND (with the same advice as LoadIdxDataset) unless all four files
// of an IDX data set are in `dir`. Reads nothing.
absl::Status CheckIdxDatasetFiles(const std::string& dir);

// DIR/SPLIT.libsvm, or DIR/SPLIT.libsvm.gz where only that exists
// (SPLIT: "train" or "test"); NOT_FOUND naming both.
absl::StatusOr<std::string> LibsvmFile(const std::string& dir,
                                       const std::string& split);

// The examples in a libsvm file (lines that are not blank or only a
// comment), without parsing them.
absl::StatusOr<int64_t> CountLibsvmExamples(const std::string& path);

// The files the config's model reads (SPARSE_LR: a libsvm train and test
// file; any other: an IDX data set) are in config.data_dir. Reads nothing.
absl::Status CheckDataFilesFor(const TrainingConfig& config);

// Loads `split` from config.data_dir, checks that it fits the model and
// standardizes it with config.input_mean and input_std.
absl::StatusOr<Dataset> LoadDatasetFor(const TrainingConfig& config,
                                       Split split);

// Checks that the examples have the resolved config's input shape (for an
// MLP, as many values) and every label is one of its classes.
// INVALID_ARGUMENT says what differs and what to do.
absl::Status CheckDatasetFits(const Dataset& data,
                              const TrainingConfig& config);

// Worker `rank` of `num_workers` owns examples [begin, end): the rank-th
// contiguous 1/W of the set (integer division).
struct Partition {
  int64_t begin;
  int64_t end;
};
Partition PartitionFor(int64_t size, int num_workers, int rank);

// Examples per worker such that every worker can do the same number of
// steps: the smallest partition's size.
int64_t SmallestPartition(int64_t size, int num_workers);

// A permutation of [begin, end), a pure function of (seed, rank, epoch).
std::vector<int64_t> ShuffledOrder(Partition partition, uint64_t seed, int rank,
                                   int epoch);

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_DATASET_H_
