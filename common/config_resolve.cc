// ResolveConfig (common/config.h): the defaults that depend on the mode,
// which options each mode takes, and the ranges of every field, read from
// the tables below where they differ by mode.
#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/config.h"
#include "common/log.h"
#include "common/model_config.h"
#include "common/model_layout.h"
#include "common/sparse_table_config.h"

namespace monsoon::common {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("config field '", field, "' ", what));
}

// ---------------------------------------------------------------------------
// What ResolveConfig reads from tables: each mode's defaults, and which
// options each mode takes. A new mode is a row of kModeDefaults (and its
// line in common/modes.def; a mode takes every option unless a row of
// kModeOptions leaves its bit out); a new option that only some modes take
// is a row of kModeOptions.

// A set of modes, one bit per Mode.
using ModeSet = uint32_t;
constexpr ModeSet ModeBit(Mode mode) { return ModeSet{1} << mode; }
constexpr ModeSet kSync = ModeBit(SYNC);
constexpr ModeSet kDownpour = ModeBit(DOWNPOUR);
constexpr ModeSet kEasgd = ModeBit(EASGD);
constexpr ModeSet kHogwild = ModeBit(HOGWILD);
constexpr ModeSet kOnebit = ModeBit(ONEBIT);
constexpr ModeSet kAllreduce = ModeBit(ALLREDUCE);
// The modes whose pushes may be stale: those that staleness control is for.
constexpr ModeSet kAsynchronous = kDownpour | kOnebit | kHogwild;
// A ModeReason for whatever mode the entries before it did not name.
constexpr ModeSet kAnyMode = ~ModeSet{0};

// The defaults of the fields whose default depends on the mode (see
// proto/config.proto).
struct ModeDefaults {
  Mode mode;
  Optimizer optimizer;
  // The optimizer when the config asks for 1-bit pushes (compression
  // ONEBIT): SGD with sync's momentum 0.9 on 1-bit gradients diverged (0.30
  // test accuracy after an epoch, against 0.848 with Adagrad and 0.838 with
  // momentum 0, 2 servers, 2 workers), so sync takes Adagrad there too.
  Optimizer onebit_optimizer;
  float learning_rate;
  float momentum;
  float local_learning_rate;
  float local_momentum;
  Compression compression;
};

constexpr ModeDefaults kModeDefaults[] = {
    {SYNC, SGD, ADAGRAD, 0.05f, 0.9f, 0.05f, 0.0f, COMPRESSION_NONE},
    {DOWNPOUR, ADAGRAD, ADAGRAD, 0.05f, 0.0f, 0.05f, 0.0f, COMPRESSION_NONE},
    {EASGD, SGD, SGD, 0.05f, 0.0f, 0.01f, 0.9f, COMPRESSION_NONE},
    {HOGWILD, SGD, SGD, 0.1f, 0.0f, 0.05f, 0.0f, COMPRESSION_NONE},
    {ONEBIT, ADAGRAD, ADAGRAD, 0.05f, 0.0f, 0.05f, 0.0f, COMPRESSION_ONEBIT},
    // sync's rule, applied by every worker after the ring's average.
    {ALLREDUCE, SGD, SGD, 0.05f, 0.9f, 0.05f, 0.0f, COMPRESSION_NONE},
};

// A model preset's own hyperparameters (TrainingConfig.model), taken where
// the config leaves a field unset, before the mode's defaults: what the
// preset was tuned with, so that it trains as shipped. LeNet at the MLP's
// defaults (sync: SGD 0.05 with momentum 0.9) never learned: 0.10 test
// accuracy for 15 epochs. With weight decay, the rates' fall after 10
// epochs and these rates every run ended at 0.887-0.907 after 20 epochs
// (tools/results/RESULTS.md, "Comparing a communication-bound and a
// compute-bound model"). 0 below: the mode's default.
struct PresetDefaults {
  Model model;
  Mode mode;
  float learning_rate;
  float local_learning_rate;
};
constexpr float kLenetWeightDecay = 0.0005f;
constexpr int kLenetLrDecayEpochs = 10;
constexpr PresetDefaults kPresetDefaults[] = {
    {LENET, SYNC, 0.01f, 0},
    {LENET, ALLREDUCE, 0.01f, 0},
    {LENET, HOGWILD, 0.05f, 0},
    {LENET, EASGD, 0, 0.03f},
};

