// Reading IDX files (the MNIST family's format), gzip-compressed or plain.
// Stateless; thread-safe.
#ifndef MONSOON_COMMON_IDX_READER_H_
#define MONSOON_COMMON_IDX_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace monsoon::common {

// An IDX array of unsigned bytes: dims[0] items of dims[1]*dims[2]*... each.
struct IdxArray {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;
  uint64_t item_size() const;
};

// Parses the bytes of an (uncompressed) IDX file whose element type is
// unsigned byte (0x08). INVALID_ARGUMENT says what is wrong: bad magic, an
// unsupported type, a truncated body or trailing bytes.
absl::StatusOr<IdxArray> ParseIdx(const std::string& bytes);

// Reads a file (gzip or plain, detected from its content) and parses it.
// NOT_FOUND when the file is missing; INVALID_ARGUMENT when it is corrupt
// (the message names the file).
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path);

// Reads only a file's header (gzip or plain): its dimensions. The same
// errors as ReadIdxFile for what the header shows (the body is not read,
// so a truncated body is not noticed here).
absl::StatusOr<std::vector<uint32_t>> ReadIdxDims(const std::string& path);

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_IDX_READER_H_
