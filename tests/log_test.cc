#include "common/log.h"

#include <string>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace monsoon::common {
namespace {

const absl::Time kWhen =
    absl::FromUnixMillis(1795474267123);  // 2026-11-23T22:51:07.123Z

TEST(LogTest, TextLinesHaveTheDateTheTimeAndTheLevel) {
  EXPECT_EQ(FormatLogLine(LogFormat::kText, LogLevel::kInfo, kWhen,
                          "shard 0: rank 1 registered"),
            "2026-11-23T22:51:07.123Z INFO shard 0: rank 1 registered");
  EXPECT_EQ(FormatLogLine(LogFormat::kText, LogLevel::kWarning, kWhen, "w"),
            "2026-11-23T22:51:07.123Z WARNING w");
  EXPECT_EQ(FormatLogLine(LogFormat::kText, LogLevel::kError, kWhen, "e"),
            "2026-11-23T22:51:07.123Z ERROR e");
}

TEST(LogTest, JsonLinesAreOneObjectWithTheMessageEscaped) {
  EXPECT_EQ(
      FormatLogLine(LogFormat::kJson, LogLevel::kWarning, kWhen,
                    "worker 0: lost \"shard 1\"\tat\n127.0.0.1:5000"),
      "{\"time\":\"2026-11-23T22:51:07.123Z\",\"level\":\"WARNING\","
      "\"message\":\"worker 0: lost \\\"shard 1\\\"\\tat\\n127.0.0.1:5000\"}");
}

TEST(LogTest, TheFlagTakesTextOrJsonOnly) {
  LogFormat format;
  std::string error;
  EXPECT_TRUE(AbslParseFlag("json", &format, &error));
  EXPECT_EQ(format, LogFormat::kJson);
  EXPECT_TRUE(AbslParseFlag("text", &format, &error));
  EXPECT_EQ(format, LogFormat::kText);
  EXPECT_FALSE(AbslParseFlag("yaml", &format, &error));
  EXPECT_EQ(error, "must be text or json");
  EXPECT_EQ(AbslUnparseFlag(LogFormat::kJson), "json");
}

}  // namespace
}  // namespace monsoon::common
