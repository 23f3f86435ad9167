// Shard checkpoints on disk: where a shard's file lives, how it is written
// (atomically: a temporary file, fsync, rename, fsync of the directory, so a
// crash leaves either the old file or the new one) and read back, and the
// checks that decide whether a shard may resume from it. Stateless;
// thread-safe for different paths.
#ifndef MONSOON_SERVER_CHECKPOINT_H_
#define MONSOON_SERVER_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/checkpoint.pb.h"

namespace monsoon::server {

// 2: a CRC-32 ends the file. Version 1 files (no CRC) are still read.
inline constexpr uint32_t kCheckpointFormatVersion = 2;

// DIR/shard-<shard>-of-<num_shards>.ckpt
std::string CheckpointPath(const std::string& dir, int shard, int num_shards);

// Writes `checkpoint` to `path` atomically. INTERNAL (naming the path and the
// system error) when it cannot; the previous file, if any, is then intact.
absl::Status WriteCheckpoint(const std::string& path,
                             const ShardCheckpoint& checkpoint);

// Reads `path`: nullopt when there is no such file; DATA_LOSS (naming the
// file, which is left where it is for inspection) when it cannot be read or
// parsed, its CRC-32 does not match its bytes, or a weight or optimizer
// value is NaN or infinite; FAILED_PRECONDITION for an unknown
// format_version.
absl::StatusOr<std::optional<ShardCheckpoint>> ReadCheckpoint(
    const std::string& path);

// FAILED_PRECONDITION, with both values in the message, when `checkpoint`
// belongs to another config, shard or shard count, or its weights are not
// `num_weights` float32 values.
absl::Status CheckCheckpointMatches(const ShardCheckpoint& checkpoint,
                                    uint64_t config_fingerprint, int shard,
                                    int num_shards, uint64_t num_weights);

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_CHECKPOINT_H_
