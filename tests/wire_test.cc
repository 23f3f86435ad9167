#include "common/wire.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/onebit.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace monsoon::common {
namespace {

using ::monsoon::testutil::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A message's bytes, joined.
std::string Bytes(const grpc::ByteBuffer& message) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(message.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// `bytes` as a message of several slices, cut at `cuts` (so that fields
// straddle slice boundaries, as they do off a socket).
grpc::ByteBuffer Sliced(const std::string& bytes, std::vector<size_t> cuts) {
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  cuts.push_back(bytes.size());
  for (size_t cut : cuts) {
    slices.emplace_back(bytes.data() + at, cut - at);  // copied
    at = cut;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer Whole(const std::string& bytes) { return Sliced(bytes, {}); }

std::string FloatBytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(float));
}

PushHeader Header() {
  PushHeader header;
  header.set_worker_rank(1);
  header.set_shard(2);
  header.set_base_version(300);
  header.set_length(5);
  header.set_samples(64);
  return header;
}

TEST(WireTest, PushChunkBytesAreProtobufsSerialization) {
  const PushHeader header = Header();
  const std::string data = FloatBytes({1.5f, -2, 3, 0.25f});
  const std::string scales = FloatBytes({-1, 1});
  BufferLease lease;
  const grpc::ByteBuffer message =
      PushChunkMessage(&header, 129, lease.Borrow(data.data(), data.size()),
                       lease.Borrow(scales.data(), scales.size()));
  PushChunk expected;
  *expected.mutable_header() = header;
  expected.set_offset(129);
  expected.set_data(data);
  expected.set_scales(scales);
  EXPECT_EQ(Bytes(message), expected.SerializeAsString());
}

TEST(WireTest, ChunksWithoutHeaderOffsetOrScalesLeaveThemOut) {
  const std::string data = FloatBytes({7});
  const grpc::ByteBuffer message = PushChunkMessage(
      nullptr, 0, grpc::Slice(data.data(), data.size()), grpc::Slice());
  PushChunk expected;
  expected.set_data(data);
  EXPECT_EQ(Bytes(message), expected.SerializeAsString());
}

TEST(WireTest, PullChunkBytesAreProtobufsSerialization) {
  const std::string data = FloatBytes({4, 5, 6});
  PushResponse push;
  push.set_version(12);
  push.set_staleness(3);
  PullChunk expected;
  expected.set_version(12);
  expected.set_offset(1u << 20);
  expected.set_data(data);
  *expected.mutable_push() = push;
  EXPECT_EQ(Bytes(PullChunkMessage(
                12, 1u << 20, grpc::Slice(data.data(), data.size()), &push)),
            expected.SerializeAsString());
  expected.clear_push();
  EXPECT_EQ(Bytes(PullChunkMessage(
                12, 1u << 20, grpc::Slice(data.data(), data.size()), nullptr)),
            expected.SerializeAsString());
}

TEST(WireTest, ReadsAPushChunkAcrossSliceBoundaries) {
  PushChunk chunk;
  *chunk.mutable_header() = Header();
  chunk.set_offset(300);
  chunk.set_data(FloatBytes({1, 2, 3, 4, 5}));
  chunk.set_scales(FloatBytes({-0.5f, 0.5f}));
  const std::string bytes = chunk.SerializeAsString();
  // Every cut point, so that each tag, varint and payload is split once.
  for (size_t cut = 1; cut < bytes.size(); ++cut) {
    MessageReader reader;
    MessageReader::PushChunkView view;
    ASSERT_OK(reader.ParsePushChunk(Sliced(bytes, {cut}), &view));
    EXPECT_TRUE(view.has_header);
    EXPECT_EQ(view.header.SerializeAsString(), Header().SerializeAsString());
    EXPECT_EQ(view.offset, 300u);
    EXPECT_EQ(view.data.ToString(), chunk.data()) << "cut at " << cut;
    EXPECT_EQ(view.scales.ToString(), chunk.scales());
    EXPECT_EQ(view.message_bytes, bytes.size());
  }
}

TEST(WireTest, CopyToFillsTheDestinationAcrossManySlices) {
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * i;
  PushChunk chunk;
  chunk.set_offset(7);
  chunk.set_data(FloatBytes(values));
  const std::string bytes = chunk.SerializeAsString();
  MessageReader reader;
  MessageReader::PushChunkView view;
  ASSERT_OK(
      reader.ParsePushChunk(Sliced(bytes, {3, 10, 11, 999, 2000}), &view));
  std::vector<float> out(values.size());
  ASSERT_EQ(view.data.size(), out.size() * sizeof(float));
  view.data.CopyTo(out.data());
  EXPECT_EQ(out, values);
}

TEST(WireTest, ReadsAPushChunksFieldsInAnyOrder) {
  // offset, data, then the header.
  std::string bytes;
  bytes += '\x10';  // field 2, varint
  bytes += '\x05';
  const std::string data = FloatBytes({9});
  bytes += '\x1a';  // field 3, length-delimited
  bytes += static_cast<char>(data.size());
  bytes += data;
  const std::string header = Header().SerializeAsString();
  bytes += '\x0a';  // field 1, length-delimited
  bytes += static_cast<char>(header.size());
  bytes += header;
  MessageReader reader;
  MessageReader::PushChunkView view;
  ASSERT_OK(reader.ParsePushChunk(Whole(bytes), &view));
  EXPECT_TRUE(view.has_header);
  EXPECT_EQ(view.header.base_version(), 300);
  EXPECT_EQ(view.offset, 5u);
  EXPECT_EQ(view.data.ToString(), data);
  EXPECT_TRUE(view.scales.empty());
}

TEST(WireTest, APushChunkWithAnUnknownFieldIsRefused) {
  // Unknown fields of every wire type: padding a shard would take in.
  const std::string unknown[] = {
      std::string("\x48\x01", 2),  // field 9, varint
      std::string("\x52\x02"
                  "ab",
                  4),                   // 10, length
      "\x5d" + std::string(4, '\x01'),  // 11, fixed32
      "\x61" + std::string(8, '\x02'),  // 12, fixed64
  };
  const int numbers[] = {9, 10, 11, 12};
  for (int i = 0; i < 4; ++i) {
    std::string bytes = "\x10\x05" + unknown[i];
    MessageReader reader;
    MessageReader::PushChunkView view;
    EXPECT_THAT(reader.ParsePushChunk(Whole(bytes), &view),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("PushChunk field ", numbers[i],
                                                " is unknown"))));
  }
}

