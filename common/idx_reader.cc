#include "common/idx_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"

namespace monsoon::common {

uint64_t IdxArray::item_size() const {
  uint64_t size = 1;
  for (size_t i = 1; i < dims.size(); ++i) size *= dims[i];
  return size;
}

namespace {

// Parses the header at the start of `bytes` into dims and the total element
// count; *header_bytes gets its length.
absl::Status ParseHeader(const std::string& bytes, std::vector<uint32_t>* dims,
                         uint64_t* total, size_t* header_bytes) {
  auto u8 = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
  if (bytes.size() < 4 || u8(0) != 0 || u8(1) != 0) {
    return absl::InvalidArgumentError(
        "not an IDX file: it must start with two zero bytes");
  }
  if (u8(2) != 0x08) {
    return absl::InvalidArgumentError(
        absl::StrCat("IDX element type 0x", absl::Hex(u8(2)),
                     " is not supported; only unsigned bytes (0x08) are"));
  }
  const int rank = u8(3);
  if (rank < 1 || rank > 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("IDX rank ", rank, " is outside 1 to 4"));
  }
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  if (bytes.size() < header) {
    return absl::InvalidArgumentError("IDX file truncated inside its header");
  }
  dims->clear();
  *total = 1;
  for (int d = 0; d < rank; ++d) {
    const size_t at = 4 + 4 * d;
    const uint32_t dim = (uint32_t{u8(at)} << 24) |
                         (uint32_t{u8(at + 1)} << 16) |
                         (uint32_t{u8(at + 2)} << 8) | uint32_t{u8(at + 3)};
    dims->push_back(dim);
    // Checked before multiplying: total * dim could wrap around to a small
    // number (2^31 * 4 * 2^31 = 2^64 = 0) and pass as an empty array.
    if (dim != 0 && *total > (uint64_t{1} << 34) / dim) {
      return absl::InvalidArgumentError("IDX dimensions are implausibly large");
    }
    *total *= dim;
  }
  *header_bytes = header;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<IdxArray> ParseIdx(const std::string& bytes) {
  IdxArray array;
  uint64_t total = 0;
  size_t header = 0;
  if (absl::Status s = ParseHeader(bytes, &array.dims, &total, &header);
      !s.ok()) {
    return s;
  }
  const uint64_t body = bytes.size() - header;
  if (body < total) {
    return absl::InvalidArgumentError(
        absl::StrCat("IDX file truncated: the header promises ", total,
                     " bytes of data, "
                     "the file has ",
                     body));
  }
  if (body > total) {
    return absl::InvalidArgumentError(
        absl::StrCat("IDX file has ", body - total, " bytes after its data"));
  }
  array.data.assign(bytes.begin() + header, bytes.end());
  return array;
}

namespace {

// The decompressed bytes of `path` (gzip or plain), at most `limit`.
absl::StatusOr<std::string> ReadBytes(const std::string& path, size_t limit) {
  FILE* probe = std::fopen(path.c_str(), "rb");
  if (probe == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  }
  std::fclose(probe);
  // gzread reads plain files unchanged, so one path handles both.
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  }
  std::string bytes;
  char buffer[1 << 16];
  int n = 0;
  while (bytes.size() < limit &&
         (n = gzread(file, buffer,
                     static_cast<unsigned>(std::min(
                         sizeof(buffer), limit - bytes.size())))) > 0) {
    bytes.append(buffer, static_cast<size_t>(n));
  }
  if (bytes.size() >= limit) n = 0;
  int error = Z_OK;
  const char* message = gzerror(file, &error);
  const std::string zlib_message = message == nullptr ? "" : message;
  gzclose(file);
  if (n < 0 || (error != Z_OK && error != Z_STREAM_END)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is corrupt: gzip error: ", zlib_message,
                     " (reinstall the data or download it again)"));
  }
  return bytes;
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path) {
  absl::StatusOr<std::string> bytes =
      ReadBytes(path, std::numeric_limits<size_t>::max());
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<IdxArray> array = ParseIdx(*bytes);
  if (!array.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "': ", array.status().message()));
  }
  return array;
}

absl::StatusOr<std::vector<uint32_t>> ReadIdxDims(const std::string& path) {
  // Magic and rank, then up to 4 dimensions of 4 bytes.
  absl::StatusOr<std::string> bytes = ReadBytes(path, 4 + 4 * 4);
  if (!bytes.ok()) return bytes.status();
  std::vector<uint32_t> dims;
  uint64_t total = 0;
  size_t header = 0;
  if (absl::Status s = ParseHeader(*bytes, &dims, &total, &header); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "': ", s.message()));
  }
  return dims;
}

}  // namespace monsoon::common
