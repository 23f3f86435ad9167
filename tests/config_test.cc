#include "common/config.h"

#include <google/protobuf/util/message_differencer.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/model_config.h"
#include "common/model_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace monsoon::common {
namespace {

using ::monsoon::testutil::IsOkAndHolds;
using ::monsoon::testutil::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

TrainingConfig Parse(const std::string& text) {
  absl::StatusOr<TrainingConfig> config = ParseConfigText(text);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : TrainingConfig();
}

// What Fashion-MNIST's training files say: 28x28 greyscale, 10 classes.
const DataShape& FashionMnist() {
  static const DataShape* shape = new DataShape{{28, 28, 1}, 10};
  return *shape;
}

TrainingConfig Resolve(const std::string& text,
                       const DataShape& data = FashionMnist()) {
  absl::StatusOr<TrainingConfig> config = ResolveConfig(Parse(text), &data);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : TrainingConfig();
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

TEST(ResolveConfigTest, EmptyConfigResolvesToSyncDefaults) {
  const TrainingConfig c = Resolve("");
  EXPECT_THAT(c.layer_sizes(), ElementsAre(784, 256, 128, 10));
  EXPECT_EQ(c.mode(), SYNC);
  EXPECT_EQ(c.optimizer(), SGD);
  // proto/config.proto: unset learning_rate is 0.05 whatever the optimizer.
  EXPECT_FLOAT_EQ(c.learning_rate(), 0.05f);
  EXPECT_FLOAT_EQ(c.momentum(), 0.9f);
  EXPECT_FLOAT_EQ(c.local_learning_rate(), 0.05f);
  EXPECT_FLOAT_EQ(c.adagrad_initial_accumulator(), 0.1f);
  EXPECT_EQ(c.batch_size(), 64);
  EXPECT_EQ(c.n_fetch(), 1);
  EXPECT_EQ(c.n_push(), 1);
  EXPECT_EQ(c.epochs(), 3);
  EXPECT_EQ(c.seed(), 1u);
  EXPECT_EQ(c.data_dir(), "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(c.call_timeout_s(), 120);
  EXPECT_FALSE(c.has_sync_timeout_s());
  EXPECT_EQ(c.chunk_bytes(), 1048576);
  EXPECT_FLOAT_EQ(c.input_mean(), 0.2860f);
  EXPECT_FLOAT_EQ(c.input_std(), 0.3530f);
  // Every field is set explicitly, so the fingerprint covers the defaults.
  EXPECT_TRUE(c.has_mode());
  EXPECT_TRUE(c.has_optimizer());
  EXPECT_TRUE(c.has_learning_rate());
  EXPECT_TRUE(c.has_momentum());
  EXPECT_TRUE(c.has_batch_size());
  EXPECT_TRUE(c.has_seed());
  EXPECT_TRUE(c.has_chunk_bytes());
  EXPECT_TRUE(c.has_input_mean());
  EXPECT_TRUE(c.has_input_std());
}

// Found by the config fuzzer: an MLP given as layers on a wide input
// resolved, but its canonical form (layer_sizes) was refused for an input
// of more than 2^20 values. Both forms now take the same limits.
TEST(ResolveConfigTest, AnMlpResolvesAgainInItsCanonicalForm) {
  ASSERT_OK_AND_ASSIGN(
      TrainingConfig parsed,
      ParseConfigText("layers { dense { units: 84 } } layers { relu {} } "
                      "layers { dense { units: 10 } } "
                      "input_shape: [28, 28, 8576]"));
  ASSERT_OK_AND_ASSIGN(TrainingConfig resolved, ResolveConfig(parsed));
  EXPECT_THAT(resolved.layer_sizes(), ElementsAre(6723584, 84, 10));
  ASSERT_OK_AND_ASSIGN(TrainingConfig again,
                       ParseConfigText(ConfigToText(resolved)));
  ASSERT_OK_AND_ASSIGN(TrainingConfig resolved_again, ResolveConfig(again));
  EXPECT_EQ(ConfigFingerprint(resolved_again), ConfigFingerprint(resolved));

  ASSERT_OK_AND_ASSIGN(parsed, ParseConfigText("layer_sizes: [16777217, 10]"));
  EXPECT_THAT(ResolveConfig(parsed),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the input needs 1 to 16777216 values")));
}

TEST(ResolveConfigTest, ExternalModelTensors) {
  TrainingConfig config;
  config.add_tensors()->set_name("fc.weight");
  config.mutable_tensors(0)->add_dims(10);
  config.mutable_tensors(0)->add_dims(784);
  config.set_initial_weights("/somewhere/run.weights");
  absl::StatusOr<TrainingConfig> resolved = ResolveConfig(config);
  ASSERT_OK(resolved.status());
  EXPECT_EQ(ModelLayout::FromConfig(*resolved).num_params(), 7840u);
  EXPECT_THAT(CheckBuiltInModel(*resolved),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("first 'fc.weight'")));
  // The path is not part of the fingerprint; the tensors are.
  TrainingConfig moved = *resolved;
  moved.set_initial_weights("/elsewhere/run.weights");
  EXPECT_EQ(ConfigFingerprint(moved), ConfigFingerprint(*resolved));
  moved.mutable_tensors(0)->set_dims(0, 11);
  EXPECT_NE(ConfigFingerprint(moved), ConfigFingerprint(*resolved));

  TrainingConfig twice = config;
  *twice.add_tensors() = config.tensors(0);
  EXPECT_THAT(ResolveConfig(twice),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("repeats the name 'fc.weight'")));
  TrainingConfig empty_side = config;
  empty_side.mutable_tensors(0)->set_dims(1, 0);
  EXPECT_THAT(ResolveConfig(empty_side),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("has a side of 0")));
  TrainingConfig both = config;
  both.set_model(LENET);
  EXPECT_THAT(ResolveConfig(both),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("keep only tensors")));
  TrainingConfig no_tensors;
  no_tensors.set_initial_weights("/w");
  EXPECT_THAT(ResolveConfig(no_tensors),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("only for a model given as `tensors`")));
}

TEST(ResolveConfigTest, DownpourDefaultsToAdagradWithoutMomentum) {
  const TrainingConfig c = Resolve("mode: DOWNPOUR");
  EXPECT_EQ(c.mode(), DOWNPOUR);
  EXPECT_EQ(c.optimizer(), ADAGRAD);
  EXPECT_FLOAT_EQ(c.learning_rate(), 0.05f);
  EXPECT_FLOAT_EQ(c.momentum(), 0.0f);
}