TEST(WireTest, ReadsAPullChunk) {
  PullChunk chunk;
  chunk.set_version(-1);  // a negative int64 is a 10-byte varint
  chunk.set_offset(12);
  chunk.set_data(FloatBytes({3, 4}));
  chunk.mutable_push()->set_version(8);
  chunk.mutable_push()->set_staleness(2);
  MessageReader reader;
  MessageReader::PullChunkView view;
  ASSERT_OK(reader.ParsePullChunk(Whole(chunk.SerializeAsString()), &view));
  EXPECT_EQ(view.version, -1);
  EXPECT_EQ(view.offset, 12u);
  EXPECT_EQ(view.data.ToString(), chunk.data());
  EXPECT_TRUE(view.has_push);
  EXPECT_EQ(view.push.version(), 8);
  EXPECT_EQ(view.push.staleness(), 2);
}

// A 1-bit difference's chunk (pull_compression): bits in data, the scales
// and the version it is a difference from, laid out as protobuf does, and
// read back across every slice boundary.
TEST(WireTest, APullDeltaChunkIsProtobufsSerializationAndReadsBack) {
  const std::string bits = "\x5a\xa5\x0f";
  const std::string scales = FloatBytes({-0.25f, 0.5f});
  PushResponse push;
  push.set_version(7);
  PullChunk expected;
  expected.set_version(7);
  expected.set_offset(1024);
  expected.set_data(bits);
  *expected.mutable_push() = push;
  expected.set_encoding(ENCODING_ONEBIT);
  expected.set_scales(scales);
  expected.set_base_version(6);
  PullDelta delta{grpc::Slice(scales.data(), scales.size()), 6};
  const std::string bytes = Bytes(PullChunkMessage(
      7, 1024, grpc::Slice(bits.data(), bits.size()), &push, &delta));
  EXPECT_EQ(bytes, expected.SerializeAsString());
  for (size_t cut = 1; cut < bytes.size(); ++cut) {
    MessageReader reader;
    MessageReader::PullChunkView view;
    ASSERT_OK(reader.ParsePullChunk(Sliced(bytes, {cut}), &view));
    EXPECT_EQ(view.version, 7);
    EXPECT_EQ(view.offset, 1024u);
    EXPECT_EQ(view.data.ToString(), bits) << "cut at " << cut;
    EXPECT_EQ(view.encoding, ENCODING_ONEBIT);
    EXPECT_EQ(view.scales.ToString(), scales);
    EXPECT_EQ(view.base_version, 6);
    EXPECT_TRUE(view.has_push);
  }
  // A float32 chunk reads as such.
  MessageReader reader;
  MessageReader::PullChunkView view;
  PullChunk plain;
  plain.set_data(FloatBytes({1}));
  ASSERT_OK(reader.ParsePullChunk(Whole(plain.SerializeAsString()), &view));
  EXPECT_EQ(view.encoding, ENCODING_FLOAT32);
  EXPECT_TRUE(view.scales.empty());
}

