#include "common/libsvm_reader.h"

#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "common/sparse_ids.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace monsoon::common {
namespace {

using ::monsoon::testutil::IsOk;
using ::monsoon::testutil::IsOkAndHolds;
using ::monsoon::testutil::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

void WritePlain(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

void WriteGzip(const std::string& path, const std::string& text) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  ASSERT_EQ(gzwrite(file, text.data(), text.size()),
            static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(file), Z_OK);
}

TEST(LibsvmReaderTest, ALineIsALabelAndIdValuePairs) {
  SparseExample e;
  ASSERT_THAT(ParseLibsvmLine("1 3:0.5 7:1", &e), IsOkAndHolds(true));
  EXPECT_EQ(e.label, 1.0f);
  EXPECT_THAT(e.ids, ElementsAre(3u, 7u));
  EXPECT_THAT(e.values, ElementsAre(0.5f, 1.0f));
  EXPECT_THAT(e.fields, ElementsAre(-1, -1));
  ASSERT_THAT(ParseLibsvmLine("-1\t18446744073709551615:2 # a note", &e),
              IsOkAndHolds(true));
  EXPECT_EQ(e.label, -1.0f);
  EXPECT_THAT(e.ids, ElementsAre(18446744073709551615ull));
  EXPECT_THAT(e.values, ElementsAre(2.0f));
}

TEST(LibsvmReaderTest, FieldsAndWordIds) {
  SparseExample e;
  ASSERT_THAT(ParseLibsvmLine("0 0:12:1 3:user_42:0.25", &e),
              IsOkAndHolds(true));
  EXPECT_EQ(e.label, 0.0f);
  EXPECT_THAT(e.fields, ElementsAre(0, 3));
  EXPECT_THAT(e.ids, ElementsAre(12u, HashStringId("user_42")));
  EXPECT_THAT(e.values, ElementsAre(1.0f, 0.25f));
}

TEST(LibsvmReaderTest, BlankAndCommentLinesHoldNoExample) {
  SparseExample e;
  EXPECT_THAT(ParseLibsvmLine("", &e), IsOkAndHolds(false));
  EXPECT_THAT(ParseLibsvmLine("  \t", &e), IsOkAndHolds(false));
  EXPECT_THAT(ParseLibsvmLine("# 1 2:3", &e), IsOkAndHolds(false));
}

TEST(LibsvmReaderTest, MalformedLinesSayWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"x 1:1", "the label is not a finite number: 'x'"},
      {"nan 1:1", "the label is not a finite number: 'nan'"},
      {"1 5", "a feature is id:value or field:id:value, not '5'"},
      {"1 1:2:3:4", "not '1:2:3:4'"},
      {"1 1:nan", "a feature's value is not a finite number: '1:nan'"},
      {"1 1:", "a feature's value is not a finite number: '1:'"},
      {"1 :1", "a feature without an id: ':1'"},
      {"1 a:1:1", "a field is a number from 0, not 'a'"},
      {"1 -1:1:1", "a field is a number from 0, not '-1'"},
      {"1 18446744073709551616:1", "an id beyond 64 bits: '18446744073709551616'"},
  };
  SparseExample e;
  for (const auto& [line, message] : cases) {
    EXPECT_THAT(ParseLibsvmLine(line, &e),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)))
        << line;
  }
}

TEST(LibsvmReaderTest, StreamsAFileAndNamesTheLineOfAnError) {
  const std::string path = TempPath("errors.libsvm");
  WritePlain(path, "1 1:1\n\n# header\n0 2:1\n1 3:x\n");
  auto reader = LibsvmReader::Open(path);
  ASSERT_THAT(reader, IsOk());
  SparseExample e;
  EXPECT_THAT((*reader)->Next(&e), IsOkAndHolds(true));
  EXPECT_EQ((*reader)->line(), 1);
  EXPECT_THAT((*reader)->Next(&e), IsOkAndHolds(true));
  EXPECT_EQ((*reader)->line(), 4);
  EXPECT_THAT(e.ids, ElementsAre(2u));
  EXPECT_THAT((*reader)->Next(&e),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(path + ":5: a feature's value is not a "
                                        "finite number: '3:x'")));
}

TEST(LibsvmReaderTest, ReadsGzipAndALastLineWithoutANewline) {
  const std::string path = TempPath("data.libsvm.gz");
  WriteGzip(path, "1 1:1\n0 2:0.5");
  auto reader = LibsvmReader::Open(path);
  ASSERT_THAT(reader, IsOk());
  SparseExample e;
  ASSERT_THAT((*reader)->Next(&e), IsOkAndHolds(true));
  ASSERT_THAT((*reader)->Next(&e), IsOkAndHolds(true));
  EXPECT_EQ(e.label, 0.0f);
  EXPECT_THAT(e.values, ElementsAre(0.5f));
  EXPECT_THAT((*reader)->Next(&e), IsOkAndHolds(false));
}

TEST(LibsvmReaderTest, ATruncatedGzipIsDataLossAndAMissingFileNotFound) {
  const std::string whole = TempPath("whole.libsvm.gz");
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "1 1:1 2:2 3:3 user_" + std::to_string(i) + ":1\n";
  WriteGzip(whole, text);
  std::ifstream in(whole, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  const std::string cut = TempPath("cut.libsvm.gz");
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  auto reader = LibsvmReader::Open(cut);
  ASSERT_THAT(reader, IsOk());
  SparseExample e;
  absl::StatusOr<bool> next = true;
  while (next.ok() && *next) next = (*reader)->Next(&e);
  EXPECT_THAT(next, StatusIs(absl::StatusCode::kDataLoss,
                             HasSubstr("damaged gzip stream")));
  EXPECT_THAT(LibsvmReader::Open(TempPath("absent.libsvm")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no such file")));
}

}  // namespace
}  // namespace monsoon::common