TEST(ResolveConfigTest, EveryModeResolvesWithItsOwnDefaults) {
  const TrainingConfig easgd = Resolve("mode: EASGD");
  EXPECT_EQ(easgd.optimizer(), SGD);
  EXPECT_FLOAT_EQ(easgd.learning_rate(), 0.05f);
  EXPECT_FLOAT_EQ(easgd.momentum(), 0.0f);
  EXPECT_FLOAT_EQ(easgd.local_learning_rate(), 0.01f);
  EXPECT_FLOAT_EQ(easgd.local_momentum(), 0.9f);
  EXPECT_EQ(easgd.tau(), 4);
  EXPECT_FALSE(easgd.has_alpha());  // 0.9 / workers, chosen by the worker
  EXPECT_EQ(easgd.compression(), COMPRESSION_NONE);

  const TrainingConfig hogwild = Resolve("mode: HOGWILD");
  EXPECT_EQ(hogwild.optimizer(), SGD);
  EXPECT_FLOAT_EQ(hogwild.learning_rate(), 0.1f);
  EXPECT_FLOAT_EQ(hogwild.momentum(), 0.0f);
  EXPECT_EQ(hogwild.compression(), COMPRESSION_NONE);

  const TrainingConfig onebit = Resolve("mode: ONEBIT");
  EXPECT_EQ(onebit.optimizer(), ADAGRAD);
  EXPECT_FLOAT_EQ(onebit.learning_rate(), 0.05f);
  EXPECT_EQ(onebit.compression(), COMPRESSION_ONEBIT);
  EXPECT_EQ(onebit.onebit_bucket_size(), 512);

  // Compression is its own axis: 1-bit pushes with the sync barrier.
  const TrainingConfig sync_onebit = Resolve("compression: COMPRESSION_ONEBIT");
  EXPECT_EQ(sync_onebit.mode(), SYNC);
  EXPECT_EQ(sync_onebit.compression(), COMPRESSION_ONEBIT);
  EXPECT_EQ(Resolve("").compression(), COMPRESSION_NONE);
}

// allreduce applies sync's rule on every worker, and refuses what a ring
// does not do, each with its reason.
TEST(ResolveConfigTest, AllreduceTakesSyncsRuleAndRefusesWhatARingCannotDo) {
  const TrainingConfig allreduce = Resolve("mode: ALLREDUCE");
  EXPECT_EQ(allreduce.optimizer(), SGD);
  EXPECT_FLOAT_EQ(allreduce.learning_rate(), 0.05f);
  EXPECT_FLOAT_EQ(allreduce.momentum(), 0.9f);
  EXPECT_EQ(allreduce.compression(), COMPRESSION_NONE);
  const struct {
    const char* text;
    const char* why;
  } refused[] = {
      {"compression: COMPRESSION_ONEBIT", "sums float32 segments hop by hop"},
      {"backup_workers: 1", "needs every worker's part at every step"},
      {"max_staleness: 2", "is already a barrier"},
      {"staleness_lr: true", "gradients are never stale"},
      {"pull_compression: COMPRESSION_ONEBIT", "pull nothing"},
      {"sparse_tables { name: \"emb\" dim: 4 max_rows: 100 }",
       "rows live on the shards"},
  };
  for (const auto& c : refused) {
    SCOPED_TRACE(c.text);
    EXPECT_THAT(
        ResolveConfig(Parse(absl::StrCat("mode: ALLREDUCE ", c.text)),
                      &FashionMnist()),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.why)));
  }
}

// SGD with sync's momentum diverged on 1-bit pushes: sync with them takes
// Adagrad unless the config names an optimizer.
TEST(ResolveConfigTest, SyncWithOneBitPushesDefaultsToAdagrad) {
  EXPECT_EQ(Resolve("mode: SYNC compression: COMPRESSION_ONEBIT").optimizer(),
            ADAGRAD);
  EXPECT_EQ(Resolve("mode: SYNC").optimizer(), SGD);
  EXPECT_EQ(Resolve("mode: SYNC compression: COMPRESSION_ONEBIT optimizer: "
                    "SGD")
                .optimizer(),
            SGD);
}

TEST(ResolveConfigTest, ExplicitOptimizerKeepsTheModesMomentumDefault) {
  const TrainingConfig sync_adagrad = Resolve("optimizer: ADAGRAD");
  EXPECT_EQ(sync_adagrad.optimizer(), ADAGRAD);
  EXPECT_FLOAT_EQ(sync_adagrad.learning_rate(), 0.05f);
  EXPECT_FLOAT_EQ(sync_adagrad.momentum(), 0.9f);

  const TrainingConfig downpour_sgd = Resolve("mode: DOWNPOUR optimizer: SGD");
  EXPECT_EQ(downpour_sgd.optimizer(), SGD);
  EXPECT_FLOAT_EQ(downpour_sgd.learning_rate(), 0.05f);
  EXPECT_FLOAT_EQ(downpour_sgd.momentum(), 0.0f);
}

TEST(ResolveConfigTest, ExplicitValuesWin) {
  const TrainingConfig c = Resolve(
      "layer_sizes: 20 layer_sizes: 10 mode: DOWNPOUR learning_rate: 0.5 "
      "momentum: 0.25 batch_size: 7 epochs: 2 seed: 9 chunk_bytes: 262144 "
      "local_learning_rate: 0.125 data_dir: '/data' input_mean: 0 "
      "input_std: 1");
  EXPECT_THAT(c.layer_sizes(), ElementsAre(20, 10));
  EXPECT_EQ(c.optimizer(), ADAGRAD);
  EXPECT_FLOAT_EQ(c.learning_rate(), 0.5f);
  EXPECT_FLOAT_EQ(c.momentum(), 0.25f);
  EXPECT_FLOAT_EQ(c.local_learning_rate(), 0.125f);
  EXPECT_EQ(c.batch_size(), 7);
  EXPECT_EQ(c.epochs(), 2);
  EXPECT_EQ(c.seed(), 9u);
  EXPECT_EQ(c.chunk_bytes(), 262144);
  EXPECT_EQ(c.data_dir(), "/data");
  EXPECT_FLOAT_EQ(c.input_mean(), 0.0f);
  EXPECT_FLOAT_EQ(c.input_std(), 1.0f);
}