// Sets the unset fields that `preset` (the config's model before it is
// resolved) has values of its own for.
void FillPresetDefaults(Model preset, TrainingConfig* c) {
  if (preset != LENET) return;
  if (!c->has_weight_decay()) c->set_weight_decay(kLenetWeightDecay);
  if (!c->has_lr_decay_epochs()) c->set_lr_decay_epochs(kLenetLrDecayEpochs);
  if (!c->has_output_init()) c->set_output_init(ZERO);
  for (const PresetDefaults& d : kPresetDefaults) {
    if (d.model != preset || d.mode != c->mode()) continue;
    if (d.learning_rate > 0 && !c->has_learning_rate()) {
      c->set_learning_rate(d.learning_rate);
    }
    if (d.local_learning_rate > 0 && !c->has_local_learning_rate()) {
      c->set_local_learning_rate(d.local_learning_rate);
    }
  }
}

// Every mode: those with defaults.
constexpr ModeSet AllModes() {
  ModeSet modes = 0;
  for (const ModeDefaults& defaults : kModeDefaults) {
    modes |= ModeBit(defaults.mode);
  }
  return modes;
}
constexpr ModeSet kAllModes = AllModes();

// `mode`'s row of kModeDefaults; null for a mode that has none
// (MODE_UNSPECIFIED).
const ModeDefaults* DefaultsFor(Mode mode) {
  for (const ModeDefaults& defaults : kModeDefaults) {
    if (defaults.mode == mode) return &defaults;
  }
  return nullptr;
}

// Why the modes in `modes` have no use for an option, said after the
// mode's name.
struct ModeReason {
  ModeSet modes;
  const char* reason;
};

// An option, or a value of one, that only some modes take. Where
// `in_use` holds for a config whose mode is not in `modes`, the config is
// refused naming `field`: the message is `what`, then, where `reasons`
// names the mode (the first entry that does), the mode's name and the
// reason. Where `valid` is given, a value for which it does not hold is
// refused next, with `range` saying what is allowed. A row without
// `in_use` checks the range alone.
struct ModeOption {
  const char* field;
  bool (*in_use)(const TrainingConfig&);
  ModeSet modes;
  const char* what;
  ModeReason reasons[3];
  bool (*valid)(const TrainingConfig&);
  const char* range;
};

// What each mode's update rule takes: checked right after the defaults.
constexpr ModeOption kUpdateRuleOptions[] = {
    {"optimizer", [](const TrainingConfig& c) { return c.optimizer() != SGD; },
     kAllModes & ~kHogwild,
     "must be SGD in hogwild: lock-free shards apply plain SGD, which keeps "
     "no state"},
    {"momentum", [](const TrainingConfig& c) { return c.momentum() != 0; },
     kAllModes & ~kHogwild, "must be 0 in hogwild (plain SGD)"},
    {"compression",
     [](const TrainingConfig& c) {
       return c.compression() != COMPRESSION_ONEBIT;
     },
     kAllModes & ~kOnebit, "must be ONEBIT (or unset) in mode onebit"},
    {"compression",
     [](const TrainingConfig& c) {
       return c.compression() == COMPRESSION_ONEBIT;
     },
     kSync | kDownpour | kOnebit,
     "ONEBIT works with sync, downpour and onebit only; ",
     {{kAllreduce,
       "'s ring sums float32 segments hop by hop: 1-bit codes would have to "
       "be decoded, summed and quantized again at every member (not built)"},
      {kEasgd, " pushes elastic differences, not gradients"},
      {kHogwild, "'s lock-free shards apply plain float32 SGD"}}},
};

