// Fresh temporary folders, under $TMPDIR where it is set, else /tmp.
// Thread-safe.
#ifndef MONSOON_COMMON_TEMP_DIR_H_
#define MONSOON_COMMON_TEMP_DIR_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace monsoon::common {

// Makes the folder NAME-XXXXXX (a unique suffix) and returns its path;
// UNAVAILABLE saying why when it cannot.
absl::StatusOr<std::string> MakeTempDir(absl::string_view name);

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_TEMP_DIR_H_