TEST(ResolveConfigTest, ResolvingTwiceChangesNothing) {
  const TrainingConfig once = Resolve("mode: DOWNPOUR batch_size: 32");
  absl::StatusOr<TrainingConfig> twice = ResolveConfig(once);
  ASSERT_OK(twice.status());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(once, *twice));
}

struct InvalidCase {
  const char* text;
  const char* field;
};

TEST(ResolveConfigTest, InvalidValuesAreRefusedNamingTheField) {
  const InvalidCase cases[] = {
      {"layer_sizes: 784", "layer_sizes"},
      {"layer_sizes: 784 layer_sizes: 1", "layer_sizes"},
      {"layer_sizes: 0 layer_sizes: 10", "layer_sizes"},
      {"layer_sizes: -5 layer_sizes: 10", "layer_sizes"},
      {"layer_sizes: 784 layer_sizes: 2000000 layer_sizes: 10", "layer_sizes"},
      {"mode: MODE_UNSPECIFIED", "mode"},
      {"weight_decay: -0.001", "weight_decay"},
      {"weight_decay: 1", "weight_decay"},
      {"weight_decay: nan", "weight_decay"},
      {"lr_decay_epochs: -1", "lr_decay_epochs"},
      {"lr_decay_epochs: 5 lr_decay_factor: 0", "lr_decay_factor"},
      {"lr_decay_epochs: 5 lr_decay_factor: 1.5", "lr_decay_factor"},
      {"lr_decay_epochs: 5 lr_decay_factor: nan", "lr_decay_factor"},
      {"lr_decay_factor: 0.5", "lr_decay_factor"},
      {"batch_size: 65536 layer_sizes: [65536, 10]", "batch_size"},
      {"learning_rate: 0", "learning_rate"},
      {"learning_rate: -0.1", "learning_rate"},
      {"learning_rate: nan", "learning_rate"},
      {"learning_rate: inf", "learning_rate"},
      {"local_learning_rate: 0", "local_learning_rate"},
      {"momentum: 1", "momentum"},
      {"momentum: -0.5", "momentum"},
      {"momentum: nan", "momentum"},
      {"adagrad_initial_accumulator: 0", "adagrad_initial_accumulator"},
      {"batch_size: 0", "batch_size"},
      {"batch_size: 65537", "batch_size"},
      {"n_fetch: 0", "n_fetch"},
      {"n_push: -1", "n_push"},
      {"epochs: 0", "epochs"},
      {"epochs: 100001", "epochs"},
      {"call_timeout_s: 0", "call_timeout_s"},
      {"sync_timeout_s: 0", "call_timeout_s"},
      {"input_std: 0", "input_std"},
      {"input_std: -1", "input_std"},
      {"input_std: nan", "input_std"},
      {"input_mean: inf", "input_mean"},
      {"input_mean: nan", "input_mean"},
      {"mode: HOGWILD optimizer: ADAGRAD", "optimizer"},
      {"mode: HOGWILD momentum: 0.5", "momentum"},
      {"mode: ONEBIT compression: COMPRESSION_NONE", "compression"},
      {"mode: EASGD compression: COMPRESSION_ONEBIT", "compression"},
      {"mode: HOGWILD compression: COMPRESSION_ONEBIT", "compression"},
      {"mode: EASGD tau: 0", "tau"},
      {"mode: EASGD alpha: 1", "alpha"},
      {"mode: EASGD alpha: 0", "alpha"},
      {"local_momentum: 1", "local_momentum"},
      {"onebit_bucket_size: 0", "onebit_bucket_size"},
      {"onebit_bucket_size: 1048577", "onebit_bucket_size"},
      {"chunk_bytes: 262140", "chunk_bytes"},
      {"chunk_bytes: 262146", "chunk_bytes"},
      {"chunk_bytes: 4194308", "chunk_bytes"},
      {"mode: SYNC max_staleness: 2", "max_staleness"},
      {"mode: EASGD max_staleness: 2", "max_staleness"},
      {"mode: DOWNPOUR max_staleness: -1", "max_staleness"},
      {"mode: SYNC staleness_lr: true", "staleness_lr"},
      {"mode: EASGD staleness_lr: true", "staleness_lr"},
      {"mode: HOGWILD delay_compensation: 0.04", "delay_compensation"},
      {"mode: SYNC delay_compensation: 0.04", "delay_compensation"},
      {"mode: EASGD delay_compensation: 0.04", "delay_compensation"},
      {"mode: DOWNPOUR delay_compensation: -0.1", "delay_compensation"},
      {"mode: DOWNPOUR delay_compensation: nan", "delay_compensation"},
      {"mode: DOWNPOUR backup_workers: 1", "backup_workers"},
      {"mode: SYNC backup_workers: -1", "backup_workers"},
      {"mode: EASGD pull_compression: COMPRESSION_ONEBIT", "pull_compression"},
      {"mode: HOGWILD pull_compression: COMPRESSION_ONEBIT",
       "pull_compression"},
      {"mode: DOWNPOUR n_fetch: 2 pull_compression: COMPRESSION_ONEBIT",
       "pull_compression"},
      {"mode: DOWNPOUR delay_compensation: 0.04 "
       "pull_compression: COMPRESSION_ONEBIT",
       "pull_compression"},
  };
  for (const InvalidCase& c : cases) {
    SCOPED_TRACE(c.text);
    EXPECT_THAT(ResolveConfig(Parse(c.text), &FashionMnist()),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("'", c.field, "'"))));
  }
}

TEST(ParseConfigTextTest, ErrorNamesTheLine) {
  EXPECT_THAT(ParseConfigText("mode: SYNC\nbatch_size: 32\nno_such_field: 3\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("line 3"), HasSubstr("no_such_field"))));
  EXPECT_THAT(
      ParseConfigText("mode: SYNC\nbatch_size: many\n"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 2")));
  // Protobuf reports an unknown enum value at the token after it, so the
  // message names the value rather than relying on the line.
  EXPECT_THAT(ParseConfigText("batch_size: 32\nmode: FASTEST\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"FASTEST\" for field \"mode\"")));
}

// A field or enum value a typo away from a real one is named; a name like
// none is not guessed at.
TEST(ParseConfigTextTest, ErrorSuggestsTheFieldOrValueMeant) {
  EXPECT_THAT(ParseConfigText("learnin_rate: 0.1"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("has no field named \"learnin_rate\". Did "
                                 "you mean \"learning_rate\"?")));
  EXPECT_THAT(ParseConfigText("sparse_tables { nme: 'emb' }"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Did you mean \"name\"?")));
  EXPECT_THAT(ParseConfigText("mode: downpour"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("for field \"mode\". Did you mean "
                                 "\"DOWNPOUR\"?")));
  EXPECT_THAT(ParseConfigText("optimizer: ADAGRED"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Did you mean \"ADAGRAD\"?")));
  EXPECT_THAT(ParseConfigText("zzzzzz: 1"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("has no field named \"zzzzzz\""),
                             Not(HasSubstr("Did you mean")))));
}

