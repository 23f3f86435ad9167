#include "tests/test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
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

namespace {

// Binds a TCP socket to 127.0.0.1:`port` (0: the kernel's pick) and
// returns the port it got, or 0 if the bind failed.
int BindLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t length = sizeof(address);
  int bound = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) ==
          0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) ==
          0) {
    bound = ntohs(address.sin_port);
  }
  ::close(fd);
  return bound;
}

}  // namespace

int FreePort() {
  // Below the kernel's ephemeral range: a port from that range can be
  // taken, before the test's server binds it, as the local end of any
  // outgoing connection (another test's client, or a connection to that
  // very port, which then connects to itself).
  int first_ephemeral = 32768;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  if (int low = 0; range >> low && low > 11024) first_ephemeral = low;
  static std::mt19937 random(std::random_device{}());
  std::uniform_int_distribution<int> pick(10000, first_ephemeral - 1);
  for (int attempt = 0; attempt < 100; ++attempt) {
    if (const int port = BindLoopback(pick(random)); port != 0) return port;
  }
  return BindLoopback(0);
}

}  // namespace monsoon::testutil
