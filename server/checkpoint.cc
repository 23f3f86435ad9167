#include "server/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace monsoon::server {
namespace {

absl::Status SystemError(absl::string_view what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, const std::string& bytes,
                      const std::string& path) {
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n =
        ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      return SystemError("write", path);
    }
    written += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

std::string Directory(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

std::string CheckpointPath(const std::string& dir, int shard, int num_shards) {
  return absl::StrCat(dir, "/shard-", shard, "-of-", num_shards, ".ckpt");
}

absl::Status WriteCheckpoint(const std::string& path,
                             const ShardCheckpoint& checkpoint) {
  std::string bytes;
  if (!checkpoint.SerializeToString(&bytes)) {
    return absl::InternalError("cannot serialize the checkpoint");
  }
  const std::string tmp = path + ".tmp";
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return SystemError("create", tmp);
  absl::Status status = WriteAll(fd, bytes, tmp);
  if (status.ok() && ::fsync(fd) != 0) status = SystemError("fsync", tmp);
  if (::close(fd) != 0 && status.ok()) status = SystemError("close", tmp);
  if (status.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    status = SystemError(absl::StrCat("rename ", tmp, " to"), path);
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  // Make the rename itself durable.
  const std::string dir = Directory(path);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return SystemError("open directory", dir);
  status = ::fsync(dir_fd) == 0 ? absl::OkStatus()
                                : SystemError("fsync directory", dir);
  ::close(dir_fd);
  return status;
}

absl::StatusOr<std::optional<ShardCheckpoint>> ReadCheckpoint(
    const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<ShardCheckpoint>();
    return absl::DataLossError(absl::StrCat("cannot open checkpoint ", path,
                                            ": ", std::strerror(errno)));
  }
  std::string bytes;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      return absl::DataLossError(absl::StrCat("cannot read checkpoint ", path,
                                              ": ", std::strerror(error)));
    }
    if (n == 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  ShardCheckpoint checkpoint;
  if (!checkpoint.ParseFromString(bytes)) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path, " (", bytes.size(),
                     " bytes) does not parse as monsoon.ShardCheckpoint"));
  }
  if (checkpoint.format_version() != kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", path, " has format version ",
                     checkpoint.format_version(), "; this build reads version ",
                     kCheckpointFormatVersion));
  }
  return std::optional<ShardCheckpoint>(std::move(checkpoint));
}

absl::Status CheckCheckpointMatches(const ShardCheckpoint& checkpoint,
                                    uint64_t config_fingerprint, int shard,
                                    int num_shards, uint64_t num_weights) {
  if (checkpoint.config_fingerprint() != config_fingerprint) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "checkpoint was written with config fingerprint %016x, but this "
        "shard's config has %016x: use the run's config, or another "
        "--checkpoint_dir",
        checkpoint.config_fingerprint(), config_fingerprint));
  }
  if (checkpoint.shard() != shard || checkpoint.num_shards() != num_shards) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint is of shard ", checkpoint.shard(), " of ",
                     checkpoint.num_shards(), ", but this is shard ", shard,
                     " of ", num_shards));
  }
  if (checkpoint.weights().size() != num_weights * sizeof(float)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint holds ", checkpoint.weights().size(),
                     " bytes of weights, but this shard has ", num_weights,
                     " float32 weights"));
  }
  if (checkpoint.version() < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint has negative version ", checkpoint.version()));
  }
  return absl::OkStatus();
}

}  // namespace monsoon::server