TEST(ParseConfigTextTest, TextOfAConfigParsesBackToTheSameConfig) {
  const TrainingConfig resolved = Resolve("mode: DOWNPOUR n_push: 4");
  absl::StatusOr<TrainingConfig> again =
      ParseConfigText(ConfigToText(resolved));
  ASSERT_OK(again.status());
  EXPECT_TRUE(
      google::protobuf::util::MessageDifferencer::Equals(resolved, *again));
}

TEST(LoadConfigFileTest, MissingFileIsNotFoundNamingThePath) {
  const std::string path = TempPath("no-such-config.textproto");
  EXPECT_THAT(LoadConfigFile(path),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  EXPECT_THAT(LoadResolvedConfig(path),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST(LoadConfigFileTest, ErrorsNameTheFileAndTheLine) {
  const std::string path = TempPath("bad.textproto");
  {
    std::ofstream out(path);
    out << "mode: DOWNPOUR\nbatch_size: 16\nbatch_size: x\n";
  }
  EXPECT_THAT(LoadConfigFile(path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(path), HasSubstr("line 3"))));

  const std::string invalid = TempPath("invalid.textproto");
  {
    std::ofstream out(invalid);
    out << "batch_size: 0\n";
  }
  EXPECT_THAT(LoadResolvedConfig(invalid),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(invalid), HasSubstr("'batch_size'"))));
}

TEST(LoadConfigFileTest, LoadsAndResolvesAFile) {
  const std::string path = TempPath("good.textproto");
  {
    std::ofstream out(path);
    out << "# a comment\nmode: DOWNPOUR\nlayer_sizes: [20, 16, 10]\n";
  }
  absl::StatusOr<TrainingConfig> config = LoadResolvedConfig(path);
  ASSERT_OK(config.status());
  EXPECT_EQ(config->mode(), DOWNPOUR);
  EXPECT_EQ(config->optimizer(), ADAGRAD);
  EXPECT_THAT(config->layer_sizes(), ElementsAre(20, 16, 10));
}

TEST(LoadResolvedConfigTest, EmptyPathMeansEveryDefault) {
  absl::StatusOr<TrainingConfig> config = LoadResolvedConfig("");
  ASSERT_OK(config.status());
  EXPECT_TRUE(
      google::protobuf::util::MessageDifferencer::Equals(*config, Resolve("")));
}

TEST(ConfigFingerprintTest, EqualConfigsHaveEqualFingerprints) {
  EXPECT_EQ(ConfigFingerprint(Resolve("mode: SYNC batch_size: 32")),
            ConfigFingerprint(Resolve("batch_size: 32\nmode: SYNC\n")));
  // Spelling out a default is the same config.
  EXPECT_EQ(ConfigFingerprint(Resolve("")),
            ConfigFingerprint(
                Resolve("mode: SYNC optimizer: SGD momentum: 0.9 epochs: 3 "
                        "layer_sizes: [784, 256, 128, 10] batch_size: 64")));
  EXPECT_EQ(ConfigFingerprint(Resolve("")),
            ConfigFingerprint(Resolve("weight_decay: 0")));
  EXPECT_NE(ConfigFingerprint(Resolve("")),
            ConfigFingerprint(Resolve("weight_decay: 0.0005")));
  // No learning-rate schedule however it is spelt; the factor's default.
  EXPECT_EQ(ConfigFingerprint(Resolve("")),
            ConfigFingerprint(Resolve("lr_decay_epochs: 0")));
  EXPECT_EQ(
      ConfigFingerprint(Resolve("")),
      ConfigFingerprint(Resolve("lr_decay_epochs: 10 lr_decay_factor: 1")));
  EXPECT_EQ(
      ConfigFingerprint(Resolve("lr_decay_epochs: 10")),
      ConfigFingerprint(Resolve("lr_decay_epochs: 10 lr_decay_factor: 0.1")));
  EXPECT_NE(ConfigFingerprint(Resolve("")),
            ConfigFingerprint(Resolve("lr_decay_epochs: 10")));
  EXPECT_NE(ConfigFingerprint(Resolve("lr_decay_epochs: 10")),
            ConfigFingerprint(Resolve("lr_decay_epochs: 5")));
}

// sync_timeout_s, the old name of call_timeout_s, is still read.
TEST(ResolveConfigTest, TheOldNameOfTheCallTimeoutIsReadAsIt) {
  const TrainingConfig old_name = Resolve("mode: DOWNPOUR sync_timeout_s: 30");
  EXPECT_EQ(old_name.call_timeout_s(), 30);
  EXPECT_FALSE(old_name.has_sync_timeout_s());
  EXPECT_EQ(Resolve("sync_timeout_s: 30 call_timeout_s: 30").call_timeout_s(),
            30);
  const DataShape data = FashionMnist();
  absl::StatusOr<TrainingConfig> both =
      ResolveConfig(Parse("sync_timeout_s: 30 call_timeout_s: 40"), &data);
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(both.status().message()),
              HasSubstr("'sync_timeout_s' is the old name of "
                        "call_timeout_s"));
}

// The fingerprints of older builds (their ps_server logs "config %016x"),
// from before call_timeout_s had its name: a run or a checkpoint of those
// builds still matches.
TEST(ConfigFingerprintTest, IsTheSameAsBeforeTheCallTimeoutWasRenamed) {
  EXPECT_EQ(ConfigFingerprint(Resolve("layer_sizes: [784, 256, 128, 10]")),
            0xd6d3f87621dc2e6bULL);
  EXPECT_EQ(ConfigFingerprint(Resolve("layer_sizes: [784, 256, 128, 10] "
                                      "call_timeout_s: 60 mode: DOWNPOUR")),
            0xa6d9ff54fc9cc800ULL);
  EXPECT_EQ(ConfigFingerprint(Resolve("layer_sizes: [784, 256, 128, 10] "
                                      "sync_timeout_s: 60 mode: DOWNPOUR")),
            0xa6d9ff54fc9cc800ULL);
}

