#include "common/libsvm_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/sparse_ids.h"

namespace monsoon::common {
namespace {

// A line longer than this is refused rather than read into memory whole.
constexpr size_t kMaxLineBytes = 16 << 20;

bool AllDigits(absl::string_view text) {
  return !text.empty() &&
         std::all_of(text.begin(), text.end(),
                     [](char c) { return absl::ascii_isdigit(c); });
}

absl::Status Bad(absl::string_view what, absl::string_view token) {
  return absl::InvalidArgumentError(absl::StrCat(what, " '", token, "'"));
}

}  // namespace

absl::StatusOr<bool> ParseLibsvmLine(absl::string_view line,
                                     SparseExample* example) {
  if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
    line = line.substr(0, hash);
  }
  std::vector<absl::string_view> tokens =
      absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
  example->ids.clear();
  example->values.clear();
  example->fields.clear();
  if (tokens.empty()) return false;
  if (!absl::SimpleAtof(tokens[0], &example->label) ||
      !std::isfinite(example->label)) {
    return Bad("the label is not a finite number:", tokens[0]);
  }
  for (size_t i = 1; i < tokens.size(); ++i) {
    const absl::string_view token = tokens[i];
    std::vector<absl::string_view> parts = absl::StrSplit(token, ':');
    if (parts.size() != 2 && parts.size() != 3) {
      return Bad("a feature is id:value or field:id:value, not", token);
    }
    int32_t field = -1;
    if (parts.size() == 3) {
      if (!AllDigits(parts[0]) || !absl::SimpleAtoi(parts[0], &field)) {
        return Bad("a field is a number from 0, not", parts[0]);
      }
      parts.erase(parts.begin());
    }
    uint64_t id = 0;
    if (parts[0].empty()) return Bad("a feature without an id:", token);
    if (AllDigits(parts[0])) {
      if (!absl::SimpleAtoi(parts[0], &id)) {
        return Bad("an id beyond 64 bits:", parts[0]);
      }
    } else {
      id = HashStringId(parts[0]);
    }
    float value = 0;
    if (!absl::SimpleAtof(parts[1], &value) || !std::isfinite(value)) {
      return Bad("a feature's value is not a finite number:", token);
    }
    example->ids.push_back(id);
    example->values.push_back(value);
    example->fields.push_back(field);
  }
  return true;
}

absl::StatusOr<std::unique_ptr<LibsvmReader>> LibsvmReader::Open(
    const std::string& path) {
  // gzread reads plain files unchanged, so one path handles both.
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    const int error = errno;
    if (error == ENOENT) {
      return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    }
    return absl::UnavailableError(
        absl::StrCat(path, ": cannot open: ", std::strerror(error)));
  }
  return std::unique_ptr<LibsvmReader>(new LibsvmReader(path, file));
}

LibsvmReader::LibsvmReader(std::string path, void* file)
    : path_(std::move(path)), file_(file) {}

LibsvmReader::~LibsvmReader() { gzclose(static_cast<gzFile>(file_)); }

absl::StatusOr<bool> LibsvmReader::ReadLine() {
  gzFile file = static_cast<gzFile>(file_);
  line_buffer_.clear();
  char chunk[65536];
  while (true) {
    if (gzgets(file, chunk, sizeof(chunk)) == nullptr) {
      int code = Z_OK;
      const char* message = gzerror(file, &code);
      if (code != Z_OK && code != Z_STREAM_END) {
        return absl::DataLossError(absl::StrCat(
            path_, ":", line_ + 1, ": damaged gzip stream: ", message));
      }
      if (!line_buffer_.empty()) break;  // a last line without a newline
      return false;
    }
    line_buffer_.append(chunk);
    if (!line_buffer_.empty() && line_buffer_.back() == '\n') {
      line_buffer_.pop_back();
      break;
    }
    if (line_buffer_.size() > kMaxLineBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ":", line_ + 1, ": a line longer than ",
                       kMaxLineBytes >> 20, " MiB"));
    }
  }
  ++line_;
  return true;
}

absl::StatusOr<bool> LibsvmReader::Next(SparseExample* example) {
  while (true) {
    absl::StatusOr<bool> more = ReadLine();
    if (!more.ok() || !*more) return more;
    absl::StatusOr<bool> parsed = ParseLibsvmLine(line_buffer_, example);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ":", line_, ": ", parsed.status().message()));
    }
    if (*parsed) return true;
  }
}

absl::StatusOr<bool> LibsvmReader::Skip() {
  while (true) {
    absl::StatusOr<bool> more = ReadLine();
    if (!more.ok() || !*more) return more;
    absl::string_view line = absl::StripLeadingAsciiWhitespace(line_buffer_);
    if (!line.empty() && line[0] != '#') return true;
  }
}

}  // namespace monsoon::common
