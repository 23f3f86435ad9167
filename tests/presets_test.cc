// Each model preset, resolved with no settings of its own, trains in every
// mode: 240 steps through an in-process shard on the first 3,840 examples
// of Fashion-MNIST (Debian's dataset-fashion-mnist, which tools/setup.sh
// installs) bring the test loss well below ln(10), the loss of predicting
// every class alike, where LeNet at the MLP's defaults stays for good.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/config.h"
#include "common/model_config.h"
#include "common/model_layout.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"
#include "tests/local_shards.h"
#include "tests/status_matchers.h"
#include "worker/cpu_backend.h"
#include "worker/dataset.h"
#include "worker/evaluator.h"
#include "worker/model/model.h"
#include "worker/ps_client.h"
#include "worker/training_loop.h"

namespace monsoon {
namespace {

constexpr int kClasses = 10;

// The first `examples` of `split` of the config's data set (Fashion-MNIST
// by default), standardized as the workers do.
absl::StatusOr<worker::Dataset> FirstExamples(const TrainingConfig& config,
                                              worker::Split split,
                                              int examples) {
  absl::StatusOr<worker::Dataset> data = worker::LoadDatasetFor(config, split);
  if (!data.ok()) return data.status();
  if (data->size < examples) {
    return absl::FailedPreconditionError("the data set is too small");
  }
  data->size = examples;
  data->images.resize(static_cast<size_t>(examples) * data->dim);
  data->labels.resize(examples);
  return data;
}

struct Trained {
  double test_loss = 0;
  double test_accuracy = 0;
  int64_t steps = 0;
};

// Measures the test set on the weights the shards of `cluster` hold.
void Measure(const testutil::LocalCluster& cluster, const TrainingConfig& config,
             const worker::Dataset& test, Trained* out) {
  const common::ModelLayout layout = common::ModelLayout::FromConfig(config);
  std::unique_ptr<worker::ComputeBackend> backend = worker::MakeCpuBackend(1);
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<worker::PsClient> observer,
      worker::PsClient::Connect(
          testutil::ClientOptions(cluster.servers, config, /*rank=*/-1)));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<worker::Model> eval_model,
                       worker::Model::Create(backend.get(), layout, 500));
  worker::Evaluator evaluator(observer.get(), eval_model.get(), &test,
                              absl::Now());
  ASSERT_OK_AND_ASSIGN(EvalPoint point, evaluator.EvaluateNow());
  out->test_loss = point.test_loss();
  out->test_accuracy = point.test_accuracy();
}

// Trains `config` (resolved) with one worker through one shard and measures
// the test set on the shard's weights.
void Train(const TrainingConfig& config, const worker::Dataset& train,
           const worker::Dataset& test, Trained* out) {
  testutil::LocalCluster cluster(config, /*num_shards=*/1, /*num_workers=*/1);
  ASSERT_NE(cluster.client, nullptr);
  const common::ModelLayout layout = common::ModelLayout::FromConfig(config);
  std::unique_ptr<worker::ComputeBackend> backend = worker::MakeCpuBackend(1);
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<worker::Model> model,
      worker::Model::Create(backend.get(), layout, config.batch_size()));
  model->set_weight_decay(config.weight_decay());
  worker::WorkerContext context;
  context.config = config;
  context.train = &train;
  context.model = model.get();
  context.client = cluster.client.get();
  context.log_interval = absl::ZeroDuration();
  worker::PlaceWorker(*cluster.client, config, /*resume=*/false, &context);
  std::unique_ptr<worker::TrainingLoop> loop =
      worker::MakeTrainingLoop(config.mode());
  ASSERT_NE(loop, nullptr);
  ASSERT_OK_AND_ASSIGN(worker::WorkerResult result, loop->Run(context));
  out->steps = result.steps;

  ASSERT_NO_FATAL_FAILURE(Measure(cluster, config, test, out));
}

class PresetsTest
    : public testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(PresetsTest, TrainsAsShippedInEveryMode) {
  const auto& [model, mode] = GetParam();
  TrainingConfig raw;
  ASSERT_OK_AND_ASSIGN(Model preset, common::ParseModel(model));
  raw.set_model(preset);
  ASSERT_OK_AND_ASSIGN(Mode parsed_mode, common::ParseMode(mode));
  raw.set_mode(parsed_mode);
  // 3,840 examples in batches of 64: 60 steps an epoch, 240 in 4 epochs.
  raw.set_epochs(4);
  ASSERT_OK_AND_ASSIGN(TrainingConfig config,
                       common::ResolveConfigWithData(raw));
  ASSERT_OK_AND_ASSIGN(const worker::Dataset train,
                       FirstExamples(config, worker::Split::kTrain, 3840));
  ASSERT_OK_AND_ASSIGN(const worker::Dataset test,
                       FirstExamples(config, worker::Split::kTest, 1000));
  Trained trained;
  ASSERT_NO_FATAL_FAILURE(Train(config, train, test, &trained));
  EXPECT_EQ(trained.steps, 240);
  // Uniform predictions cost ln(10) = 2.30.
  EXPECT_LT(trained.test_loss, 0.5 * std::log(kClasses))
      << model << " " << mode << ": test accuracy " << trained.test_accuracy;
  EXPECT_GT(trained.test_accuracy, 0.6) << model << " " << mode;
}

// The lenet preset's output layer starts at zero, so a fresh LeNet gives
// every class the same logit: its test loss is ln(10) exactly (float
// rounding aside), not the 5.5 that He weights after two max pools gave.
TEST(FreshPresetTest, AFreshLenetPredictsEveryClassAlike) {
  TrainingConfig raw;
  raw.set_model(LENET);
  ASSERT_OK_AND_ASSIGN(TrainingConfig config,
                       common::ResolveConfigWithData(raw));
  ASSERT_OK_AND_ASSIGN(const worker::Dataset test,
                       FirstExamples(config, worker::Split::kTest, 1000));
  testutil::LocalCluster cluster(config, /*num_shards=*/2, /*num_workers=*/1);
  ASSERT_NE(cluster.client, nullptr);
  Trained fresh;
  ASSERT_NO_FATAL_FAILURE(Measure(cluster, config, test, &fresh));
  EXPECT_NEAR(fresh.test_loss, std::log(kClasses), 1e-5);

  // With He weights on the output layer the loss starts far above it.
  config.clear_output_init();
  testutil::LocalCluster he_cluster(config, 2, 1);
  ASSERT_NE(he_cluster.client, nullptr);
  Trained he;
  ASSERT_NO_FATAL_FAILURE(Measure(he_cluster, config, test, &he));
  EXPECT_GT(he.test_loss, 1.2 * std::log(kClasses));
}

INSTANTIATE_TEST_SUITE_P(
    EveryPresetAndMode, PresetsTest,
    testing::Combine(testing::Values("mlp", "lenet"),
                     testing::Values("sync", "downpour", "easgd", "hogwild",
                                     "onebit")),
    [](const testing::TestParamInfo<PresetsTest::ParamType>& info) {
      return std::get<0>(info.param) + "_" + std::get<1>(info.param);
    });

}  // namespace
}  // namespace monsoon