TEST(ParseModeTest, TheErrorListsEveryMode) {
  absl::StatusOr<Mode> mode = ParseMode("bsp");
  EXPECT_EQ(mode.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mode.status().message()),
              HasSubstr("use one of sync, downpour, easgd, hogwild, onebit, "
                        "allreduce"));
}

TEST(ConfigFingerprintTest, DiffersWhenTheLearningRateChanges) {
  EXPECT_NE(ConfigFingerprint(Resolve("learning_rate: 0.1")),
            ConfigFingerprint(Resolve("learning_rate: 0.2")));
  EXPECT_NE(ConfigFingerprint(Resolve("")),
            ConfigFingerprint(Resolve("mode: DOWNPOUR")));
  EXPECT_NE(ConfigFingerprint(Resolve("layer_sizes: [784, 10]")),
            ConfigFingerprint(Resolve("layer_sizes: [784, 11]")));
  EXPECT_NE(ConfigFingerprint(Resolve("seed: 1")),
            ConfigFingerprint(Resolve("seed: 2")));
  EXPECT_NE(ConfigFingerprint(Resolve("input_std: 0.5")),
            ConfigFingerprint(Resolve("input_std: 1")));
}

// Each staleness option where it applies, 1-bit compression included; off
// spelt out is the config without it.
TEST(ResolveModelTest, TheDefaultMlpKeepsItsFormAndFingerprint) {
  // The resolved default is exactly what it was before models had layers:
  // layer_sizes and nothing of the new fields, so the same fingerprint
  // (and checkpoints written before still resume).
  const TrainingConfig legacy = Resolve("layer_sizes: [784, 256, 128, 10]");
  for (const char* text :
       {"", "model: MLP",
        "layers { dense { units: 256 } } layers { relu {} } "
        "layers { dense { units: 128 } } layers { relu {} } "
        "layers { flatten {} } layers { dense {} }",
        "model: MLP input_shape: [28, 28, 1] num_classes: 10"}) {
    SCOPED_TRACE(text);
    const TrainingConfig c = Resolve(text);
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(c, legacy));
    EXPECT_FALSE(c.has_model());
    EXPECT_THAT(c.layers(), IsEmpty());
    EXPECT_THAT(c.input_shape(), IsEmpty());
    EXPECT_FALSE(c.has_num_classes());
  }
  // Explicit layer sizes need no data at all.
  EXPECT_OK(ResolveConfig(Parse("layer_sizes: [784, 256, 128, 10]")).status());
}

TEST(ResolveModelTest, LenetResolvesToItsLayersOnTheDatasShape) {
  const TrainingConfig c = Resolve("model: LENET");
  EXPECT_FALSE(c.has_model());
  EXPECT_THAT(c.layer_sizes(), IsEmpty());
  EXPECT_THAT(c.input_shape(), ElementsAre(28, 28, 1));
  EXPECT_EQ(c.num_classes(), 10);
  ASSERT_EQ(c.layers_size(), 11);
  EXPECT_EQ(c.layers(0).conv().filters(), 6);
  EXPECT_EQ(c.layers(0).conv().padding(), 2);
  EXPECT_EQ(c.layers(0).conv().stride(), 1);  // spelt out
  EXPECT_EQ(c.layers(2).max_pool().stride(), 2);
  EXPECT_EQ(c.layers(10).dense().units(), 10);
  EXPECT_EQ(ModelLayout::FromConfig(c).num_params(), 61706u);
  // Resolved once, it needs no data again and does not change.
  EXPECT_FALSE(ModelNeedsData(c));
  ASSERT_OK_AND_ASSIGN(TrainingConfig twice, ResolveConfig(c));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(c, twice));
  EXPECT_NE(ConfigFingerprint(c), ConfigFingerprint(Resolve("")));
}

