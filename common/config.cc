#include "common/config.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/text_format.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/model_config.h"
#include "common/model_layout.h"

namespace monsoon::common {
namespace {

// Collects parser errors so that the message names the line and column.
class ErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (!errors_.empty()) errors_ += "; ";
    absl::StrAppend(&errors_, "line ", line + 1, " column ", column + 1, ": ",
                    message);
  }
  const std::string& errors() const { return errors_; }

 private:
  std::string errors_;
};

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("config field '", field, "' ", what));
}

}  // namespace

absl::StatusOr<TrainingConfig> ParseConfigText(absl::string_view text) {
  TrainingConfig config;
  google::protobuf::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &config)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot parse the training config (text-format "
                     "monsoon.TrainingConfig): ",
                     errors.errors()));
  }
  return config;
}

absl::StatusOr<TrainingConfig> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(
        "cannot read the config file '", path, "': check the --config path"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  absl::StatusOr<TrainingConfig> config = ParseConfigText(buffer.str());
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

absl::StatusOr<TrainingConfig> LoadResolvedConfig(const std::string& path,
                                                  const std::string& data_dir) {
  TrainingConfig raw;
  if (!path.empty()) {
    absl::StatusOr<TrainingConfig> loaded = LoadConfigFile(path);
    if (!loaded.ok()) return loaded.status();
    raw = *std::move(loaded);
  }
  if (!data_dir.empty()) raw.set_data_dir(data_dir);
  absl::StatusOr<TrainingConfig> resolved = ResolveConfigWithData(raw);
  if (!resolved.ok() && !path.empty()) {
    return absl::Status(resolved.status().code(),
                        absl::StrCat(path, ": ", resolved.status().message()));
  }
  return resolved;
}

absl::StatusOr<TrainingConfig> ResolveConfigWithData(
    const TrainingConfig& config) {
  if (!ModelNeedsData(config)) return ResolveConfig(config);
  absl::StatusOr<DataShape> data = ReadDataShape(config.data_dir());
  if (!data.ok()) {
    return absl::Status(
        data.status().code(),
        absl::StrCat("the model takes its input shape and classes from the "
                     "training data, which cannot be read (or set "
                     "input_shape and num_classes in the config): ",
                     data.status().message()));
  }
  return ResolveConfig(config, &*data);
}

absl::StatusOr<TrainingConfig> ResolveConfig(const TrainingConfig& input,
                                             const DataShape* data) {
  TrainingConfig c = input;
  if (absl::Status model = ResolveModel(data, &c); !model.ok()) return model;
  c.set_mode(c.mode());
  if (c.mode() == MODE_UNSPECIFIED) {
    return Invalid("mode",
                   "must be one of sync, downpour, easgd, hogwild, onebit");
  }
  // 1-bit pushes take Adagrad, in sync too: SGD with sync's momentum 0.9
  // on 1-bit gradients diverged (0.30 test accuracy after an epoch, against
  // 0.848 with Adagrad and 0.838 with momentum 0, 2 servers, 2 workers).
  const bool sync_onebit =
      c.mode() == SYNC && c.compression() == COMPRESSION_ONEBIT;
  if (c.optimizer() == OPTIMIZER_AUTO) {
    c.set_optimizer(c.mode() == DOWNPOUR || c.mode() == ONEBIT || sync_onebit
                        ? ADAGRAD
                        : SGD);
  }
  if (c.mode() == HOGWILD && c.optimizer() != SGD) {
    return Invalid("optimizer",
                   "must be SGD in hogwild: lock-free shards "
                   "apply plain SGD, which keeps no state");
  }
  if (!c.has_learning_rate()) {
    c.set_learning_rate(c.mode() == HOGWILD ? 0.1f : 0.05f);
  }
  if (!c.has_momentum()) c.set_momentum(c.mode() == SYNC ? 0.9f : 0.0f);
  if (c.mode() == HOGWILD && c.momentum() != 0) {
    return Invalid("momentum", "must be 0 in hogwild (plain SGD)");
  }
  if (!c.has_local_learning_rate()) {
    c.set_local_learning_rate(c.mode() == EASGD ? 0.01f : 0.05f);
  }
  if (!c.has_local_momentum()) {
    c.set_local_momentum(c.mode() == EASGD ? 0.9f : 0.0f);
  }
  if (c.compression() == COMPRESSION_AUTO) {
    c.set_compression(c.mode() == ONEBIT ? COMPRESSION_ONEBIT
                                         : COMPRESSION_NONE);
  }
  if (c.mode() == ONEBIT && c.compression() != COMPRESSION_ONEBIT) {
    return Invalid("compression", "must be ONEBIT (or unset) in mode onebit");
  }
  if ((c.mode() == EASGD || c.mode() == HOGWILD) &&
      c.compression() == COMPRESSION_ONEBIT) {
    return Invalid("compression",
                   "ONEBIT works with sync, downpour and onebit only");
  }
  c.set_tau(c.tau());
  c.set_onebit_bucket_size(c.onebit_bucket_size());
  c.set_adagrad_initial_accumulator(c.adagrad_initial_accumulator());
  c.set_batch_size(c.batch_size());
  c.set_n_fetch(c.n_fetch());
  c.set_n_push(c.n_push());
  c.set_epochs(c.epochs());
  c.set_seed(c.seed());
  c.set_data_dir(c.data_dir());
  c.set_sync_timeout_s(c.sync_timeout_s());
  c.set_chunk_bytes(c.chunk_bytes());
  c.set_input_mean(c.input_mean());
  c.set_input_std(c.input_std());

  auto positive_finite = [](float v) { return v > 0 && v < 1e6f; };
  if (!positive_finite(c.learning_rate())) {
    return Invalid("learning_rate", "must be a positive number below 1e6");
  }
  if (!positive_finite(c.local_learning_rate())) {
    return Invalid("local_learning_rate",
                   "must be a positive number below 1e6");
  }
  if (!(c.momentum() >= 0 && c.momentum() < 1)) {
    return Invalid("momentum", "must be in [0, 1)");
  }
  if (!positive_finite(c.adagrad_initial_accumulator())) {
    return Invalid("adagrad_initial_accumulator", "must be positive");
  }
  if (c.batch_size() < 1 || c.batch_size() > 65536) {
    return Invalid("batch_size", "must be in [1, 65536]");
  }
  if (const uint64_t largest =
          ModelLayout::FromConfig(c).LargestBufferPerExample();
      largest * c.batch_size() >= (uint64_t{1} << 31)) {
    return Invalid(
        "batch_size",
        absl::StrCat("is too large for this model: a batch's "
                     "largest buffer would hold ",
                     largest * c.batch_size(), " values, from 2^31 on"));
  }
  if (c.n_fetch() < 1) return Invalid("n_fetch", "must be at least 1");
  if (c.n_push() < 1) return Invalid("n_push", "must be at least 1");
  if (c.epochs() < 1 || c.epochs() > 100000) {
    return Invalid("epochs", "must be in [1, 100000]");
  }
  if (!(c.input_std() > 0 && c.input_std() < 1e6f)) {
    return Invalid("input_std", "must be a positive number below 1e6");
  }
  if (!(c.input_mean() > -1e6f && c.input_mean() < 1e6f)) {
    return Invalid("input_mean", "must be a finite number");
  }
  if (c.tau() < 1) return Invalid("tau", "must be at least 1");
  if (c.has_alpha() && !(c.alpha() > 0 && c.alpha() < 1)) {
    return Invalid("alpha", "must be in (0, 1)");
  }
  if (!(c.local_momentum() >= 0 && c.local_momentum() < 1)) {
    return Invalid("local_momentum", "must be in [0, 1)");
  }
  if (c.onebit_bucket_size() < 1 || c.onebit_bucket_size() > (1 << 20)) {
    return Invalid("onebit_bucket_size", "must be in [1, 1048576]");
  }
  if (c.sync_timeout_s() < 1) {
    return Invalid("sync_timeout_s", "must be at least 1 second");
  }
  const bool asynchronous =
      c.mode() == DOWNPOUR || c.mode() == ONEBIT || c.mode() == HOGWILD;
  if (c.has_max_staleness()) {
    if (!asynchronous) {
      return Invalid("max_staleness",
                     absl::StrCat("bounds the staleness of downpour, onebit "
                                  "and hogwild; ",
                                  ModeName(c.mode()),
                                  c.mode() == SYNC
                                      ? " is already a barrier (staleness 0)"
                                      : " exchanges elastic differences every "
                                        "tau steps, which it does not bound"));
    }
    if (c.max_staleness() < 0 || c.max_staleness() > 1000000) {
      return Invalid("max_staleness", "must be from 0 to 1000000 steps");
    }
  }
  if (c.staleness_lr() && !asynchronous) {
    return Invalid(
        "staleness_lr",
        absl::StrCat("scales the learning rate of stale pushes in "
                     "downpour, onebit and hogwild; ",
                     ModeName(c.mode()),
                     c.mode() == SYNC ? "'s pushes are never stale"
                                      : " pushes elastic differences, not "
                                        "gradients"));
  }
  if (c.has_delay_compensation()) {
    if (!(c.delay_compensation() >= 0 && c.delay_compensation() <= 100)) {
      return Invalid("delay_compensation", "must be from 0 to 100");
    }
    if (c.delay_compensation() > 0 && c.mode() != DOWNPOUR &&
        c.mode() != ONEBIT) {
      return Invalid(
          "delay_compensation",
          absl::StrCat("compensates pushed gradients in downpour and onebit; ",
                       ModeName(c.mode()),
                       c.mode() == HOGWILD
                           ? " writes the weights without a lock, so the "
                             "shard has no consistent weights to compensate "
                             "against"
                       : c.mode() == SYNC ? "'s pushes are never stale"
                                          : " pushes elastic differences, "
                                            "not gradients"));
    }
  }
  if (c.has_backup_workers()) {
    if (c.backup_workers() != 0 && c.mode() != SYNC) {
      return Invalid(
          "backup_workers",
          absl::StrCat("lets sync steps close without the slowest "
                       "workers; ",
                       ModeName(c.mode()), " has no steps to close"));
    }
    if (c.backup_workers() < 0) {
      return Invalid("backup_workers",
                     "must be at least 0 (and fewer than the workers)");
    }
  }
  if (c.pull_compression() == COMPRESSION_ONEBIT) {
    if (c.mode() != SYNC && c.mode() != DOWNPOUR && c.mode() != ONEBIT) {
      return Invalid("pull_compression",
                     absl::StrCat("ONEBIT works in sync, downpour and onebit; ",
                                  ModeName(c.mode()),
                                  "'s compressed pulls are not built"));
    }
    if (c.mode() != SYNC && (c.n_fetch() != 1 || c.n_push() != 1)) {
      return Invalid("pull_compression",
                     "ONEBIT in downpour and onebit needs n_fetch and n_push "
                     "1: a worker's local steps between fetches change the "
                     "copy a compressed pull is a difference from");
    }
    if (c.delay_compensation() > 0) {
      return Invalid("pull_compression",
                     "ONEBIT and delay_compensation do not work together yet: "
                     "the compensation would need each worker's compressed "
                     "copy, not the weights pulled");
    }
  }
  if (c.pull_compression() == COMPRESSION_AUTO ||
      c.pull_compression() == COMPRESSION_NONE) {
    c.clear_pull_compression();
  }
  if (!(c.weight_decay() >= 0 && c.weight_decay() < 1)) {
    return Invalid("weight_decay", "must be in [0, 1)");
  }
  if (c.weight_decay() == 0) c.clear_weight_decay();
  if (c.lr_decay_epochs() < 0) {
    return Invalid("lr_decay_epochs", "must be 0 (no schedule) or more");
  }
  if (c.has_lr_decay_factor() &&
      !(c.lr_decay_factor() > 0 && c.lr_decay_factor() <= 1)) {
    return Invalid("lr_decay_factor", "must be in (0, 1]");
  }
  if (c.has_lr_decay_factor() && c.lr_decay_epochs() == 0) {
    return Invalid("lr_decay_factor",
                   "is set but lr_decay_epochs is not: set lr_decay_epochs "
                   "to the epochs between decays, or remove lr_decay_factor");
  }
  if (c.lr_decay_epochs() == 0 || c.lr_decay_factor() == 1) {
    c.clear_lr_decay_epochs();
    c.clear_lr_decay_factor();
  } else if (!c.has_lr_decay_factor()) {
    c.set_lr_decay_factor(0.1f);
  }
  // Off is off however it is spelt: the same fingerprint as unset.
  if (!c.staleness_lr()) c.clear_staleness_lr();
  if (c.delay_compensation() == 0) c.clear_delay_compensation();
  if (c.backup_workers() == 0) c.clear_backup_workers();
  if (c.chunk_bytes() < (256 << 10) || c.chunk_bytes() > (4 << 20) ||
      c.chunk_bytes() % 4 != 0) {
    return Invalid("chunk_bytes",
                   "must be a multiple of 4 from 262144 (256 KiB) to 4194304 "
                   "(4 MiB)");
  }
  return c;
}

uint64_t ConfigFingerprint(const TrainingConfig& resolved) {
  TrainingConfig copy = resolved;
  copy.clear_data_dir();
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    copy.SerializeToCodedStream(&coded);
  }
  // FNV-1a: stable across processes and builds, unlike absl::Hash.
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char byte : bytes) {
    hash ^= byte;
    hash *= 1099511628211ull;
  }
  return hash;
}

std::string ModeName(Mode mode) {
  return absl::AsciiStrToLower(Mode_Name(mode));
}

absl::StatusOr<Mode> ParseMode(absl::string_view name) {
  Mode mode;
  if (!Mode_Parse(absl::AsciiStrToUpper(name), &mode) ||
      mode == MODE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown mode '", name,
                     "'; use one of sync, downpour, easgd, hogwild, onebit"));
  }
  return mode;
}

std::string OptimizerName(Optimizer optimizer) {
  if (optimizer == OPTIMIZER_AUTO) return "auto";
  return absl::AsciiStrToLower(Optimizer_Name(optimizer));
}

std::string ConfigToText(const TrainingConfig& config) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(config, &text);
  return text;
}

absl::StatusOr<std::vector<int>> ParseIntList(absl::string_view text) {
  std::vector<int> values;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int value;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &value) ||
        value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", part, "' in '", text,
                       "' is not a positive integer (expected e.g. 256,128)"));
    }
    values.push_back(value);
  }
  return values;
}

}  // namespace monsoon::common
