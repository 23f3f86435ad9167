// GoogleTest helpers for absl::Status and absl::StatusOr, which Abseil
// 20220623 does not ship: the StatusIs, IsOk and IsOkAndHolds matchers, and the
// EXPECT_OK, ASSERT_OK and ASSERT_OK_AND_ASSIGN macros. Test-only; stateless.
#ifndef MONSOON_TESTS_STATUS_MATCHERS_H_
#define MONSOON_TESTS_STATUS_MATCHERS_H_

#include <ostream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace monsoon::testutil {

inline const absl::Status& GetStatus(const absl::Status& status) {
  return status;
}
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

// Matches an absl::Status or absl::StatusOr<T> whose code is `code` and whose
// message matches `message`.
class StatusIsMatcher {
 public:
  StatusIsMatcher(absl::StatusCode code,
                  ::testing::Matcher<const std::string&> message)
      : code_(code), message_(std::move(message)) {}

  template <typename T>
  bool MatchAndExplain(const T& value,
                       ::testing::MatchResultListener* listener) const {
    const absl::Status& status = GetStatus(value);
    *listener << "whose status is " << status;
    if (status.code() != code_) return false;
    return message_.MatchAndExplain(std::string(status.message()), listener);
  }

  void DescribeTo(std::ostream* os) const {
    *os << "has code " << absl::StatusCodeToString(code_)
        << " and a message that ";
    message_.DescribeTo(os);
  }

  void DescribeNegationTo(std::ostream* os) const {
    *os << "does not have code " << absl::StatusCodeToString(code_)
        << " or has a message that ";
    message_.DescribeNegationTo(os);
  }

 private:
  absl::StatusCode code_;
  ::testing::Matcher<const std::string&> message_;
};

inline ::testing::PolymorphicMatcher<StatusIsMatcher> StatusIs(
    absl::StatusCode code,
    ::testing::Matcher<const std::string&> message = ::testing::_) {
  return ::testing::MakePolymorphicMatcher(
      StatusIsMatcher(code, std::move(message)));
}

inline ::testing::PolymorphicMatcher<StatusIsMatcher> IsOk() {
  return StatusIs(absl::StatusCode::kOk);
}

// Matches an OK absl::StatusOr<T> whose value matches `inner` (a matcher or
// a value to compare with ==).
template <typename InnerMatcher>
class IsOkAndHoldsMatcher {
 public:
  explicit IsOkAndHoldsMatcher(InnerMatcher inner) : inner_(std::move(inner)) {}

  template <typename T>
  bool MatchAndExplain(const absl::StatusOr<T>& value,
                       ::testing::MatchResultListener* listener) const {
    if (!value.ok()) {
      *listener << "whose status is " << value.status();
      return false;
    }
    *listener << "whose value ";
    return ::testing::MatcherCast<const T&>(inner_).MatchAndExplain(*value,
                                                                    listener);
  }

  void DescribeTo(std::ostream* os) const {
    *os << "is OK and holds a value that matches the given matcher";
  }
  void DescribeNegationTo(std::ostream* os) const {
    *os << "is not OK or holds a value that does not match the given matcher";
  }

 private:
  InnerMatcher inner_;
};

template <typename InnerMatcher>
::testing::PolymorphicMatcher<IsOkAndHoldsMatcher<InnerMatcher>> IsOkAndHolds(
    InnerMatcher inner) {
  return ::testing::MakePolymorphicMatcher(
      IsOkAndHoldsMatcher<InnerMatcher>(std::move(inner)));
}

}  // namespace monsoon::testutil

#define EXPECT_OK(expr) EXPECT_THAT((expr), ::monsoon::testutil::IsOk())
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::monsoon::testutil::IsOk())

// ASSERT_OK_AND_ASSIGN(auto x, MakeX()); fails the test (and returns from
// it) unless MakeX() is OK, else moves its value into x.
#define MONSOON_TESTUTIL_CONCAT_INNER(a, b) a##b
#define MONSOON_TESTUTIL_CONCAT(a, b) MONSOON_TESTUTIL_CONCAT_INNER(a, b)
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  MONSOON_TESTUTIL_ASSERT_OK_AND_ASSIGN( \
      MONSOON_TESTUTIL_CONCAT(monsoon_status_or_, __LINE__), lhs, rexpr)
#define MONSOON_TESTUTIL_ASSERT_OK_AND_ASSIGN(status_or, lhs, rexpr) \
  auto status_or = (rexpr);                                          \
  ASSERT_TRUE(status_or.ok()) << status_or.status();                 \
  lhs = std::move(status_or).value()

#endif  // MONSOON_TESTS_STATUS_MATCHERS_H_
