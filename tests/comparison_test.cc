#include "tools/comparison.h"

#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace monsoon::tools {
namespace {

using ::monsoon::testutil::StatusIs;
using ::testing::HasSubstr;

TEST(ParseVariantsTest, EachVariantIsAModeAndItsFields) {
  ASSERT_OK_AND_ASSIGN(
      std::vector<Variant> variants,
      ParseVariants("sync; sync+backup_workers=1;"
                    "downpour+max_staleness=4+staleness_lr=true"));
  ASSERT_EQ(variants.size(), 3u);
  EXPECT_EQ(variants[0].name, "sync");
  EXPECT_EQ(variants[0].mode, SYNC);
  EXPECT_EQ(variants[0].overrides, "");
  EXPECT_EQ(variants[1].name, "sync+backup_workers=1");
  EXPECT_EQ(variants[1].overrides, "backup_workers: 1\n");
  EXPECT_EQ(variants[2].mode, DOWNPOUR);
  EXPECT_EQ(variants[2].overrides, "max_staleness: 4\nstaleness_lr: true\n");
}

TEST(ParseVariantsTest, MistakesAreClearErrorsNamingTheVariant) {
  EXPECT_THAT(ParseVariants("fast"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("variant 'fast'")));
  EXPECT_THAT(ParseVariants("sync+backup_workers"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is not FIELD=VALUE")));
  EXPECT_THAT(
      ParseVariants("sync;sync"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("given twice")));
  EXPECT_THAT(ParseVariants(" ; "), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("no variant")));
}

TEST(ApplyVariantTest, SetsTheFieldsAndResolvesTheResult) {
  const TrainingConfig base = testutil::ResolvedConfig("mode: DOWNPOUR");
  ASSERT_OK_AND_ASSIGN(std::vector<Variant> variants,
                       ParseVariants("downpour+max_staleness=4;"
                                     "downpour+delay_compensation=0.04;"
                                     "downpour+backup_workers=1;"
                                     "downpour+no_such_field=1"));
  ASSERT_OK_AND_ASSIGN(TrainingConfig bounded, ApplyVariant(variants[0], base));
  EXPECT_EQ(bounded.max_staleness(), 4);
  EXPECT_EQ(bounded.optimizer(), base.optimizer());
  ASSERT_OK_AND_ASSIGN(TrainingConfig compensated,
                       ApplyVariant(variants[1], base));
  EXPECT_FLOAT_EQ(compensated.delay_compensation(), 0.04f);
  // Refused where the mode does not take it, naming the variant.
  EXPECT_THAT(ApplyVariant(variants[2], base),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("variant 'downpour+backup_workers=1'")));
  EXPECT_THAT(
      ApplyVariant(variants[3], base),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no_such_field")));
}

TEST(ParseStragglersTest, RanksAndFactors) {
  ASSERT_OK_AND_ASSIGN(auto stragglers, ParseStragglers("1:3,0:1.5"));
  EXPECT_EQ(stragglers, (std::map<int, double>{{0, 1.5}, {1, 3.0}}));
  ASSERT_OK_AND_ASSIGN(auto none, ParseStragglers(""));
  EXPECT_TRUE(none.empty());
  for (const char* bad : {"1", "x:3", "-1:3", "1:0.5", "1:101", "1:3,1:2"}) {
    EXPECT_THAT(ParseStragglers(bad),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << bad;
  }
}

// A failed run is written as who it was and why, beside the runs that ran.
TEST(ResultsJsonTest, AFailedRunHasItsNameModeCountsAndError) {
  ComparisonOptions options;
  ComparisonResult result;
  ComparedRun failed{"allreduce-s2-w4", "allreduce", "", -1};
  failed.metrics.config = testutil::ResolvedConfig("mode: ALLREDUCE");
  failed.metrics.servers = 2;
  failed.metrics.workers = 4;
  failed.failure = "worker 1 exited with \"code\" 137";
  result.runs.push_back(failed);
  EXPECT_EQ(ResultsJson(options, result).substr(
                ResultsJson(options, result).find("\"runs\": [")),
            "\"runs\": [\n{\n  \"name\": \"allreduce-s2-w4\",\n"
            "  \"variant\": \"allreduce\",\n  \"mode\": \"allreduce\",\n"
            "  \"servers\": 2,\n  \"workers\": 4,\n"
            "  \"failed\": \"worker 1 exited with \\\"code\\\" 137\"\n}\n]\n}\n");
}

}  // namespace
}  // namespace monsoon::tools
