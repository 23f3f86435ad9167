#include "common/data_shape.h"

#include <sys/stat.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/idx_reader.h"

namespace monsoon::common {

absl::StatusOr<std::string> FindIdxFile(const std::string& dir,
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

absl::StatusOr<Shape> ExampleShapeFromIdxDims(
    const std::vector<uint32_t>& dims) {
  if (dims.size() < 2 || dims.size() > 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "images have ", dims.size(),
        " dimensions; expected the count then 1 to 3 (H x W x C)"));
  }
  for (size_t d = 1; d < dims.size(); ++d) {
    if (dims[d] < 1 || dims[d] > (1u << 15)) {
      return absl::InvalidArgumentError(
          absl::StrCat("image dimension ", d, " is ", dims[d],
                       "; each must be from 1 to 32768"));
    }
  }
  Shape shape;
  if (dims.size() == 2) {
    shape = {1, static_cast<int>(dims[1]), 1};
  } else {
    shape = {static_cast<int>(dims[1]), static_cast<int>(dims[2]),
             dims.size() == 4 ? static_cast<int>(dims[3]) : 1};
  }
  return shape;
}

absl::StatusOr<DataShape> ReadDataShape(const std::string& dir) {
  absl::StatusOr<std::string> images_path =
      FindIdxFile(dir, "train-images-idx3-ubyte");
  if (!images_path.ok()) return images_path.status();
  absl::StatusOr<std::string> labels_path =
      FindIdxFile(dir, "train-labels-idx1-ubyte");
  if (!labels_path.ok()) return labels_path.status();
  absl::StatusOr<std::vector<uint32_t>> dims = ReadIdxDims(*images_path);
  if (!dims.ok()) return dims.status();
  absl::StatusOr<Shape> example = ExampleShapeFromIdxDims(*dims);
  if (!example.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", *images_path, "': ", example.status().message()));
  }
  absl::StatusOr<IdxArray> labels = ReadIdxFile(*labels_path);
  if (!labels.ok()) return labels.status();
  if (labels->dims.size() != 1 || labels->data.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", *labels_path, "' must hold at least one label (rank 1)"));
  }
  if (labels->dims[0] != (*dims)[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", *images_path, "' has ", (*dims)[0], " images but '",
                     *labels_path, "' has ", labels->dims[0], " labels"));
  }
  DataShape shape;
  shape.example = *example;
  shape.num_classes =
      1 + *std::max_element(labels->data.begin(), labels->data.end());
  if (shape.num_classes < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", *labels_path,
                     "' has only the label 0: a classifier needs at least "
                     "2 classes"));
  }
  return shape;
}

}  // namespace monsoon::common
