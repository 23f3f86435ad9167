// Where an IDX data set's files are, and what its training files say about
// a model: the examples' shape and the number of classes. Shards and
// workers read it when the config leaves the model's input shape or classes
// to the data (common/model_config.h). Stateless; thread-safe.
#ifndef MONSOON_COMMON_DATA_SHAPE_H_
#define MONSOON_COMMON_DATA_SHAPE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_layout.h"

namespace monsoon::common {

// <dir>/<name>.gz, else <dir>/<name>. NOT_FOUND says what to do; for a
// Fashion-MNIST folder it names the Debian package that provides it.
absl::StatusOr<std::string> FindIdxFile(const std::string& dir,
                                        const std::string& name);

struct DataShape {
  // From the training images' dimensions after the count: [N, H, W] is
  // H x W x 1, [N, H, W, C] is H x W x C, [N, D] is 1 x D x 1.
  Shape example;
  // The largest training label plus one.
  int num_classes = 0;
};

// The shape of the examples from the dimensions of an IDX images file
// (the count first). INVALID_ARGUMENT for a rank outside 2 to 4, a zero or
// oversized dimension.
absl::StatusOr<Shape> ExampleShapeFromIdxDims(
    const std::vector<uint32_t>& dims);

// Reads <dir>/train-images-idx3-ubyte[.gz]'s header and
// <dir>/train-labels-idx1-ubyte[.gz]. Errors name the file and what is
// wrong with it (missing, corrupt, no labels, a count that differs from
// the images').
absl::StatusOr<DataShape> ReadDataShape(const std::string& dir);

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_DATA_SHAPE_H_
