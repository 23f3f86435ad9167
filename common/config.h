// Loading, resolving and fingerprinting the training config
// (proto/config.proto). Every daemon reads the same text-format file, resolves
// the mode-dependent defaults with ResolveConfig, and presents
// ConfigFingerprint at registration. Stateless; thread-safe.
#ifndef MONSOON_COMMON_CONFIG_H_
#define MONSOON_COMMON_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/data_shape.h"
#include "proto/config.pb.h"

namespace monsoon::common {

// Parses text-format TrainingConfig. INVALID_ARGUMENT names the line on error.
absl::StatusOr<TrainingConfig> ParseConfigText(absl::string_view text);

// Reads and parses a config file. NOT_FOUND when it cannot be read.
absl::StatusOr<TrainingConfig> LoadConfigFile(const std::string& path);

// Loads `path` (every default when empty), sets data_dir when it is not
// empty (a daemon's --data_dir), and resolves it with ResolveConfigWithData.
absl::StatusOr<TrainingConfig> LoadResolvedConfig(
    const std::string& path, const std::string& data_dir = "");

// Fills every default (mode-dependent ones included) so that every field is
// set explicitly, and validates ranges. INVALID_ARGUMENT says which field is
// wrong and what is allowed. The model's input shape and classes come from
// `data` where the config leaves them open (common/model_config.h); with
// `data` null such a config is INVALID_ARGUMENT. Resolving a resolved
// config changes nothing.
absl::StatusOr<TrainingConfig> ResolveConfig(const TrainingConfig& config,
                                             const DataShape* data = nullptr);

// ResolveConfig, first reading the training data's shape from data_dir
// when the model needs it (ModelNeedsData); the data's errors (NOT_FOUND,
// INVALID_ARGUMENT) say so.
absl::StatusOr<TrainingConfig> ResolveConfigWithData(
    const TrainingConfig& config);

// A stable 64-bit hash of everything in a resolved config that must agree
// between daemons (all but data_dir and initial_weights).
uint64_t ConfigFingerprint(const TrainingConfig& resolved);

// The fields in which two resolved configs differ, in the config's order,
// one per line as "field: theirs -> mine" in text format ("[a, b]" for a
// repeated field, "(unset)" for one not set), at most `max_fields`, then
// "... and N more" when there are more. Empty when they agree on
// everything ConfigFingerprint covers (all but data_dir and
// initial_weights).
std::string ConfigDifferences(const TrainingConfig& theirs,
                              const TrainingConfig& mine, int max_fields = 3);

// "sync", "downpour", ... and back. ParseMode accepts either case.
std::string ModeName(Mode mode);
// Every mode's name, in the enum's order: "sync, downpour, ...".
std::string ModeNames();
absl::StatusOr<Mode> ParseMode(absl::string_view name);
// OK when a training script (the monsoon Python package) can train in
// `mode`; UNIMPLEMENTED, saying why and what to use instead, when not
// (allreduce). The script and the launchers that start scripts both ask.
absl::Status CheckScriptMode(Mode mode);

// "sgd", "adagrad"; "auto" for OPTIMIZER_AUTO.
std::string OptimizerName(Optimizer optimizer);

// The text format of a config, for writing a file that other daemons read.
std::string ConfigToText(const TrainingConfig& config);

// Parses "256,128" into layer sizes. INVALID_ARGUMENT on a non-positive or
// non-numeric entry.
absl::StatusOr<std::vector<int>> ParseIntList(absl::string_view text);

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_CONFIG_H_
