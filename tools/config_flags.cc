// Training-config flags shared by launch_local and compare_modes: a base
// config file plus overrides for the fields people vary most. The flags are
// defined here, so every binary that links this library has them.
#include "tools/config_flags.h"

#include "absl/flags/flag.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/flag_env.h"

ABSL_FLAG(int, epochs, 0,
          "Passes over each worker's data (0: the config's, "
          "default 3).");
ABSL_FLAG(std::string, config, "",
          "Base training config (text-format "
          "monsoon.TrainingConfig); the flags below override it.");
ABSL_FLAG(double, learning_rate, 0,
          "Server optimizer's learning rate (0: "
          "the config's or the mode's default).");
ABSL_FLAG(double, local_learning_rate, 0,
          "Workers' local learning rate in "
          "downpour (0: the config's or 0.05).");
ABSL_FLAG(int, batch_size, 0,
          "Examples per worker step (0: the config's, "
          "default 64).");
ABSL_FLAG(std::string, hidden, "",
          "The MLP's hidden layer sizes, e.g. 256,128 (empty: the config's, "
          "default 256,128); its input and output sizes come from the data.");
ABSL_FLAG(int64_t, seed, -1,
          "Seed for initial weights and shuffles (-1: "
          "the config's, default 1).");
ABSL_FLAG(int, n_fetch, 0, "downpour: pull every n_fetch steps (0: config).");
ABSL_FLAG(int, n_push, 0, "downpour: push every n_push steps (0: config).");
ABSL_FLAG(std::string, data_dir, "",
          "IDX data set folder, or for sparse_lr a folder with train.libsvm "
          "and test.libsvm (empty: the config's, default "
          "/usr/share/datasets/fashion-mnist).");

ABSL_FLAG(bool, elastic, false,
          "Elastic workers (config field elastic): workers may join and "
          "leave the run (--chaos=add:worker@T,remove:workerN@T), and the "
          "data is handed out by shard 0 in data shards of "
          "data_shard_batches batches rather than split by rank (a "
          "--worker_cmd script takes them from monsoon.torch.Batches). Every "
          "mode but allreduce.");

namespace monsoon::tools {

bool ElasticFromFlags(const TrainingConfig* config) {
  return absl::GetFlag(FLAGS_elastic) ||
         (config != nullptr && config->elastic());
}

absl::StatusOr<TrainingConfig> ConfigFromFlags(Mode mode, Model model) {
  TrainingConfig config;
  if (!absl::GetFlag(FLAGS_config).empty()) {
    auto loaded = common::LoadConfigFile(absl::GetFlag(FLAGS_config));
    if (!loaded.ok()) return loaded.status();
    config = *loaded;
  }
  if (mode != MODE_UNSPECIFIED) config.set_mode(mode);
  if (model != MODEL_AUTO) {
    // The preset replaces whatever model the base config describes.
    config.clear_layers();
    config.clear_layer_sizes();
    config.clear_input_shape();
    config.clear_num_classes();
    config.set_model(model);
  }
  if (absl::GetFlag(FLAGS_epochs) != 0) {
    config.set_epochs(absl::GetFlag(FLAGS_epochs));
  }
  if (absl::GetFlag(FLAGS_learning_rate) != 0) {
    config.set_learning_rate(absl::GetFlag(FLAGS_learning_rate));
  }
  if (absl::GetFlag(FLAGS_local_learning_rate) != 0) {
    config.set_local_learning_rate(absl::GetFlag(FLAGS_local_learning_rate));
  }
  if (absl::GetFlag(FLAGS_batch_size) != 0) {
    config.set_batch_size(absl::GetFlag(FLAGS_batch_size));
  }
  if (absl::GetFlag(FLAGS_seed) >= 0) {
    config.set_seed(static_cast<uint64_t>(absl::GetFlag(FLAGS_seed)));
  }
  if (absl::GetFlag(FLAGS_n_fetch) != 0) {
    config.set_n_fetch(absl::GetFlag(FLAGS_n_fetch));
  }
  if (absl::GetFlag(FLAGS_n_push) != 0) {
    config.set_n_push(absl::GetFlag(FLAGS_n_push));
  }
  if (!absl::GetFlag(FLAGS_data_dir).empty()) {
    config.set_data_dir(absl::GetFlag(FLAGS_data_dir));
  }
  if (absl::GetFlag(FLAGS_elastic)) config.set_elastic(true);
  if (!absl::GetFlag(FLAGS_hidden).empty()) {
    auto hidden = common::ParseIntList(absl::GetFlag(FLAGS_hidden));
    if (!hidden.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--hidden: ", hidden.status().message()));
    }
    if (config.model() == LENET || config.layers_size() > 0) {
      return absl::InvalidArgumentError(
          "--hidden sets an MLP's hidden layer sizes, but the model is not an "
          "MLP: leave out --hidden or the config's model/layers");
    }
    // Hidden sizes between the data's input and classes (or the input and
    // output sizes of the config's layer_sizes).
    config.clear_model();
    if (config.layer_sizes_size() >= 2) {
      const int input = config.layer_sizes(0);
      const int output = config.layer_sizes(config.layer_sizes_size() - 1);
      config.clear_layer_sizes();
      config.add_layer_sizes(input);
      for (int h : *hidden) config.add_layer_sizes(h);
      config.add_layer_sizes(output);
    } else {
      config.clear_layer_sizes();
      for (int h : *hidden) {
        config.add_layers()->mutable_dense()->set_units(h);
        config.add_layers()->mutable_relu();
      }
      config.add_layers()->mutable_dense();
    }
  }
  return common::ResolveConfigWithData(config);
}

void ShowConfigFlagsInHelp(const char* main_file) {
  common::ShowFlagsInHelp(main_file, {"tools/config_flags.cc"});
}

}  // namespace monsoon::tools