// Staleness control, backup workers and compressed pulls: checked after
// the ranges of the options every mode takes.
constexpr ModeOption kModeOptions[] = {
    {"max_staleness",
     [](const TrainingConfig& c) { return c.has_max_staleness(); },
     kAsynchronous,
     "bounds the staleness of downpour, onebit and hogwild; ",
     {{kSync | kAllreduce, " is already a barrier (staleness 0)"},
      {kAnyMode,
       " exchanges elastic differences every tau steps, which it does not "
       "bound"}},
     [](const TrainingConfig& c) {
       return c.max_staleness() >= 0 && c.max_staleness() <= 1000000;
     },
     "must be from 0 to 1000000 steps"},
    {"staleness_lr",
     [](const TrainingConfig& c) { return c.staleness_lr(); },
     kAsynchronous,
     "scales the learning rate of stale pushes in downpour, onebit and "
     "hogwild; ",
     {{kSync | kAllreduce, "'s gradients are never stale"},
      {kAnyMode, " pushes elastic differences, not gradients"}}},
    // delay_compensation's range comes before its modes (a row that every
    // mode takes), as it always did: 200 in sync is refused as out of range.
    {"delay_compensation",
     nullptr,
     kAnyMode,
     "",
     {},
     [](const TrainingConfig& c) {
       return c.delay_compensation() >= 0 && c.delay_compensation() <= 100;
     },
     "must be from 0 to 100"},
    {"delay_compensation",
     [](const TrainingConfig& c) { return c.delay_compensation() > 0; },
     kDownpour | kOnebit,
     "compensates pushed gradients in downpour and onebit; ",
     {{kHogwild,
       " writes the weights without a lock, so the shard has no consistent "
       "weights to compensate against"},
      {kSync | kAllreduce, "'s gradients are never stale"},
      {kAnyMode, " pushes elastic differences, not gradients"}}},
    {"backup_workers",
     [](const TrainingConfig& c) { return c.backup_workers() != 0; },
     kSync,
     "lets sync steps close without the slowest workers; ",
     {{kAllreduce, "'s ring needs every worker's part at every step"},
      {kAnyMode, " has no steps to close"}},
     [](const TrainingConfig& c) { return c.backup_workers() >= 0; },
     "must be at least 0 (and fewer than the workers)"},
    {"sparse_rows_async",
     [](const TrainingConfig& c) { return c.sparse_rows_async(); },
     kSync,
     "lets sync's rows go asynchronous while its dense part waits at the "
     "barrier; ",
     {{kAnyMode, "'s rows are asynchronous already"}}},
    {"pull_compression",
     [](const TrainingConfig& c) {
       return c.pull_compression() == COMPRESSION_ONEBIT;
     },
     kSync | kDownpour | kOnebit,
     "ONEBIT works in sync, downpour and onebit; ",
     {{kAllreduce, "'s workers pull nothing: the ring carries the step"},
      {kAnyMode, "'s compressed pulls are not built"}}},
    // Outside sync the shard keeps each worker's copy, which only holds
    // when every step fetches and pushes.
    {"pull_compression",
     [](const TrainingConfig& c) {
       return c.pull_compression() == COMPRESSION_ONEBIT &&
              (c.n_fetch() != 1 || c.n_push() != 1);
     },
     kSync,
     "ONEBIT in downpour and onebit needs n_fetch and n_push 1: a worker's "
     "local steps between fetches change the copy a compressed pull is a "
     "difference from"},
    {"pull_compression",
     [](const TrainingConfig& c) {
       return c.pull_compression() == COMPRESSION_ONEBIT &&
              c.delay_compensation() > 0;
     },
     ModeSet{0},
     "ONEBIT and delay_compensation do not work together yet: the "
     "compensation would need each worker's compressed copy, not the "
     "weights pulled"},
};

