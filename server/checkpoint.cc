#include "server/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/config.h"
#include "common/float_bytes.h"
#include "common/model_layout.h"
#include "common/wire.h"

namespace monsoon::server {
namespace {

// The crc32 field's tag: field 10, wire type 5 (fixed32).
constexpr uint8_t kCrcTag = (10 << 3) | 5;

uint32_t Crc32(const char* data, size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), chunk);
    data += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

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

// ReshardedCheckpoint's steps.

// The shard count of the complete set of checkpoints in `dir` (every shard
// of the count has its file) whose newest file is the newest, among counts
// other than `num_shards`; 0 when there is no such set.
int NewestOtherShardCount(const std::string& dir, int num_shards) {
  // Complete sets of another shard count, by count, with their newest
  // file's time.
  std::map<int, std::set<int>> sets;
  std::map<int, std::filesystem::file_time_type> newest;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    int index = 0, total = 0;
    char tail = 0;
    const std::string name = entry.path().filename().string();
    if (std::sscanf(name.c_str(), "shard-%d-of-%d.ckp%c", &index, &total,
                    &tail) != 3 ||
        tail != 't' || name != CheckpointPath("", index, total).substr(1) ||
        total < 1 || index < 0 || index >= total || total == num_shards) {
      continue;
    }
    sets[total].insert(index);
    const auto time = entry.last_write_time(error);
    if (!newest.count(total) || time > newest[total]) newest[total] = time;
  }
  int chosen = 0;
  for (const auto& [total, indexes] : sets) {
    if (static_cast<int>(indexes.size()) != total) continue;  // incomplete
    if (chosen == 0 || newest[total] > newest[chosen]) chosen = total;
  }
  return chosen;
}

// Shard `shard` of a set of `num_shards`, read from `path`: it must be this
// run's (CheckCheckpointMatches, holding `num_weights` weights), and its
// optimizer state none or one value per parameter, so that it can be cut.
// FAILED_PRECONDITION (or ReadCheckpoint's DATA_LOSS) otherwise, naming
// the path.
absl::StatusOr<ShardCheckpoint> ReadSetPart(const std::string& path,
                                            uint64_t config_fingerprint,
                                            int shard, int num_shards,
                                            uint64_t num_weights,
                                            const TrainingConfig* resolved) {
  absl::StatusOr<std::optional<ShardCheckpoint>> read = ReadCheckpoint(path);
  if (!read.ok()) return read.status();
  if (!read->has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " went away while it was read"));
  }
  ShardCheckpoint& part = **read;
  absl::Status matches = CheckCheckpointMatches(
      part, config_fingerprint, shard, num_shards, num_weights, resolved);
  if (!matches.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": ", matches.message()));
  }
  const bool elementwise =
      part.optimizer_state().size() == num_weights * sizeof(float);
  if (!part.optimizer_state().empty() && !elementwise) {
    return absl::FailedPreconditionError(absl::StrCat(
        path,
        ": its optimizer state is not one value per parameter, so it "
        "cannot be cut for another shard count"));
  }
  return std::move(part);
}

// Takes the first part of the set's optimizer, version and per-rank stats
// into `out`.
void TakeFirstPart(const ShardCheckpoint& part, ShardCheckpoint* out) {
  out->set_optimizer(part.optimizer());
  out->set_version(part.version());
  *out->mutable_stats()->mutable_samples_applied_by_worker() =
      part.stats().samples_applied_by_worker();
  *out->mutable_stats()->mutable_sample_position_by_worker() =
      part.stats().sample_position_by_worker();
  *out->mutable_stats()->mutable_samples_skipped_by_worker() =
      part.stats().samples_skipped_by_worker();
}