TEST(WireTest, EmptyMessageIsAnEmptyChunk) {
  MessageReader reader;
  MessageReader::PushChunkView view;
  ASSERT_OK(reader.ParsePushChunk(Whole(""), &view));
  EXPECT_FALSE(view.has_header);
  EXPECT_EQ(view.offset, 0u);
  EXPECT_TRUE(view.data.empty());
}

TEST(WireTest, MalformedMessagesAreInvalidArgument) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string("\x1a\x05\x01\x02", 4), "runs past the message"},
      {std::string("\x10", 1), "truncated varint"},
      {std::string("\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12),
       "truncated varint"},
      {std::string("\x0b", 1), "unsupported wire type 3"},  // start group
      {std::string("\x00\x01", 2), "field number out of range"},
      {std::string("\x12\x01\x00", 3), "wrong wire type"},  // offset as bytes
      {std::string("\x0a\x02\xff\xff", 4), "header does not parse"},
      {std::string("\x5d\x01", 2), "truncated fixed32"},
      {std::string("\x80", 1), "truncated field tag"},
  };
  for (const auto& [bytes, message] : cases) {
    MessageReader reader;
    MessageReader::PushChunkView view;
    EXPECT_THAT(
        reader.ParsePushChunk(Whole(bytes), &view),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)))
        << "bytes of size " << bytes.size();
  }
}

TEST(WireTest, ATagLongerThanFiveBytesIsRefusedAsProtobufRefusesIt) {
  // Field 3 (data, length-delimited), its tag 0x1a padded to 5 and 6 bytes.
  const std::string five = std::string(
      "\x9a\x80\x80\x80\x00\x02"
      "ab",
      8);
  const std::string six = std::string(
      "\x9a\x80\x80\x80\x80\x00\x02"
      "ab",
      9);
  PushChunk push;
  PullChunk pull;
  ASSERT_TRUE(push.ParseFromString(five));
  ASSERT_TRUE(pull.ParseFromString(five));
  ASSERT_FALSE(push.ParseFromString(six));
  ASSERT_FALSE(pull.ParseFromString(six));
  MessageReader reader;
  MessageReader::PushChunkView push_view;
  ASSERT_OK(reader.ParsePushChunk(Whole(five), &push_view));
  EXPECT_EQ(push_view.data.ToString(), "ab");
  EXPECT_THAT(reader.ParsePushChunk(Whole(six), &push_view),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("field tag longer than 5 bytes")));
  MessageReader::PullChunkView pull_view;
  ASSERT_OK(reader.ParsePullChunk(Whole(five), &pull_view));
  EXPECT_EQ(pull_view.data.ToString(), "ab");
  EXPECT_THAT(reader.ParsePullChunk(Whole(six), &pull_view),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("field tag longer than 5 bytes")));
}

