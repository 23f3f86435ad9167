#include "common/temp_dir.h"

#include <stdlib.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace monsoon::common {

absl::StatusOr<std::string> MakeTempDir(absl::string_view name) {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = absl::StrCat(
      tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp", "/", name, "-XXXXXX");
  if (mkdtemp(path.data()) == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot make a folder ", path,
                                               ": ", std::strerror(errno)));
  }
  return path;
}

}  // namespace monsoon::common
