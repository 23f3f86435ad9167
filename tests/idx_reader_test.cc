#include "common/idx_reader.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace monsoon::common {
namespace {

using ::monsoon::testutil::IdxBytes;
using ::monsoon::testutil::StatusIs;
using ::monsoon::testutil::TempPath;
using ::monsoon::testutil::WriteFile;
using ::monsoon::testutil::WriteGzipFile;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// Two 2x3 images: 0, 1, ..., 11.
const std::vector<uint8_t> kData = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 255};

TEST(ParseIdxTest, ParsesDimensionsAndData) {
  absl::StatusOr<IdxArray> array = ParseIdx(IdxBytes({2, 2, 3}, kData));
  ASSERT_OK(array.status());
  EXPECT_THAT(array->dims, ElementsAre(2, 2, 3));
  EXPECT_THAT(array->data, ElementsAreArray(kData));
  EXPECT_EQ(array->item_size(), 6u);
}

TEST(ParseIdxTest, ReadsBigEndianDimensions) {
  std::vector<uint8_t> data(0x0102, 7);
  absl::StatusOr<IdxArray> array = ParseIdx(IdxBytes({0x0102}, data));
  ASSERT_OK(array.status());
  EXPECT_THAT(array->dims, ElementsAre(258));
  EXPECT_EQ(array->item_size(), 1u);
  EXPECT_EQ(array->data.size(), 258u);
}

TEST(ParseIdxTest, TruncatedBodyIsInvalid) {
  std::vector<uint8_t> short_data(kData.begin(), kData.end() - 1);
  EXPECT_THAT(ParseIdx(IdxBytes({2, 2, 3}, short_data)),
              StatusIs(kInvalid, HasSubstr("promises 12 bytes")));
}

TEST(ParseIdxTest, TruncatedHeaderIsInvalid) {
  std::string bytes = IdxBytes({2, 2, 3}, {});
  bytes.resize(10);
  EXPECT_THAT(ParseIdx(bytes), StatusIs(kInvalid, HasSubstr("header")));
}

TEST(ParseIdxTest, BadMagicIsInvalid) {
  std::string bytes = IdxBytes({2, 2, 3}, kData);
  bytes[0] = 1;
  EXPECT_THAT(ParseIdx(bytes), StatusIs(kInvalid, HasSubstr("not an IDX")));
  EXPECT_THAT(ParseIdx(std::string("\0\0\x08", 3)),
              StatusIs(kInvalid, HasSubstr("not an IDX")));
  EXPECT_THAT(ParseIdx(""), StatusIs(kInvalid, HasSubstr("not an IDX")));
}

TEST(ParseIdxTest, ElementTypeOtherThanUnsignedByteIsInvalid) {
  for (char type : {'\x09', '\x0b', '\x0c', '\x0d', '\x0e'}) {
    std::string bytes = IdxBytes({2, 2, 3}, kData);
    bytes[2] = type;
    EXPECT_THAT(ParseIdx(bytes), StatusIs(kInvalid, HasSubstr("element type")))
        << static_cast<int>(type);
  }
}

TEST(ParseIdxTest, RankOutsideOneToFourIsInvalid) {
  EXPECT_THAT(ParseIdx(IdxBytes({}, {})),
              StatusIs(kInvalid, HasSubstr("rank 0")));
  EXPECT_THAT(ParseIdx(IdxBytes({1, 1, 1, 1, 1}, {1})),
              StatusIs(kInvalid, HasSubstr("rank 5")));
}

TEST(ParseIdxTest, TrailingBytesAreInvalid) {
  std::vector<uint8_t> long_data = kData;
  long_data.push_back(0);
  EXPECT_THAT(ParseIdx(IdxBytes({2, 2, 3}, long_data)),
              StatusIs(kInvalid, HasSubstr("1 bytes after its data")));
}

TEST(ParseIdxTest, ImplausiblyLargeDimensionsAreInvalid) {
  EXPECT_THAT(ParseIdx(IdxBytes({0xffffffffu, 0xffffffffu}, {})),
              StatusIs(kInvalid, HasSubstr("implausibly large")));
  // 2^31 * 4 * 2^31 = 2^64: the product must not wrap around to 0 and pass
  // as an empty array.
  EXPECT_THAT(ParseIdx(IdxBytes({0x80000000u, 4, 0x80000000u}, {})),
              StatusIs(kInvalid, HasSubstr("implausibly large")));
}

TEST(ParseIdxTest, ZeroItemsParse) {
  absl::StatusOr<IdxArray> array = ParseIdx(IdxBytes({0, 28, 28}, {}));
  ASSERT_OK(array.status());
  EXPECT_THAT(array->dims, ElementsAre(0, 28, 28));
  EXPECT_TRUE(array->data.empty());
}