TEST(WireTest, ALengthLongerThanFiveBytesIsRefusedAsProtobufRefusesIt) {
  // Field 3 (data) of 2 bytes, the length padded to 5 and 6 bytes.
  const std::string five = std::string(
      "\x1a\x82\x80\x80\x80\x00"
      "ab",
      8);
  const std::string six = std::string(
      "\x1a\x82\x80\x80\x80\x80\x00"
      "ab",
      9);
  PushChunk push;
  PullChunk pull;
  ASSERT_TRUE(push.ParseFromString(five));
  ASSERT_TRUE(pull.ParseFromString(five));
  ASSERT_FALSE(push.ParseFromString(six));
  ASSERT_FALSE(pull.ParseFromString(six));
  MessageReader reader;
  MessageReader::PushChunkView push_view;
  ASSERT_OK(reader.ParsePushChunk(Whole(five), &push_view));
  EXPECT_EQ(push_view.data.ToString(), "ab");
  EXPECT_THAT(reader.ParsePushChunk(Whole(six), &push_view),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("field length longer than 5 bytes")));
  MessageReader::PullChunkView pull_view;
  ASSERT_OK(reader.ParsePullChunk(Whole(five), &pull_view));
  EXPECT_EQ(pull_view.data.ToString(), "ab");
  EXPECT_THAT(reader.ParsePullChunk(Whole(six), &pull_view),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("field length longer than 5 bytes")));
}

TEST(WireTest, SmallMessagesRoundTrip) {
  PullRequest request;
  request.set_worker_rank(3);
  request.set_shard(1);
  request.set_min_version(77);
  PullRequest parsed;
  ASSERT_OK(ParseSmallMessage(SmallMessage(request), &parsed));
  EXPECT_EQ(parsed.SerializeAsString(), request.SerializeAsString());
  EXPECT_THAT(ParseSmallMessage(Whole(std::string("\x08", 1)), &parsed),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("monsoon.PullRequest")));
}

TEST(WireTest, Float32ChunkPlanCutsWholeValues) {
  // 10 values in chunks of 16 bytes: 4 + 4 + 2 values.
  const ChunkPlan plan(ENCODING_FLOAT32, 10, 512, 16);
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].first_value, 0u);
  EXPECT_EQ(plan[0].values, 4u);
  EXPECT_EQ(plan[0].data_offset, 0u);
  EXPECT_EQ(plan[0].data_bytes, 16u);
  EXPECT_EQ(plan[2].first_value, 8u);
  EXPECT_EQ(plan[2].values, 2u);
  EXPECT_EQ(plan[2].data_offset, 32u);
  EXPECT_EQ(plan[2].data_bytes, 8u);
  EXPECT_EQ(plan[2].scales_bytes, 0u);
  EXPECT_EQ(ChunkPlan(ENCODING_FLOAT32, 0, 512, 16).size(), 1u);
}

TEST(WireTest, OneBitChunkPlanCutsWholeBuckets) {
  // Buckets of 10 values: 2 bytes of bits + 8 of scales = 10 bytes each;
  // chunks of 25 bytes hold 2 buckets. 45 values = 4.5 buckets: 3 chunks.
  const ChunkPlan plan(ENCODING_ONEBIT, 45, 10, 25);
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[1].first_value, 20u);
  EXPECT_EQ(plan[1].values, 20u);
  EXPECT_EQ(plan[1].data_offset, 4u);
  EXPECT_EQ(plan[1].data_bytes, 4u);
  EXPECT_EQ(plan[1].scales_offset, 16u);
  EXPECT_EQ(plan[1].scales_bytes, 16u);
  EXPECT_EQ(plan[2].first_value, 40u);
  EXPECT_EQ(plan[2].values, 5u);
  EXPECT_EQ(plan[2].data_bytes, 1u);
  EXPECT_EQ(plan[2].scales_bytes, 8u);
  const PayloadBytes whole = PayloadBytesFor(ENCODING_ONEBIT, 45, 10);
  EXPECT_EQ(whole.data, OneBitBitsBytes(45, 10));
  EXPECT_EQ(whole.scales, 5u * 8);
  EXPECT_EQ(plan[2].data_offset + plan[2].data_bytes, whole.data);
  EXPECT_EQ(plan[2].scales_offset + plan[2].scales_bytes, whole.scales);
}

