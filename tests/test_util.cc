#include "tests/test_util.h"

#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/free_ports.h"
#include "gtest/gtest.h"

namespace monsoon::testutil {

TrainingConfig ResolvedConfig(absl::string_view text) {
  absl::StatusOr<TrainingConfig> parsed = common::ParseConfigText(text);
  if (!parsed.ok()) {
    ADD_FAILURE() << "test config does not parse: " << parsed.status();
    return TrainingConfig();
  }
  absl::StatusOr<TrainingConfig> resolved =
      common::ResolveConfigWithData(*parsed);
  if (!resolved.ok()) {
    ADD_FAILURE() << "test config does not resolve: " << resolved.status();
    return TrainingConfig();
  }
  return *resolved;
}

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = dir != nullptr && *dir != '\0' ? dir : "/tmp";
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

std::string TempPath(absl::string_view name) {
  return absl::StrCat(TempDir(), "/", name);
}

std::string FreshDir(absl::string_view name) {
  const std::string dir = TempPath(name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void WriteFile(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) ADD_FAILURE() << "cannot write " << path;
}

void WriteGzipFile(const std::string& path, absl::string_view bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  if (file == nullptr) {
    ADD_FAILURE() << "cannot gzopen " << path;
    return;
  }
  if (!bytes.empty() &&
      gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())) !=
          static_cast<int>(bytes.size())) {
    ADD_FAILURE() << "gzwrite failed on " << path;
  }
  if (gzclose(file) != Z_OK) ADD_FAILURE() << "gzclose failed on " << path;
}

std::string IdxBytes(const std::vector<uint32_t>& dims,
                     const std::vector<uint8_t>& data) {
  std::string bytes = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (uint32_t dim : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      bytes.push_back(static_cast<char>((dim >> shift) & 0xff));
    }
  }
  bytes.append(data.begin(), data.end());
  return bytes;
}

bool ReadFile(const std::string& path, std::string* bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  *bytes = buffer.str();
  return true;
}

int FreePort() {
  // Below the kernel's ephemeral range (common::FreePortRange): a port
  // from that range can be taken, before the test's server binds it, as
  // the local end of any outgoing connection (another test's client, or a
  // connection to that very port, which then connects to itself).
  return common::FreePortRange(1).value_or(0);
}

}  // namespace monsoon::testutil