TEST(ResolveModelTest, SparseLrResolvesToItsDensePartAndTable) {
  EXPECT_FALSE(ModelNeedsData(Parse("model: SPARSE_LR")));
  ASSERT_OK_AND_ASSIGN(TrainingConfig c,
                       ResolveConfig(Parse("model: SPARSE_LR")));
  EXPECT_EQ(c.model(), SPARSE_LR);  // kept: the workers run it
  ASSERT_EQ(c.tensors_size(), 1);
  EXPECT_EQ(c.tensors(0).name(), "dense");
  EXPECT_THAT(c.tensors(0).dims(), ElementsAre(64));
  ASSERT_EQ(c.sparse_tables_size(), 1);
  EXPECT_EQ(c.sparse_tables(0).name(), "weights");
  EXPECT_EQ(c.sparse_tables(0).dim(), 1);
  EXPECT_EQ(c.sparse_tables(0).optimizer(),
            SparseTableConfig::SPARSE_ROWWISE_ADAGRAD);
  EXPECT_EQ(c.sparse_tables(0).init_scale(), 0.0f);
  EXPECT_EQ(c.sparse_tables(0).learning_rate(), 0.1f);
  EXPECT_EQ(c.sparse_tables(0).adagrad_initial_accumulator(), 1e-4f);
  EXPECT_EQ(c.sparse_tables(0).max_rows(), int64_t{1} << 25);
  EXPECT_OK(CheckBuiltInModel(c));
  ASSERT_OK_AND_ASSIGN(TrainingConfig twice, ResolveConfig(c));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(c, twice));
  // A table of the config's own is kept, if its rows hold one value.
  ASSERT_OK_AND_ASSIGN(
      TrainingConfig own,
      ResolveConfig(Parse("model: SPARSE_LR sparse_tables { name: 'weights' "
                          "dim: 1 max_rows: 1000 optimizer: SPARSE_SGD }")));
  ASSERT_EQ(own.sparse_tables_size(), 1);
  EXPECT_EQ(own.sparse_tables(0).max_rows(), 1000);
  EXPECT_THAT(ResolveConfig(Parse("model: SPARSE_LR sparse_tables { name: "
                                  "'weights' dim: 2 max_rows: 10 }")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'weights' has dim 2")));
  EXPECT_THAT(ResolveConfig(Parse("model: SPARSE_LR layer_sizes: [4, 2]")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("remove layers, layer_sizes")));
  EXPECT_THAT(ResolveConfig(Parse("model: SPARSE_LR tensors { name: 'x' "
                                  "dims: 3 }")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("remove tensors")));
}

TEST(ResolveModelTest, SparseRowsAsyncIsSyncsAndSparseLrsOnly) {
  ASSERT_OK_AND_ASSIGN(
      TrainingConfig c,
      ResolveConfig(Parse("model: SPARSE_LR mode: SYNC sparse_rows_async: true")));
  EXPECT_TRUE(c.sparse_rows_async());
  // false is cleared, so the fingerprint is what it was without the field.
  ASSERT_OK_AND_ASSIGN(
      TrainingConfig off,
      ResolveConfig(Parse("model: SPARSE_LR sparse_rows_async: false")));
  EXPECT_FALSE(off.has_sparse_rows_async());
  EXPECT_THAT(
      ResolveConfig(Parse("model: SPARSE_LR mode: DOWNPOUR "
                          "sparse_rows_async: true")),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("downpour's rows are asynchronous already")));
  EXPECT_THAT(ResolveConfig(Parse("layer_sizes: [4, 2] sparse_rows_async: true")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is for model SPARSE_LR")));
}

TEST(ResolveConfigTest, ElasticTakesItsDataShardsAndRefusesWhatItCannotFollow) {
  ASSERT_OK_AND_ASSIGN(
      TrainingConfig c,
      ResolveConfig(Parse("layer_sizes: [4, 2] mode: SYNC elastic: true")));
  EXPECT_TRUE(c.elastic());
  EXPECT_EQ(c.data_shard_batches(), 8);
  ASSERT_OK_AND_ASSIGN(
      TrainingConfig ssp,
      ResolveConfig(Parse("layer_sizes: [4, 2] mode: DOWNPOUR elastic: true "
                          "max_staleness: 2 data_shard_batches: 3")));
  EXPECT_EQ(ssp.data_shard_batches(), 3);
  // Backup workers count the live members; compressed pulls keep a copy
  // per worker from its first pull until it leaves.
  ASSERT_OK_AND_ASSIGN(
      TrainingConfig backup,
      ResolveConfig(Parse("layer_sizes: [4, 2] mode: SYNC elastic: true "
                          "backup_workers: 1")));
  EXPECT_EQ(backup.backup_workers(), 1);
  ASSERT_OK_AND_ASSIGN(
      TrainingConfig pulls,
      ResolveConfig(Parse("layer_sizes: [4, 2] mode: DOWNPOUR elastic: true "
                          "pull_compression: COMPRESSION_ONEBIT")));
  EXPECT_EQ(pulls.pull_compression(), COMPRESSION_ONEBIT);
  // false is cleared, so the fingerprint is what it was without the field.
  ASSERT_OK_AND_ASSIGN(
      TrainingConfig off,
      ResolveConfig(Parse("layer_sizes: [4, 2] elastic: false")));
  EXPECT_FALSE(off.has_elastic());
  const std::pair<const char*, const char*> refused[] = {
      {"mode: ALLREDUCE elastic: true", "the ring's members are fixed"},
      {"mode: DOWNPOUR elastic: true data_shard_batches: 0",
       "must be from 1 to 1000000"},
      {"mode: DOWNPOUR data_shard_batches: 4", "is for elastic runs"},
  };
  for (const auto& [text, why] : refused) {
    EXPECT_THAT(
        ResolveConfig(Parse(absl::StrCat("layer_sizes: [4, 2] ", text))),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(why)))
        << text;
  }
}

TEST(ResolveModelTest, LenetCarriesTheHyperparametersItWasTunedWith) {
  const TrainingConfig sync = Resolve("model: LENET");
  EXPECT_EQ(sync.mode(), SYNC);
  EXPECT_EQ(sync.learning_rate(), 0.01f);
  EXPECT_EQ(sync.momentum(), 0.9f);  // sync's own
  EXPECT_EQ(sync.weight_decay(), 0.0005f);
  EXPECT_EQ(sync.lr_decay_epochs(), 10);
  EXPECT_EQ(sync.lr_decay_factor(), 0.1f);
  EXPECT_EQ(Resolve("model: LENET mode: HOGWILD").learning_rate(), 0.05f);
  const TrainingConfig easgd = Resolve("model: LENET mode: EASGD");
  EXPECT_EQ(easgd.learning_rate(), 0.05f);  // easgd's own
  EXPECT_EQ(easgd.local_learning_rate(), 0.03f);
  EXPECT_EQ(Resolve("model: LENET mode: DOWNPOUR").learning_rate(), 0.05f);
  // The config wins, field by field; weight_decay 0 turns it off.
  const TrainingConfig own = Resolve(
      "model: LENET learning_rate: 0.02 weight_decay: 0 lr_decay_epochs: 5");
  EXPECT_EQ(own.learning_rate(), 0.02f);
  EXPECT_FALSE(own.has_weight_decay());
  EXPECT_EQ(own.lr_decay_epochs(), 5);
  // lr_decay_epochs 0 turns the preset's schedule off, also on top of a
  // resolved config (a compare_modes variant), whose factor is set.
  EXPECT_FALSE(Resolve("model: LENET lr_decay_epochs: 0").has_lr_decay_epochs());
  TrainingConfig off = sync;
  off.set_lr_decay_epochs(0);
  ASSERT_OK_AND_ASSIGN(TrainingConfig resolved_off, ResolveConfig(off));
  EXPECT_FALSE(resolved_off.has_lr_decay_epochs());
  EXPECT_FALSE(resolved_off.has_lr_decay_factor());
  // The preset's values are in the resolved config, so its fingerprint
  // says which were used; the MLP's defaults are what they were.
  EXPECT_NE(ConfigFingerprint(sync),
            ConfigFingerprint(Resolve("model: LENET learning_rate: 0.05")));
  const TrainingConfig mlp = Resolve("model: MLP");
  EXPECT_EQ(mlp.learning_rate(), 0.05f);
  EXPECT_FALSE(mlp.has_weight_decay());
  EXPECT_FALSE(mlp.has_lr_decay_epochs());
  EXPECT_FALSE(mlp.has_output_init());
}

TEST(ResolveModelTest, LenetsOutputLayerStartsAtZeroUnlessTheConfigSaysHe) {
  EXPECT_EQ(Resolve("model: LENET").output_init(), ZERO);
  EXPECT_EQ(Resolve("model: MLP output_init: ZERO").output_init(), ZERO);
  // He is the default, so saying it leaves the field unset: the
  // fingerprint is that of a config without it. Resolving again keeps it.
  const TrainingConfig he = Resolve("model: LENET output_init: HE_UNIFORM");
  EXPECT_FALSE(he.has_output_init());
  ASSERT_OK_AND_ASSIGN(const TrainingConfig again, ResolveConfig(he));
  EXPECT_FALSE(again.has_output_init());
  EXPECT_NE(ConfigFingerprint(he), ConfigFingerprint(Resolve("model: LENET")));
  EXPECT_FALSE(Resolve("model: MLP output_init: HE_UNIFORM").has_output_init());
  EXPECT_THAT(
      ResolveConfig(Parse("output_init: ZERO tensors { name: 'w' dims: 4 }")),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("'output_init' is for models made of layers")));
}