TEST(WireTest, LeaseCountsBorrowsUntilEverySliceIsGone) {
  // Larger than gRPC's inline slices (23 bytes), which it would copy.
  std::string data(100, 'x');
  data.replace(2, 3, "234");
  BufferLease lease;
  EXPECT_TRUE(lease.AwaitReleased(absl::ZeroDuration()));
  {
    grpc::Slice slice = lease.Borrow(data.data(), data.size());
    grpc::Slice part = slice.sub(2, 50);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(part.begin()), 3),
              "234");
    EXPECT_EQ(part.begin(), reinterpret_cast<const uint8_t*>(data.data()) + 2);
    grpc::ByteBuffer message =
        PushChunkMessage(nullptr, 0, part, grpc::Slice());
    slice = grpc::Slice();
    EXPECT_FALSE(lease.AwaitReleased(absl::Milliseconds(1)));
  }
  EXPECT_TRUE(lease.AwaitReleased(absl::ZeroDuration()));
}

TEST(WireTest, SharedSliceHoldsItsOwner) {
  auto owner = std::make_shared<std::vector<float>>(4, 2.0f);
  std::weak_ptr<std::vector<float>> watch = owner;
  grpc::Slice slice =
      SharedSlice(owner->data(), owner->size() * sizeof(float), owner);
  owner.reset();
  EXPECT_FALSE(watch.expired());
  slice = grpc::Slice();
  EXPECT_TRUE(watch.expired());
}

TEST(WireTest, FirstNonFiniteFindsTheFirstNanOrInf) {
  std::vector<float> values(5000, 1.0f);
  EXPECT_EQ(FirstNonFinite(values.data(), values.size()), 5000u);
  values[4100] = std::numeric_limits<float>::infinity();
  values[4500] = std::nanf("");
  EXPECT_EQ(FirstNonFinite(values.data(), values.size()), 4100u);
  values[3] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(FirstNonFinite(values.data(), values.size()), 3u);
  values[3] = std::numeric_limits<float>::max();
  values[2] = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(FirstNonFinite(values.data(), values.size()), 4100u);
}

TEST(WireTest, FirstOutsideFindsTheFirstValueBeyondTheBound) {
  std::vector<float> values(3000, 2.0f);
  values[7] = -2.0f;  // the bound itself, either sign, is inside
  EXPECT_EQ(FirstOutside(values.data(), values.size(), 2.0f), 3000u);
  values[2500] = -2.0000002f;
  EXPECT_EQ(FirstOutside(values.data(), values.size(), 2.0f), 2500u);
  values[1500] = std::nanf("");
  EXPECT_EQ(FirstOutside(values.data(), values.size(), 2.0f), 1500u);
  values[1] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FirstOutside(values.data(), values.size(), 1e30f), 1u);
  values[1] = 3.0f;
  EXPECT_EQ(FirstOutside(values.data(), values.size(), 2.5f), 1u);
  EXPECT_EQ(FirstOutside(values.data(), 1, 0.0f), 0u);
}

TEST(WireTest, FirstOutsideGivesTheLargestMagnitudeWhenAllAreInside) {
  std::vector<float> values(3001, 0.5f);
  values[2999] = -1.75f;  // in the last block, past whole vectors
  float max_abs = -1.0f;
  EXPECT_EQ(FirstOutside(values.data(), values.size(), 2.0f, &max_abs), 3001u);
  EXPECT_EQ(max_abs, 1.75f);
  EXPECT_EQ(FirstOutside(values.data(), 0, 2.0f, &max_abs), 0u);
  EXPECT_EQ(max_abs, 0.0f);
}