TEST(ReadIdxFileTest, ReadsAGzipFile) {
  const std::string path = TempPath("good-idx3-ubyte.gz");
  WriteGzipFile(path, IdxBytes({2, 2, 3}, kData));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  ASSERT_OK(array.status());
  EXPECT_THAT(array->dims, ElementsAre(2, 2, 3));
  EXPECT_THAT(array->data, ElementsAreArray(kData));
}

TEST(ReadIdxFileTest, ReadsAPlainFile) {
  const std::string path = TempPath("plain-idx1-ubyte");
  WriteFile(path, IdxBytes({12}, kData));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  ASSERT_OK(array.status());
  EXPECT_THAT(array->dims, ElementsAre(12));
  EXPECT_THAT(array->data, ElementsAreArray(kData));
}

TEST(ReadIdxFileTest, ReadsAFileLargerThanOneReadBuffer) {
  const std::string path = TempPath("large-idx1-ubyte.gz");
  std::vector<uint8_t> data(200000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = (i * 7) & 0xff;
  WriteGzipFile(path, IdxBytes({200000}, data));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  ASSERT_OK(array.status());
  EXPECT_EQ(array->data, data);
}

TEST(ReadIdxFileTest, MissingFileIsNotFound) {
  const std::string path = TempPath("no-such-idx3-ubyte.gz");
  EXPECT_THAT(ReadIdxFile(path),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST(ReadIdxFileTest, MalformedContentIsInvalidNamingTheFile) {
  const std::string truncated = TempPath("truncated-idx3-ubyte.gz");
  WriteGzipFile(truncated,
                IdxBytes({2, 2, 3},
                         std::vector<uint8_t>(kData.begin(), kData.end() - 2)));
  EXPECT_THAT(
      ReadIdxFile(truncated),
      StatusIs(kInvalid, AllOf(HasSubstr(truncated), HasSubstr("truncated"))));

  const std::string bad_type = TempPath("float-idx3-ubyte");
  std::string bytes = IdxBytes({2, 2, 3}, kData);
  bytes[2] = '\x0d';
  WriteFile(bad_type, bytes);
  EXPECT_THAT(ReadIdxFile(bad_type),
              StatusIs(kInvalid,
                       AllOf(HasSubstr(bad_type), HasSubstr("element type"))));

  const std::string trailing = TempPath("trailing-idx1-ubyte");
  WriteFile(trailing, IdxBytes({2}, {1, 2, 3}));
  EXPECT_THAT(ReadIdxFile(trailing),
              StatusIs(kInvalid, AllOf(HasSubstr(trailing),
                                       HasSubstr("after its data"))));

  const std::string magic = TempPath("magic-idx1-ubyte");
  WriteFile(magic, "\x01\x02\x08\x01");
  EXPECT_THAT(
      ReadIdxFile(magic),
      StatusIs(kInvalid, AllOf(HasSubstr(magic), HasSubstr("not an IDX"))));
}

// A gzip file of the good array, for corrupting.
std::string GoodGzipBytes() {
  const std::string path = TempPath("to-corrupt.gz");
  std::vector<uint8_t> data(4096);
  for (size_t i = 0; i < data.size(); ++i) data[i] = (i * 31 + i / 7) & 0xff;
  WriteGzipFile(path, IdxBytes({4096}, data));
  absl::StatusOr<IdxArray> check = ReadIdxFile(path);
  EXPECT_TRUE(check.ok()) << check.status();
  std::string bytes;
  FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return bytes;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) {
    bytes.append(buffer, n);
  }
  std::fclose(file);
  return bytes;
}

TEST(ReadIdxFileTest, CorruptGzipIsInvalidNamingTheFile) {
  const std::string good = GoodGzipBytes();
  ASSERT_GT(good.size(), 40u);

  // Garbage after a gzip header: a deflate data error.
  std::string garbage = good.substr(0, 10) + std::string(200, '\xff');
  // Cut in the middle: the stream ends early.
  std::string cut = good.substr(0, good.size() / 2);
  // A wrong CRC in the trailer.
  std::string bad_crc = good;
  bad_crc[bad_crc.size() - 8] ^= 0x5a;

  for (const auto& [name, bytes] :
       {std::pair<std::string, std::string>{"garbage.gz", garbage},
        {"cut.gz", cut},
        {"bad-crc.gz", bad_crc}}) {
    SCOPED_TRACE(name);
    const std::string path = TempPath(name);
    WriteFile(path, bytes);
    EXPECT_THAT(ReadIdxFile(path),
                StatusIs(kInvalid, AllOf(HasSubstr(path), HasSubstr("gzip"))));
  }
}

}  // namespace
}  // namespace monsoon::common