TEST(ResolveModelTest, ShapesAndClassesComeFromTheData) {
  const DataShape small{{16, 12, 3}, 4};
  EXPECT_THAT(Resolve("", small).layer_sizes(), ElementsAre(576, 256, 128, 4));
  const TrainingConfig lenet = Resolve("model: LENET", small);
  EXPECT_THAT(lenet.input_shape(), ElementsAre(16, 12, 3));
  EXPECT_EQ(lenet.num_classes(), 4);
  // Without the data there is nothing to take them from.
  EXPECT_TRUE(ModelNeedsData(Parse("")));
  EXPECT_TRUE(ModelNeedsData(Parse("model: LENET input_shape: [28, 28, 1]")));
  EXPECT_FALSE(ModelNeedsData(
      Parse("model: LENET input_shape: [28, 28, 1] num_classes: 10")));
  EXPECT_FALSE(ModelNeedsData(
      Parse("layers { dense { units: 3 } } input_shape: [1, 1, 4]")));
  EXPECT_THAT(ResolveConfig(Parse("model: LENET")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'input_shape' is unset"),
                             HasSubstr("data_dir"))));
  EXPECT_THAT(ResolveConfig(Parse("model: LENET input_shape: [28, 28, 1]")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'num_classes' is unset")));
}

TEST(ResolveModelTest, ConflictsAndBadModelsAreRefusedSayingWhatToDo) {
  const struct {
    const char* text;
    const char* message;
  } cases[] = {
      {"model: LENET input_shape: [32, 32, 3]",
       "is 32x32x3 but the data's examples are 28x28x1"},
      {"model: LENET num_classes: 5",
       "is 5 but the training labels go up to 9"},
      {"model: LENET input_shape: [28, 28]", "give [height, width, channels]"},
      {"model: LENET layer_sizes: [784, 10]",
       "describe an MLP, but model is "
       "lenet"},
      {"model: MLP layers { dense {} }", "names the preset mlp and layers"},
      {"layer_sizes: [784, 10] layers { dense {} }", "keep one"},
      {"layer_sizes: [784, 10] num_classes: 9", "ends with 10"},
      {"layer_sizes: [784, 10] input_shape: [28, 28, 2]", "has 1568 values"},
      {"layers { dense { units: 8 } } layers { relu {} }",
       "must end with a dense layer"},
      {"layers { dense {} } layers { dense {} }", "without units"},
      {"layers { dense { units: 7 } }",
       "dense layer of 7 units, but the training labels go up to 9"},
      {"layers { dense { units: 7 } } num_classes: 10",
       "dense layer of 7 units, but the model has 10 classes"},
      {"layers { conv { filters: 2 kernel: 9 } } layers { max_pool {} } "
       "layers { conv { filters: 2 kernel: 11 } } layers { dense {} }",
       "layer 3 (conv 11x11x2): its input is 10x10x2, smaller than the "
       "kernel"},
      {"num_classes: 1", "must be from 2"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    EXPECT_THAT(
        ResolveConfig(Parse(c.text), &FashionMnist()),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
  // LeNet's first pooling leaves 4x4 of 8x8 images, too small for its
  // second conv.
  const DataShape tiny{{8, 8, 1}, 2};
  EXPECT_THAT(ResolveConfig(Parse("model: LENET"), &tiny),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'model' does not fit 8x8x1 examples"),
                             HasSubstr("layer 4 (conv 5x5x16): its input is "
                                       "4x4x6, smaller than the kernel"))));
}

TEST(ResolveModelTest, ModelNamesParseEitherCase) {
  EXPECT_THAT(ParseModel("lenet"), IsOkAndHolds(LENET));
  EXPECT_THAT(ParseModel("MLP"), IsOkAndHolds(MLP));
  EXPECT_THAT(ParseModel("model_auto"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("use mlp, lenet or sparse_lr")));
  EXPECT_THAT(ParseModel("alexnet"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(ModelName(LENET), "lenet");
}

TEST(LoadResolvedConfigTest, ReadsTheShapeFromTheDataDirItIsGiven) {
  const std::string dir = TempPath("other-data");
  std::filesystem::create_directories(dir);
  // Five 3x2x2 images with labels up to 4, and a config that leaves both to
  // the data: another image size and class count with no config change.
  testutil::WriteGzipFile(
      dir + "/train-images-idx3-ubyte.gz",
      testutil::IdxBytes({5, 3, 2, 2}, std::vector<uint8_t>(60, 7)));
  testutil::WriteFile(dir + "/train-labels-idx1-ubyte",
                      testutil::IdxBytes({5}, {0, 4, 1, 2, 3}));
  const std::string path = TempPath("leaves-the-shape.textproto");
  {
    std::ofstream out(path);
    out << "mode: DOWNPOUR\n";
  }
  ASSERT_OK_AND_ASSIGN(TrainingConfig config, LoadResolvedConfig(path, dir));
  EXPECT_EQ(config.data_dir(), dir);
  EXPECT_THAT(config.layer_sizes(), ElementsAre(12, 256, 128, 5));
  EXPECT_THAT(LoadResolvedConfig(path, TempPath("no-data-here")),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr(path),
                             HasSubstr("takes its input shape and classes "
                                       "from the training data"),
                             HasSubstr("train-images-idx3-ubyte"))));
}

TEST(ResolveConfigTest, StalenessOptionsResolveWhereTheyApply) {
  for (const char* text :
       {"mode: DOWNPOUR max_staleness: 4 staleness_lr: true "
        "delay_compensation: 0.04",
        "mode: ONEBIT max_staleness: 0 staleness_lr: true "
        "delay_compensation: 0.04",
        "mode: HOGWILD max_staleness: 2 staleness_lr: true",
        "mode: SYNC backup_workers: 1",
        "mode: SYNC backup_workers: 1 compression: COMPRESSION_ONEBIT",
        "mode: SYNC compression: COMPRESSION_ONEBIT "
        "pull_compression: COMPRESSION_ONEBIT",
        "mode: ONEBIT max_staleness: 2 pull_compression: COMPRESSION_ONEBIT",
        "mode: DOWNPOUR pull_compression: COMPRESSION_ONEBIT"}) {
    SCOPED_TRACE(text);
    EXPECT_OK(ResolveConfig(Parse(text), &FashionMnist()).status());
  }
  EXPECT_EQ(ConfigFingerprint(Resolve("mode: DOWNPOUR")),
            ConfigFingerprint(Resolve("mode: DOWNPOUR staleness_lr: false "
                                      "delay_compensation: 0")));
  EXPECT_EQ(ConfigFingerprint(Resolve("")),
            ConfigFingerprint(Resolve("backup_workers: 0")));
  EXPECT_NE(ConfigFingerprint(Resolve("mode: DOWNPOUR")),
            ConfigFingerprint(Resolve("mode: DOWNPOUR max_staleness: 4")));
}

TEST(ConfigFingerprintTest, IgnoresTheDataDir) {
  EXPECT_EQ(ConfigFingerprint(Resolve("data_dir: '/a'")),
            ConfigFingerprint(Resolve("data_dir: '/somewhere/else'")));
}

// What a client refused for its fingerprint is told: each field that
// differs, in the config's order, whole repeated fields as one.
TEST(ConfigDifferencesTest, NamesEachFieldThatDiffersTheirsThenMine) {
  const TrainingConfig theirs = Resolve("data_dir: '/a'");
  const TrainingConfig mine = Resolve(
      "data_dir: '/b' layer_sizes: [784, 64, 10] learning_rate: 0.1 "
      "batch_size: 32 seed: 7");
  EXPECT_EQ(ConfigDifferences(theirs, mine, /*max_fields=*/10),
            "layer_sizes: [784, 256, 128, 10] -> [784, 64, 10]\n"
            "learning_rate: 0.05 -> 0.1\n"
            "batch_size: 64 -> 32\n"
            "seed: 1 -> 7");
  EXPECT_EQ(ConfigDifferences(theirs, mine, /*max_fields=*/2),
            "layer_sizes: [784, 256, 128, 10] -> [784, 64, 10]\n"
            "learning_rate: 0.05 -> 0.1\n"
            "... and 2 more");
}

TEST(ConfigDifferencesTest, IsEmptyWhereTheFingerprintsAgree) {
  const TrainingConfig a = Resolve("data_dir: '/a'");
  TrainingConfig b = Resolve("data_dir: '/somewhere/else'");
  b.set_initial_weights("/elsewhere/run.weights");
  ASSERT_EQ(ConfigFingerprint(a), ConfigFingerprint(b));
  EXPECT_EQ(ConfigDifferences(a, b), "");
}

TEST(ConfigDifferencesTest, SaysWhichSideLeftAFieldUnset) {
  ASSERT_OK_AND_ASSIGN(TrainingConfig theirs, ParseConfigText("n_push: 2"));
  EXPECT_EQ(ConfigDifferences(theirs, TrainingConfig()),
            "n_push: 2 -> (unset)");
  EXPECT_EQ(ConfigDifferences(TrainingConfig(), theirs),
            "n_push: (unset) -> 2");
}

TEST(ParseModeTest, AcceptsEveryModeInEitherCase) {
  EXPECT_THAT(ParseMode("sync"), IsOkAndHolds(SYNC));
  EXPECT_THAT(ParseMode("DOWNPOUR"), IsOkAndHolds(DOWNPOUR));
  EXPECT_THAT(ParseMode("EaSgd"), IsOkAndHolds(EASGD));
  EXPECT_THAT(ParseMode("hogwild"), IsOkAndHolds(HOGWILD));
  EXPECT_THAT(ParseMode("onebit"), IsOkAndHolds(ONEBIT));
}

TEST(ParseModeTest, RefusesUnknownNamesNamingThem) {
  for (const char* name : {"", "fastest", "mode_unspecified", "sync "}) {
    SCOPED_TRACE(name);
    EXPECT_THAT(ParseMode(name),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("'", name, "'"))));
  }
}