// The first row of `options` that `c` breaks, refused as the row says; OK
// when it breaks none.
absl::Status CheckModeOptions(const TrainingConfig& c,
                              absl::Span<const ModeOption> options) {
  const ModeSet mode = ModeBit(c.mode());
  for (const ModeOption& option : options) {
    if ((option.modes & mode) == 0 && option.in_use != nullptr &&
        option.in_use(c)) {
      for (const ModeReason& reason : option.reasons) {
        if ((reason.modes & mode) == 0) continue;
        return Invalid(
            option.field,
            absl::StrCat(option.what, ModeName(c.mode()), reason.reason));
      }
      return Invalid(option.field, option.what);
    }
    if (option.valid != nullptr && !option.valid(c)) {
      return Invalid(option.field, option.range);
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// The steps of ResolveConfig.

// Sets every field the config leaves unset to its default, `defaults` for
// those that depend on the mode, so that the fingerprint covers them.
void FillDefaults(const ModeDefaults& defaults, TrainingConfig* c) {
  if (c->optimizer() == OPTIMIZER_AUTO) {
    c->set_optimizer(c->compression() == COMPRESSION_ONEBIT
                         ? defaults.onebit_optimizer
                         : defaults.optimizer);
  }
  if (!c->has_learning_rate()) c->set_learning_rate(defaults.learning_rate);
  if (!c->has_momentum()) c->set_momentum(defaults.momentum);
  if (!c->has_local_learning_rate()) {
    c->set_local_learning_rate(defaults.local_learning_rate);
  }
  if (!c->has_local_momentum()) c->set_local_momentum(defaults.local_momentum);
  if (c->compression() == COMPRESSION_AUTO) {
    c->set_compression(defaults.compression);
  }
  c->set_tau(c->tau());
  c->set_onebit_bucket_size(c->onebit_bucket_size());
  c->set_adagrad_initial_accumulator(c->adagrad_initial_accumulator());
  c->set_batch_size(c->batch_size());
  c->set_n_fetch(c->n_fetch());
  c->set_n_push(c->n_push());
  c->set_epochs(c->epochs());
  c->set_seed(c->seed());
  c->set_data_dir(c->data_dir());
  c->set_call_timeout_s(c->call_timeout_s());
  c->set_chunk_bytes(c->chunk_bytes());
  c->set_input_mean(c->input_mean());
  c->set_input_std(c->input_std());
}

// The ranges of the options every mode takes (learning rates, batches,
// epochs, inputs, EASGD's and 1-bit's parameters, the sync timeout).
absl::Status CheckRanges(const TrainingConfig& c) {
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
  if (c.call_timeout_s() < 1) {
    return Invalid("call_timeout_s", "must be at least 1 second");
  }
  return absl::OkStatus();
}

// The ranges of weight decay, the learning-rate schedule and the chunk
// size: checked last.
absl::Status CheckDecayAndChunkRanges(const TrainingConfig& c) {
  if (!(c.weight_decay() >= 0 && c.weight_decay() < 1)) {
    return Invalid("weight_decay", "must be in [0, 1)");
  }
  if (c.lr_decay_epochs() < 0) {
    return Invalid("lr_decay_epochs", "must be 0 (no schedule) or more");
  }
  if (c.has_lr_decay_factor() &&
      !(c.lr_decay_factor() > 0 && c.lr_decay_factor() <= 1)) {
    return Invalid("lr_decay_factor", "must be in (0, 1]");
  }
  // A factor with lr_decay_epochs: 0 given is no schedule (a variant that
  // turns off a preset's); a factor alone is a forgotten field.
  if (c.has_lr_decay_factor() && !c.has_lr_decay_epochs()) {
    return Invalid("lr_decay_factor",
                   "is set but lr_decay_epochs is not: set lr_decay_epochs "
                   "to the epochs between decays, or remove lr_decay_factor");
  }
  if (c.chunk_bytes() < (256 << 10) || c.chunk_bytes() > (4 << 20) ||
      c.chunk_bytes() % 4 != 0) {
    return Invalid("chunk_bytes",
                   "must be a multiple of 4 from 262144 (256 KiB) to 4194304 "
                   "(4 MiB)");
  }
  return absl::OkStatus();
}

// Elastic workers: the modes and options whose state follows the live
// ranks; data_shard_batches in range, its default set.
absl::Status CheckElastic(TrainingConfig* c) {
  if (!c->elastic()) {
    if (c->has_data_shard_batches()) {
      return Invalid("data_shard_batches",
                     "is for elastic runs (elastic: true), whose data is "
                     "handed out in data shards; without it each worker "
                     "trains its rank's part");
    }
    c->clear_elastic();
    return absl::OkStatus();
  }
  const char* why = nullptr;
  if (c->mode() == ALLREDUCE) {
    why = "is not built for mode allreduce: the ring's members are fixed "
          "when it forms";
  } else if (c->sparse_tables_size() > 0) {
    why = "does not work with sparse_tables yet: click data is not handed "
          "out in data shards";
  }
  if (why != nullptr) return Invalid("elastic", why);
  if (!c->has_data_shard_batches()) c->set_data_shard_batches(8);
  if (c->data_shard_batches() < 1 || c->data_shard_batches() > 1000000) {
    return Invalid("data_shard_batches", "must be from 1 to 1000000");
  }
  return absl::OkStatus();
}

// Off is off however it is spelt: an option set to what leaves it off is
// cleared, so that the fingerprint is that of the config without it. Also
// gives a learning-rate schedule its default factor.
void ClearWhatIsOff(TrainingConfig* c) {
  if (c->pull_compression() == COMPRESSION_AUTO ||
      c->pull_compression() == COMPRESSION_NONE) {
    c->clear_pull_compression();
  }
  if (c->weight_decay() == 0) c->clear_weight_decay();
  if (c->lr_decay_epochs() == 0 || c->lr_decay_factor() == 1) {
    c->clear_lr_decay_epochs();
    c->clear_lr_decay_factor();
  } else if (!c->has_lr_decay_factor()) {
    c->set_lr_decay_factor(0.1f);
  }
  if (!c->staleness_lr()) c->clear_staleness_lr();
  if (c->delay_compensation() == 0) c->clear_delay_compensation();
  if (c->backup_workers() == 0) c->clear_backup_workers();
  if (!c->sparse_rows_async()) c->clear_sparse_rows_async();
  if (c->output_init() != ZERO) c->clear_output_init();
  if (!c->push_after_backward()) c->clear_push_after_backward();
}

// Fields read under an old name: sync_timeout_s is call_timeout_s (it was
// always every mode's call deadline). The old name alone is taken, with a
// warning; both with different values is a mistake.
absl::Status ReadOldNames(TrainingConfig* c) {
  if (!c->has_sync_timeout_s()) return absl::OkStatus();
  if (c->has_call_timeout_s() && c->call_timeout_s() != c->sync_timeout_s()) {
    return Invalid(
        "sync_timeout_s",
        absl::StrCat("is the old name of call_timeout_s, and the config "
                     "gives both, with different values (",
                     c->sync_timeout_s(), " and ", c->call_timeout_s(),
                     "): keep call_timeout_s only"));
  }
  common::LogWarning(
      "config: sync_timeout_s is the old name of call_timeout_s (how long "
      "one call of a worker to a shard may take, in every mode); read as "
      "call_timeout_s: %d. Rename it in the config.",
      c->sync_timeout_s());
  c->set_call_timeout_s(c->sync_timeout_s());
  c->clear_sync_timeout_s();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainingConfig> ResolveConfig(const TrainingConfig& input,
                                             const DataShape* data) {
  TrainingConfig c = input;
  if (absl::Status renamed = ReadOldNames(&c); !renamed.ok()) return renamed;
  const Model preset = c.model();  // ResolveModel clears it
  if (absl::Status model = ResolveModel(data, &c); !model.ok()) return model;
  c.set_mode(c.mode());
  FillPresetDefaults(preset, &c);
  const ModeDefaults* defaults = DefaultsFor(c.mode());
  if (defaults == nullptr) {
    return Invalid("mode", absl::StrCat("must be one of ", ModeNames()));
  }
  FillDefaults(*defaults, &c);
  // The checks in this order: a config with several faults is refused for
  // the first, as it always was.
  if (absl::Status s = CheckModeOptions(c, kUpdateRuleOptions); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRanges(c); !s.ok()) return s;
  if (absl::Status s = CheckModeOptions(c, kModeOptions); !s.ok()) return s;
  if (absl::Status s = CheckDecayAndChunkRanges(c); !s.ok()) return s;
  if (c.sparse_rows_async() && c.model() != SPARSE_LR) {
    return Invalid("sparse_rows_async",
                   "is for model SPARSE_LR, whose workers send the rows; a "
                   "script sends its rows when it calls mt.sparse_push");
  }
  if (absl::Status s = ValidateSparseTables(c.sparse_tables(), c.sparse_buckets());
      !s.ok()) {
    return s;
  }
  if (c.mode() == ALLREDUCE && c.sparse_tables_size() > 0) {
    return Invalid("sparse_tables",
                   "are not trained in mode allreduce: rows live on the "
                   "shards, and a ring carries dense gradients only (use sync, "
                   "with sparse_rows_async for the hybrid)");
  }
  if (c.output_init() == ZERO && c.tensors_size() > 0) {
    return Invalid("output_init",
                   "is for models made of layers: a script's model starts "
                   "from the initial_weights its rank 0 writes, and "
                   "sparse_lr's dense part from zero already");
  }
  if (absl::Status s = CheckElastic(&c); !s.ok()) return s;
  // The resolved config says the scale the rows start with.
  for (SparseTableConfig& table : *c.mutable_sparse_tables()) {
    if (!table.has_init_scale()) {
      table.set_init_scale(static_cast<float>(1.0 / std::sqrt(table.dim())));
    }
  }
  ClearWhatIsOff(&c);
  return c;
}

}  // namespace monsoon::common
