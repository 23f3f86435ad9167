#include "common/auth.h"

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace monsoon::common {
namespace {

using ::monsoon::testutil::IsOkAndHolds;
using ::monsoon::testutil::StatusIs;
using ::testing::HasSubstr;

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = testutil::TempPath(name);
  std::ofstream(path) << text;
  return path;
}

TEST(AuthTest, ATokenFileIsReadWithoutItsSurroundingWhiteSpace) {
  EXPECT_THAT(ReadTokenFile(WriteFile("token", "  0123456789abcdef01\n")),
              IsOkAndHolds("0123456789abcdef01"));
}

TEST(AuthTest, AMissingShortOrUnprintableTokenIsRefusedNamingTheFile) {
  const std::string missing = testutil::TempPath("no_such_token");
  EXPECT_THAT(
      ReadTokenFile(missing),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("cannot read the auth token file " + missing)));
  EXPECT_THAT(ReadTokenFile(WriteFile("short", "0123456789abcde")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("has 15 characters; use at least 16")));
  EXPECT_THAT(ReadTokenFile(WriteFile("spaced", "0123456789 abcdef")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not printable ASCII")));
}

TEST(AuthTest, OnlyTheExactBearerValueMatches) {
  const std::string token = "0123456789abcdef";
  EXPECT_EQ(BearerValue(token), "Bearer 0123456789abcdef");
  EXPECT_TRUE(BearerMatches("Bearer 0123456789abcdef", token));
  EXPECT_FALSE(BearerMatches("Bearer 0123456789abcdeF", token));
  EXPECT_FALSE(BearerMatches("Bearer 0123456789abcde", token));
  EXPECT_FALSE(BearerMatches("0123456789abcdef", token));
  EXPECT_FALSE(BearerMatches("", token));
}

TEST(AuthTest, NewTokensAre64HexDigitsAndDiffer) {
  ASSERT_OK_AND_ASSIGN(const std::string a, NewToken());
  ASSERT_OK_AND_ASSIGN(const std::string b, NewToken());
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace monsoon::common
