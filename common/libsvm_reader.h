// LibsvmReader: sparse examples from a libsvm / SVMlight text file (plain
// or gzipped), one line at a time, so that a file larger than memory
// streams. A line is
//
//   LABEL FEATURE FEATURE ...   [# comment]
//
// LABEL a number (click data: 0 or 1; -1 and +1 are read as given), and
// each FEATURE `id:value` or, where a model groups features into fields
// (libffm), `field:id:value`. An id of digits is that 64-bit number; any
// other id (a word: `user_42`) is hashed to 64 bits (HashStringId), so the
// same word is the same id in every process. Fields are numbers from 0.
// Blank lines and lines that are only a comment are skipped.
//
// Every error names the file and line and what was wrong with it.
// One thread at a time.
#ifndef MONSOON_COMMON_LIBSVM_READER_H_
#define MONSOON_COMMON_LIBSVM_READER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace monsoon::common {

struct SparseExample {
  float label = 0;
  // One entry per feature, in the line's order.
  std::vector<uint64_t> ids;
  std::vector<float> values;
  std::vector<int32_t> fields;  // -1 where the feature named no field
};

// Parses one line (without its newline) into *example. INVALID_ARGUMENT,
// saying what is wrong, for a malformed line. Returns false for a line with
// no example (blank, or only a comment).
absl::StatusOr<bool> ParseLibsvmLine(absl::string_view line,
                                     SparseExample* example);

class LibsvmReader {
 public:
  // NOT_FOUND for a missing file, and the open error otherwise.
  static absl::StatusOr<std::unique_ptr<LibsvmReader>> Open(
      const std::string& path);
  ~LibsvmReader();

  // The next example into *example: true, or false at the end of the file.
  // INVALID_ARGUMENT "PATH:LINE: ..." for a malformed line, DATA_LOSS for a
  // damaged gzip stream.
  absl::StatusOr<bool> Next(SparseExample* example);

  // Moves past the next example without parsing it (a line that is not
  // blank or only a comment): true, or false at the end of the file. For a
  // worker that trains every W-th example; the line is checked when a
  // reader that trains it reads it.
  absl::StatusOr<bool> Skip();

  // The line of the last example read or skipped (1-based).
  int64_t line() const { return line_; }

 private:
  LibsvmReader(std::string path, void* file);
  // One line into line_buffer_: false at the end.
  absl::StatusOr<bool> ReadLine();

  const std::string path_;
  void* const file_;  // gzFile
  std::string line_buffer_;
  int64_t line_ = 0;
};

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_LIBSVM_READER_H_
