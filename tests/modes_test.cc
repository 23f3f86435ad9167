// Every value of proto/config.proto's Mode is a whole mode: it resolves with
// defaults, a shard builds its rule and a worker its loop (common/modes.def
// lists them). A mode added to the enum without its line in modes.def, or
// without its row of defaults, fails here.
#include <memory>
#include <string>

#include "common/config.h"
#include "common/model_layout.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"
#include "server/shard_state.h"
#include "server/update_rule.h"
#include "tests/test_util.h"
#include "worker/training_loop.h"

namespace monsoon {
namespace {

using ::monsoon::testutil::ResolvedConfig;

TEST(ModesTest, EveryModeResolvesAndHasARuleAndALoop) {
  const google::protobuf::EnumDescriptor* modes = Mode_descriptor();
  int built = 0;
  for (int i = 0; i < modes->value_count(); ++i) {
    const Mode mode = static_cast<Mode>(modes->value(i)->number());
    if (mode == MODE_UNSPECIFIED) continue;
    SCOPED_TRACE(Mode_Name(mode));
    const TrainingConfig config =
        ResolvedConfig("layer_sizes: [3, 2] mode: " + Mode_Name(mode));
    ASSERT_EQ(config.mode(), mode);
    server::ShardState state(common::ModelLayout::FromConfig(config),
                             config.seed(), 0, 1);
    std::unique_ptr<server::UpdateRule> rule =
        server::MakeUpdateRule(config, /*num_workers=*/2, &state);
    ASSERT_NE(rule, nullptr);
    // A fresh rule serves version 0 of the shard's 3 * 2 + 2 weights.
    server::WeightsPtr weights = rule->Snapshot();
    EXPECT_EQ(weights->version(), 0);
    EXPECT_EQ(weights->values().size(), 8u);
    EXPECT_NE(worker::MakeTrainingLoop(mode), nullptr);
    ++built;
  }
  EXPECT_EQ(built, 6);  // sync, downpour, easgd, hogwild, onebit, allreduce
}

TEST(ModesTest, NoRuleAndNoLoopForAnUnspecifiedMode) {
  TrainingConfig config = ResolvedConfig("layer_sizes: [3, 2] mode: SYNC");
  server::ShardState state(common::ModelLayout::FromConfig(config),
                           config.seed(), 0, 1);
  config.set_mode(MODE_UNSPECIFIED);
  EXPECT_EQ(server::MakeUpdateRule(config, 2, &state), nullptr);
  EXPECT_EQ(worker::MakeTrainingLoop(MODE_UNSPECIFIED), nullptr);
}

}  // namespace
}  // namespace monsoon
