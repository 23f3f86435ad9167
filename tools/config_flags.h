// Training-config flags shared by the tools that start clusters: --config
// (a base file) and overrides for --epochs, --learning_rate,
// --local_learning_rate, --batch_size, --hidden, --seed, --n_fetch, --n_push,
// --data_dir and --elastic. Read them after absl::ParseCommandLine. Not thread-safe.
#ifndef MONSOON_TOOLS_CONFIG_FLAGS_H_
#define MONSOON_TOOLS_CONFIG_FLAGS_H_

#include "absl/status/statusor.h"
#include "proto/config.pb.h"

namespace monsoon::tools {

// The resolved config: the --config file (or every default), `mode` unless
// it is MODE_UNSPECIFIED, `model` (a preset replacing the file's model)
// unless it is MODEL_AUTO, then the override flags; the model's input shape
// and classes come from the data where the config leaves them open.
// INVALID_ARGUMENT or NOT_FOUND say which flag or file is wrong.
absl::StatusOr<TrainingConfig> ConfigFromFlags(Mode mode,
                                               Model model = MODEL_AUTO);

// Whether the run is elastic: --elastic, or `config` (if given) says so.
bool ElasticFromFlags(const TrainingConfig* config = nullptr);

// Makes --help list these flags as well as those of `main_file` (a path
// fragment such as "tools/launch_local_main.cc"). Call before parsing.
void ShowConfigFlagsInHelp(const char* main_file);

}  // namespace monsoon::tools

#endif  // MONSOON_TOOLS_CONFIG_FLAGS_H_