// Against a value-by-value reference: every lane of the 16 running maxima,
// the remainder of a block and of the whole, and the largest magnitude in
// any of them.
TEST(WireTest, FirstOutsideAgreesWithAValueByValueSearchAtEveryPosition) {
  for (size_t n : {size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{1023},
                   size_t{1024}, size_t{1041}, size_t{2071}}) {
    SCOPED_TRACE(n);
    std::vector<float> values(n);
    for (size_t i = 0; i < n; ++i) {
      values[i] = 0.5f * std::sin(static_cast<float>(i));
    }
    for (size_t at = 0; at < n; ++at) {
      std::vector<float> largest = values;
      largest[at] = -0.75f;
      float max_abs = -1.0f;
      ASSERT_EQ(FirstOutside(largest.data(), n, 1.0f, &max_abs), n) << at;
      ASSERT_EQ(max_abs, 0.75f) << at;
      std::vector<float> beyond = largest;
      beyond[at] = at % 2 == 0 ? std::nanf("") : -1.5f;
      if (at + 1 < n) beyond[n - 1] = 2.0f;  // a later one is not the first
      ASSERT_EQ(FirstOutside(beyond.data(), n, 1.0f), at) << at;
    }
  }
}

TEST(WireTest, ValuesDigestTellsAnyChangeFromTheSameValues) {
  // 1003 values: whole groups of eight lanes and a remainder.
  std::vector<float> values(1003);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = std::sin(static_cast<float>(i));
  }
  const uint64_t digest = ValuesDigest(values.data(), values.size());
  std::vector<float> copy = values;
  EXPECT_EQ(ValuesDigest(copy.data(), copy.size()), digest);
  for (size_t at : {size_t{0}, size_t{9}, size_t{1000}, size_t{1002}}) {
    copy[at] = std::nextafter(copy[at], 2.0f);  // one bit
    EXPECT_NE(ValuesDigest(copy.data(), copy.size()), digest) << at;
    copy[at] = values[at];
  }
  std::swap(copy[0], copy[8]);  // the same lane, another order
  EXPECT_NE(ValuesDigest(copy.data(), copy.size()), digest);
  std::swap(copy[0], copy[8]);
  std::swap(copy[1000], copy[1001]);  // in the remainder
  EXPECT_NE(ValuesDigest(copy.data(), copy.size()), digest);
  // A prefix of zeros is still another push.
  std::vector<float> zeros(16, 0.0f);
  EXPECT_NE(ValuesDigest(zeros.data(), 8), ValuesDigest(zeros.data(), 16));
}

TEST(WireTest, ValuesDigestJoinsFromPartsSplitAtWholeGroups) {
  std::vector<float> values(1003);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = std::cos(static_cast<float>(i));
  }
  const float* v = values.data();
  const uint64_t n = values.size();
  const uint64_t digest = ValuesDigest(v, n);
  EXPECT_EQ(DigestOfSums(SumsForDigest(v, n)), digest);
  for (uint64_t split = 0; split <= n; split += DigestSums::kLanes) {
    const DigestSums joined =
        JoinDigestSums(SumsForDigest(v, split),
                       SumsForDigest(v + split, n - split));
    ASSERT_EQ(DigestOfSums(joined), digest) << split;
  }
  // Three parts, joined last two first and first two first.
  const DigestSums a = SumsForDigest(v, 400);
  const DigestSums b = SumsForDigest(v + 400, 160);
  const DigestSums c = SumsForDigest(v + 560, n - 560);
  EXPECT_EQ(DigestOfSums(JoinDigestSums(a, JoinDigestSums(b, c))), digest);
  EXPECT_EQ(DigestOfSums(JoinDigestSums(JoinDigestSums(a, b), c)), digest);
  // Parts in the wrong order make another digest.
  EXPECT_NE(DigestOfSums(JoinDigestSums(b, a)),
            ValuesDigest(v, 560));
}

}  // namespace
}  // namespace monsoon::common