TEST(ModeNameTest, IsTheLowerCaseEnumName) {
  EXPECT_EQ(ModeName(SYNC), "sync");
  EXPECT_EQ(ModeName(DOWNPOUR), "downpour");
  EXPECT_EQ(ModeName(ONEBIT), "onebit");
  for (Mode mode : {SYNC, DOWNPOUR, EASGD, HOGWILD, ONEBIT}) {
    EXPECT_THAT(ParseMode(ModeName(mode)), IsOkAndHolds(mode));
  }
}

TEST(OptimizerNameTest, NamesEachOptimizer) {
  EXPECT_EQ(OptimizerName(OPTIMIZER_AUTO), "auto");
  EXPECT_EQ(OptimizerName(SGD), "sgd");
  EXPECT_EQ(OptimizerName(ADAGRAD), "adagrad");
}

TEST(ParseIntListTest, ParsesCommaSeparatedPositiveIntegers) {
  EXPECT_THAT(ParseIntList("256,128"), IsOkAndHolds(ElementsAre(256, 128)));
  EXPECT_THAT(ParseIntList(" 5 , 6,,7 "), IsOkAndHolds(ElementsAre(5, 6, 7)));
  EXPECT_THAT(ParseIntList(""), IsOkAndHolds(IsEmpty()));
}

TEST(ParseIntListTest, RefusesNonPositiveOrNonNumericEntries) {
  for (const char* text : {"0", "256,-1", "12a", "1.5"}) {
    SCOPED_TRACE(text);
    EXPECT_THAT(ParseIntList(text),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(text)));
  }
}

}  // namespace
}  // namespace monsoon::common