// Merges a later part of the set into `out`: the newest version, and per
// rank what every part holds (the smallest count). `elementwise`: whether
// this part's optimizer state is one value per parameter; `set_elementwise`:
// whether the first part's was. FAILED_PRECONDITION, naming `path`, when
// its optimizer differs from the first part's.
absl::Status MergeLaterPart(const ShardCheckpoint& part, bool elementwise,
                            bool set_elementwise, const std::string& path,
                            ShardCheckpoint* out) {
  if (part.optimizer() != out->optimizer() || elementwise != set_elementwise) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": its optimizer differs from its set's"));
  }
  out->set_version(std::max(out->version(), part.version()));
  // What every part of the range holds: the smallest.
  using RankMap = google::protobuf::Map<int32_t, int64_t>;
  const std::pair<RankMap*, const RankMap*> maps[] = {
      {out->mutable_stats()->mutable_samples_applied_by_worker(),
       &part.stats().samples_applied_by_worker()},
      {out->mutable_stats()->mutable_sample_position_by_worker(),
       &part.stats().sample_position_by_worker()},
      {out->mutable_stats()->mutable_samples_skipped_by_worker(),
       &part.stats().samples_skipped_by_worker()},
  };
  for (const auto& [map, other] : maps) {
    for (auto& [rank, value] : *map) {
      auto it = other->find(rank);
      value = it == other->end() ? 0 : std::min(value, it->second);
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string CheckpointPath(const std::string& dir, int shard, int num_shards) {
  return absl::StrCat(dir, "/shard-", shard, "-of-", num_shards, ".ckpt");
}

absl::Status WriteCheckpoint(const std::string& path,
                             const ShardCheckpoint& checkpoint) {
  ShardCheckpoint without_crc = checkpoint;
  without_crc.clear_crc32();
  std::string bytes;
  if (!without_crc.SerializeToString(&bytes)) {
    return absl::InternalError("cannot serialize the checkpoint");
  }
  // The crc32 field last, over every byte before it.
  const uint32_t crc = Crc32(bytes.data(), bytes.size());
  bytes.push_back(static_cast<char>(kCrcTag));
  for (int i = 0; i < 4; ++i)
    bytes.push_back(static_cast<char>(crc >> (8 * i)));
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
  absl::StatusOr<ShardCheckpoint> checkpoint = ParseCheckpoint(bytes, path);
  if (!checkpoint.ok()) return checkpoint.status();
  return std::optional<ShardCheckpoint>(*std::move(checkpoint));
}

ShardCheckpoint CheckpointOf(const RuleState& saved, const ShardState& state,
                             const TrainingConfig& resolved) {
  ShardCheckpoint checkpoint;
  checkpoint.set_format_version(kCheckpointFormatVersion);
  checkpoint.set_config_fingerprint(common::ConfigFingerprint(resolved));
  *checkpoint.mutable_config() = resolved;
  checkpoint.set_shard(state.shard());
  checkpoint.set_num_shards(state.num_shards());
  checkpoint.set_version(saved.version);
  checkpoint.set_offset(state.range().begin);
  common::AppendFloatBytes(saved.weights, checkpoint.mutable_weights());
  checkpoint.set_optimizer(saved.optimizer);
  checkpoint.set_optimizer_state(saved.optimizer_state);
  *checkpoint.mutable_stats() = saved.stats;
  return checkpoint;
}

RuleState SavedStateOf(const ShardCheckpoint& checkpoint) {
  RuleState saved;
  saved.version = checkpoint.version();
  saved.weights.resize(checkpoint.weights().size() / sizeof(float));
  std::memcpy(saved.weights.data(), checkpoint.weights().data(),
              saved.weights.size() * sizeof(float));
  saved.optimizer = checkpoint.optimizer();
  saved.optimizer_state = checkpoint.optimizer_state();
  return saved;
}

absl::StatusOr<ShardCheckpoint> ParseCheckpoint(const std::string& bytes,
                                                const std::string& path) {
  const std::string damaged = absl::StrCat("checkpoint ", path, " is damaged (",
                                           bytes.size(), " bytes): ");
  const std::string what_to_do =
      "; the file is left as it is: move it away to start this shard "
      "afresh, or restore a good copy";
  ShardCheckpoint checkpoint;
  if (!checkpoint.ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat(
        damaged, "it does not parse as monsoon.ShardCheckpoint", what_to_do));
  }
  if (checkpoint.format_version() != 1 &&
      checkpoint.format_version() != kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", path, " has format version ",
        checkpoint.format_version(), "; this build reads versions ", "1 and ",
        kCheckpointFormatVersion));
  }
  if (checkpoint.format_version() >= 2) {
    // The file must end with the crc32 field, over every byte before it.
    const size_t body = bytes.size() - std::min<size_t>(bytes.size(), 5);
    uint32_t stored = 0;
    for (int i = 0; i < 4 && body + 1 + i < bytes.size(); ++i) {
      stored |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[body + 1 + i]))
                << (8 * i);
    }
    if (bytes.size() < 5 || static_cast<uint8_t>(bytes[body]) != kCrcTag ||
        stored != Crc32(bytes.data(), body)) {
      return absl::DataLossError(
          absl::StrCat(damaged, "its CRC-32 does not match", what_to_do));
    }
  }
  for (const auto& [name, values] :
       {std::pair<const char*, const std::string*>{"weight",
                                                   &checkpoint.weights()},
        {"optimizer value", &checkpoint.optimizer_state()}}) {
    const uint64_t n = values->size() / sizeof(float);
    std::vector<float> floats(n);
    // (memcpy from or to null is undefined even for 0 bytes: an empty
    // field, found by tests/fuzz/checkpoint_fuzzer.)
    if (n > 0) std::memcpy(floats.data(), values->data(), n * sizeof(float));
    const uint64_t bad = common::FirstNonFinite(floats.data(), n);
    if (bad < n) {
      return absl::DataLossError(absl::StrCat(damaged, name, " ", bad, " is ",
                                              floats[bad], what_to_do));
    }
  }
  return std::move(checkpoint);
}

