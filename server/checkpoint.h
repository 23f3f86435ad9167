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
#include "server/shard_state.h"
#include "server/update_rule.h"

namespace monsoon::server {

// 2: a CRC-32 ends the file. Version 1 files (no CRC) are still read.
inline constexpr uint32_t kCheckpointFormatVersion = 2;

// DIR/shard-<shard>-of-<num_shards>.ckpt
std::string CheckpointPath(const std::string& dir, int shard, int num_shards);

// A checkpoint of the range `state` holds, with the rule's `saved` state
// (UpdateRule::SaveState), without sparse tables, for the run's resolved
// config `resolved` (its fingerprint and the config itself).
ShardCheckpoint CheckpointOf(const RuleState& saved, const ShardState& state,
                             const TrainingConfig& resolved);

// The rule state `checkpoint` holds (its weights, version and optimizer
// state), for UpdateRule::RestoreState; `checkpoint` must have been
// checked (CheckCheckpointMatches).
RuleState SavedStateOf(const ShardCheckpoint& checkpoint);

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

// The checks of ReadCheckpoint on a file's bytes already read, `path`
// naming the file in the errors (the same errors, but never nullopt).
absl::StatusOr<ShardCheckpoint> ParseCheckpoint(const std::string& bytes,
                                                const std::string& path);

// Shard `shard` of `num_shards` of a model of `num_params` parameters,
// taken from the checkpoints another shard count left in `dir` (a cluster
// restarted with more or fewer shards): the files of the most recently
// written complete set (shard-0..T-1-of-T, T != num_shards) are read, and
// the shard's range of weights and element-wise optimizer state is copied
// from the files whose ranges overlap it. Its version is the largest of
// theirs; the per-rank positions and example counts are the smallest (what
// every part of the range holds); the other counters start at zero. nullopt
// when `dir` holds no complete set of another shard count; the errors of
// ReadCheckpoint, and FAILED_PRECONDITION for a set of another config or
// whose files disagree.
// With `resolved` (the config whose fingerprint `config_fingerprint` is), a
// file of another config that holds its own names the fields that differ.
absl::StatusOr<std::optional<ShardCheckpoint>> ReshardedCheckpoint(
    const std::string& dir, uint64_t num_params, int shard, int num_shards,
    uint64_t config_fingerprint, const TrainingConfig* resolved = nullptr);

// FAILED_PRECONDITION, with both values in the message, when `checkpoint`
// belongs to another config, shard or shard count, or its weights are not
// `num_weights` float32 values. With `resolved` (the config whose
// fingerprint `config_fingerprint` is), a checkpoint of another config that
// holds its own also names the fields that differ.
absl::Status CheckCheckpointMatches(const ShardCheckpoint& checkpoint,
                                    uint64_t config_fingerprint, int shard,
                                    int num_shards, uint64_t num_weights,
                                    const TrainingConfig* resolved = nullptr);

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_CHECKPOINT_H_