absl::Status CheckCheckpointMatches(const ShardCheckpoint& checkpoint,
                                    uint64_t config_fingerprint, int shard,
                                    int num_shards, uint64_t num_weights,
                                    const TrainingConfig* resolved) {
  if (checkpoint.config_fingerprint() != config_fingerprint) {
    std::string differences;
    if (resolved != nullptr && checkpoint.has_config()) {
      differences = common::ConfigDifferences(checkpoint.config(), *resolved);
    }
    return absl::FailedPreconditionError(absl::StrCat(
        absl::StrFormat(
            "checkpoint was written with config fingerprint %016x, but this "
            "shard's config has %016x: use the run's config, or another "
            "--checkpoint_dir",
            checkpoint.config_fingerprint(), config_fingerprint),
        differences.empty()
            ? ""
            : absl::StrCat("; the checkpoint's config -> this shard's: ",
                           absl::StrReplaceAll(differences, {{"\n", "; "}}))));
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

absl::StatusOr<std::optional<ShardCheckpoint>> ReshardedCheckpoint(
    const std::string& dir, uint64_t num_params, int shard, int num_shards,
    uint64_t config_fingerprint, const TrainingConfig* resolved) {
  const int chosen = NewestOtherShardCount(dir, num_shards);
  if (chosen == 0) return std::optional<ShardCheckpoint>();

  const common::ShardRange range =
      common::ShardRangeFor(num_params, num_shards, shard);
  ShardCheckpoint out;
  out.set_format_version(kCheckpointFormatVersion);
  out.set_config_fingerprint(config_fingerprint);
  out.set_shard(shard);
  out.set_num_shards(num_shards);
  out.set_offset(range.begin);
  std::string weights(range.size() * sizeof(float), '\0');
  std::string state;
  bool first = true;
  for (int s = 0; s < chosen; ++s) {
    const common::ShardRange from =
        common::ShardRangeFor(num_params, chosen, s);
    const uint64_t begin = std::max(from.begin, range.begin);
    const uint64_t end = std::min(from.end, range.end);
    const std::string path = CheckpointPath(dir, s, chosen);
    absl::StatusOr<ShardCheckpoint> part =
        ReadSetPart(path, config_fingerprint, s, chosen, from.size(), resolved);
    if (!part.ok()) return part.status();
    // Every file's sparse rows: the new shard keeps those of its buckets
    // (ShardServer::Resume).
    for (const std::string& table : part->sparse_tables()) {
      out.add_sparse_tables(table);
    }
    if (begin >= end) continue;
    const bool elementwise =
        part->optimizer_state().size() == from.size() * sizeof(float);
    const size_t at = (begin - range.begin) * sizeof(float);
    const size_t from_at = (begin - from.begin) * sizeof(float);
    const size_t bytes = (end - begin) * sizeof(float);
    weights.replace(at, bytes, part->weights(), from_at, bytes);
    // A finished run stays finished at another shard count.
    if (part->stats().run_closed()) out.mutable_stats()->set_run_closed(true);
    if (first) {
      if (elementwise) state.assign(range.size() * sizeof(float), '\0');
      TakeFirstPart(*part, &out);
      first = false;
    } else if (absl::Status merged = MergeLaterPart(*part, elementwise,
                                                    !state.empty(), path, &out);
               !merged.ok()) {
      return merged;
    }
    if (elementwise)
      state.replace(at, bytes, part->optimizer_state(), from_at, bytes);
  }
  out.set_weights(std::move(weights));
  out.set_optimizer_state(std::move(state));
  return std::optional<ShardCheckpoint>(std::move(out));
}

}  // namespace monsoon::server
