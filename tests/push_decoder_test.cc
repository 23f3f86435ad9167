#include "server/push_decoder.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/float_bytes.h"
#include "common/onebit.h"
#include "common/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace monsoon::server {
namespace {

using ::monsoon::testutil::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The decoder under test is shard 1, of 5 values, with 2 workers.
constexpr int kShard = 1;
constexpr uint64_t kSize = 5;
constexpr int kWorkers = 2;

PushHeader Header(int rank = 1, int shard = kShard, uint64_t length = kSize,
                  int64_t base_version = 3, int64_t samples = 32) {
  PushHeader header;
  header.set_worker_rank(rank);
  header.set_shard(shard);
  header.set_length(length);
  header.set_base_version(base_version);
  header.set_samples(samples);
  return header;
}

PushChunk Chunk(uint64_t offset, const std::vector<float>& values) {
  PushChunk chunk;
  chunk.set_offset(offset);
  common::AppendFloatBytes(values, chunk.mutable_data());
  return chunk;
}

PushChunk First(const std::vector<float>& values,
                const PushHeader& header = Header()) {
  PushChunk chunk = Chunk(0, values);
  *chunk.mutable_header() = header;
  return chunk;
}

const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// The decoder under test with a pool of its own, fed PushChunk messages as
// the wire carries them (serialized).
class TestDecoder {
 public:
  TestDecoder(int shard, uint64_t size, int workers,
              PushEncoding encoding = ENCODING_FLOAT32, int bucket = 512,
              PushLimits limits = {})
      : pool_(size),
        decoder_(shard, size, workers, encoding, bucket, &pool_, limits) {}
  absl::Status Add(const PushChunk& chunk) {
    return decoder_.Add(common::SmallMessage(chunk));
  }
  absl::StatusOr<PushData> Finish() { return decoder_.Finish(); }

 private:
  FloatBufferPool pool_;
  PushDecoder decoder_;
};

TEST(PushDecoderTest, SingleChunkPushDecodes) {
  TestDecoder decoder(kShard, kSize, kWorkers);
  const PushChunk chunk = First({1, 2, 3, 4, 5});
  ASSERT_OK(decoder.Add(chunk));
  absl::StatusOr<PushData> push = decoder.Finish();
  ASSERT_OK(push.status());
  EXPECT_EQ(push->worker_rank, 1);
  EXPECT_EQ(push->base_version, 3);
  EXPECT_EQ(push->samples, 32);
  EXPECT_EQ(push->wire_bytes, static_cast<int64_t>(chunk.ByteSizeLong()));
  EXPECT_THAT(push->values, ElementsAre(1, 2, 3, 4, 5));
}

TEST(PushDecoderTest, MultiChunkPushReassemblesExactly) {
  TestDecoder decoder(kShard, kSize, kWorkers);
  const std::vector<PushChunk> chunks = {
      First({0.5f, -1.25f}), Chunk(2, {1e-30f, -3e30f}), Chunk(4, {7.0f})};
  int64_t bytes = 0;
  for (const PushChunk& chunk : chunks) {
    ASSERT_OK(decoder.Add(chunk));
    bytes += static_cast<int64_t>(chunk.ByteSizeLong());
  }
  absl::StatusOr<PushData> push = decoder.Finish();
  ASSERT_OK(push.status());
  EXPECT_THAT(push->values, ElementsAre(0.5f, -1.25f, 1e-30f, -3e30f, 7.0f));
  EXPECT_EQ(push->wire_bytes, bytes);
}

TEST(PushDecoderTest, APushKnowsItsLargestMagnitudeAcrossChunks) {
  TestDecoder decoder(kShard, kSize, kWorkers);
  ASSERT_OK(decoder.Add(First({0.5f, -1.25f})));
  ASSERT_OK(decoder.Add(Chunk(2, {1e-30f, -3e30f})));
  ASSERT_OK(decoder.Add(Chunk(4, {7.0f})));
  absl::StatusOr<PushData> push = decoder.Finish();
  ASSERT_OK(push.status());
  EXPECT_EQ(push->max_abs, 3e30f);
}

TEST(PushDecoderTest, ASyncShardsDecoderGivesThePushItsDigest) {
  PushLimits limits;
  limits.digest = true;
  TestDecoder decoder(kShard, kSize, kWorkers, ENCODING_FLOAT32, 512, limits);
  ASSERT_OK(decoder.Add(First({0.5f, -1.25f})));
  ASSERT_OK(decoder.Add(Chunk(2, {1e-30f, -3e30f, 7.0f})));
  absl::StatusOr<PushData> push = decoder.Finish();
  ASSERT_OK(push.status());
  const std::vector<float> values = {0.5f, -1.25f, 1e-30f, -3e30f, 7.0f};
  EXPECT_EQ(push->digest, common::ValuesDigest(values.data(), values.size()));
  // Without the option no pass is spent on it.
  TestDecoder plain(kShard, kSize, kWorkers);
  ASSERT_OK(plain.Add(First({0.5f, -1.25f, 1e-30f, -3e30f, 7.0f})));
  absl::StatusOr<PushData> other = plain.Finish();
  ASSERT_OK(other.status());
  EXPECT_EQ(other->digest, 0u);
  // Nor on an update the range's primary forwarded: its seq tells a repeat.
  TestDecoder backup(kShard, kSize, kWorkers, ENCODING_FLOAT32, 512, limits);
  PushHeader forwarded = Header();
  forwarded.set_replica_seq(4);
  forwarded.set_replica_epoch(1);
  ASSERT_OK(backup.Add(First({0.5f, -1.25f, 1e-30f, -3e30f, 7.0f}, forwarded)));
  absl::StatusOr<PushData> from_primary = backup.Finish();
  ASSERT_OK(from_primary.status());
  EXPECT_EQ(from_primary->replica_seq, 4);
  EXPECT_EQ(from_primary->digest, 0u);
}

TEST(PushDecoderTest, TheDigestSummedChunkByChunkIsTheWholePushs) {
  // 37 values: whole groups of the digest's eight lanes and a remainder.
  constexpr uint64_t kValues = 37;
  std::vector<float> values(kValues);
  for (uint64_t i = 0; i < kValues; ++i) {
    values[i] = std::sin(static_cast<float>(i) + 0.5f);
  }
  const uint64_t whole = common::ValuesDigest(values.data(), kValues);
  auto part = [&values](uint64_t begin, uint64_t end) {
    return std::vector<float>(values.begin() + begin, values.begin() + end);
  };
  PushLimits limits;
  limits.digest = true;
  // Chunks as [begin, end), in the order they arrive: in order, back to
  // front, both ways, and splits that leave the lanes out of line (where
  // Finish sums the whole push instead).
  const std::vector<std::vector<std::pair<uint64_t, uint64_t>>> orders = {
      {{0, 16}, {16, 32}, {32, 37}},
      {{24, 37}, {8, 24}, {0, 8}},
      {{8, 16}, {16, 37}, {0, 8}},
      {{0, 5}, {5, 37}},
      {{30, 37}, {3, 30}, {0, 3}},
      {{0, 37}},
  };
  for (const auto& order : orders) {
    TestDecoder decoder(kShard, kValues, kWorkers, ENCODING_FLOAT32, 512,
                        limits);
    for (size_t c = 0; c < order.size(); ++c) {
      PushChunk chunk = c == 0 ? First(part(order[c].first, order[c].second),
                                       Header(1, kShard, kValues))
                               : Chunk(order[c].first,
                                       part(order[c].first, order[c].second));
      chunk.set_offset(order[c].first);
      ASSERT_OK(decoder.Add(chunk));
    }
    absl::StatusOr<PushData> push = decoder.Finish();
    ASSERT_OK(push.status());
    EXPECT_EQ(push->digest, whole) << "chunks from " << order[0].first;
  }
}

TEST(PushDecoderTest, EmptyChunksInOrderAreHarmless) {
  TestDecoder decoder(kShard, kSize, kWorkers);
  ASSERT_OK(decoder.Add(First({})));
  ASSERT_OK(decoder.Add(Chunk(0, {1, 2, 3, 4, 5})));
  ASSERT_OK(decoder.Add(Chunk(5, {})));
  absl::StatusOr<PushData> push = decoder.Finish();
  ASSERT_OK(push.status());
  EXPECT_THAT(push->values, ElementsAre(1, 2, 3, 4, 5));
}

TEST(PushDecoderTest, FirstChunkWithoutHeaderIsInvalid) {
  TestDecoder decoder(kShard, kSize, kWorkers);
  EXPECT_THAT(decoder.Add(Chunk(0, {1, 2, 3, 4, 5})),
              StatusIs(kInvalid, HasSubstr("header")));
}

TEST(PushDecoderTest, HeaderInALaterChunkIsInvalid) {
  TestDecoder decoder(kShard, kSize, kWorkers);
  ASSERT_OK(decoder.Add(First({1, 2})));
  PushChunk second = Chunk(2, {3, 4, 5});
  *second.mutable_header() = Header();
  EXPECT_THAT(decoder.Add(second), StatusIs(kInvalid, HasSubstr("header")));
}

TEST(PushDecoderTest, WrongLengthIsInvalid) {
  for (uint64_t length : {uint64_t{0}, kSize - 1, kSize + 1}) {
    SCOPED_TRACE(length);
    TestDecoder decoder(kShard, kSize, kWorkers);
    EXPECT_THAT(decoder.Add(First({1, 2, 3, 4, 5}, Header(1, kShard, length))),
                StatusIs(kInvalid, HasSubstr("holds 5")));
  }
}

TEST(PushDecoderTest, PushForAnotherShardIsInvalid) {
  for (int shard : {0, 2, -1, 1000}) {
    SCOPED_TRACE(shard);
    TestDecoder decoder(kShard, kSize, kWorkers);
    EXPECT_THAT(decoder.Add(First({1, 2, 3, 4, 5}, Header(1, shard))),
                StatusIs(kInvalid, HasSubstr("reached shard 1")));
  }
}

TEST(PushDecoderTest, WorkerRankOutsideTheWorkersIsInvalid) {
  for (int rank : {-1, 2, 100}) {
    SCOPED_TRACE(rank);
    TestDecoder decoder(kShard, kSize, kWorkers);
    EXPECT_THAT(decoder.Add(First({1, 2, 3, 4, 5}, Header(rank))),
                StatusIs(kInvalid, HasSubstr("worker rank")));
  }
}

TEST(PushDecoderTest, NegativeBaseVersionOrSamplesIsInvalid) {
  TestDecoder negative_version(kShard, kSize, kWorkers);
  EXPECT_THAT(negative_version.Add(
                  First({1, 2, 3, 4, 5}, Header(1, kShard, kSize, -1, 32))),
              StatusIs(kInvalid, HasSubstr("negative")));
  TestDecoder negative_samples(kShard, kSize, kWorkers);
  EXPECT_THAT(negative_samples.Add(
                  First({1, 2, 3, 4, 5}, Header(1, kShard, kSize, 0, -32))),
              StatusIs(kInvalid, HasSubstr("negative")));
}

TEST(PushDecoderTest, ChunksMayComeBackToFront) {
  // What a worker sends while its backward pass runs: the end of the range
  // first, then each chunk ending where the ones before it begin.
  TestDecoder decoder(kShard, kSize, kWorkers);
  PushChunk last = First({4, 5});
  last.set_offset(3);
  ASSERT_OK(decoder.Add(last));
  ASSERT_OK(decoder.Add(Chunk(1, {2, 3})));
  ASSERT_OK(decoder.Add(Chunk(0, {1})));
  absl::StatusOr<PushData> push = decoder.Finish();
  ASSERT_OK(push.status());
  EXPECT_THAT(push->values, ElementsAre(1, 2, 3, 4, 5));
  EXPECT_EQ(push->samples, 32);

  // Both ways in one push: on from the first chunk's end, and back from
  // its beginning.
  TestDecoder both(kShard, kSize, kWorkers);
  PushChunk middle = First({3});
  middle.set_offset(2);
  ASSERT_OK(both.Add(middle));
  ASSERT_OK(both.Add(Chunk(3, {4, 5})));
  ASSERT_OK(both.Add(Chunk(0, {1, 2})));
  push = both.Finish();
  ASSERT_OK(push.status());
  EXPECT_THAT(push->values, ElementsAre(1, 2, 3, 4, 5));
}

TEST(PushDecoderTest, ChunksThatLeaveAGapOrOverlapAreInvalid) {
  {
    TestDecoder decoder(kShard, kSize, kWorkers);
    ASSERT_OK(decoder.Add(First({1, 2})));
    EXPECT_THAT(decoder.Add(Chunk(3, {4, 5})),
                StatusIs(kInvalid, HasSubstr("at offset 3 after values [0, 2)")));
  }
  {
    TestDecoder decoder(kShard, kSize, kWorkers);
    ASSERT_OK(decoder.Add(First({1, 2})));
    EXPECT_THAT(decoder.Add(Chunk(0, {1, 2})),
                StatusIs(kInvalid, HasSubstr("at offset 0 after values [0, 2)")));
  }
  {
    // Back to front, one value short of where the last chunk began.
    TestDecoder decoder(kShard, kSize, kWorkers);
    PushChunk last = First({4, 5});
    last.set_offset(3);
    ASSERT_OK(decoder.Add(last));
    EXPECT_THAT(decoder.Add(Chunk(0, {1, 2})),
                StatusIs(kInvalid, HasSubstr("must begin where they end or end "
                                             "where they begin")));
    EXPECT_THAT(decoder.Finish(),
                StatusIs(kInvalid, HasSubstr("ended after 2 of 5 values")));
  }
  {
    // A first chunk that ends beyond the shard, from an offset near 2^64.
    TestDecoder decoder(kShard, kSize, kWorkers);
    PushChunk beyond = First({1, 2});
    beyond.set_offset(4);
    EXPECT_THAT(decoder.Add(beyond),
                StatusIs(kInvalid, HasSubstr("ends beyond the 5 values")));
    TestDecoder wraps(kShard, kSize, kWorkers);
    beyond.set_offset(~uint64_t{0});
    EXPECT_THAT(wraps.Add(beyond),
                StatusIs(kInvalid, HasSubstr("ends beyond the 5 values")));
  }
}

TEST(PushDecoderTest, ChunkOfPartialFloatIsInvalid) {
  TestDecoder decoder(kShard, kSize, kWorkers);
  PushChunk first = First({1, 2});
  first.mutable_data()->push_back('\0');  // 9 bytes
  EXPECT_THAT(decoder.Add(first),
              StatusIs(kInvalid, HasSubstr("9 bytes is not a whole number")));

  TestDecoder later(kShard, kSize, kWorkers);
  ASSERT_OK(later.Add(First({1, 2})));
  PushChunk second = Chunk(2, {3});
  second.mutable_data()->resize(6);
  EXPECT_THAT(later.Add(second), StatusIs(kInvalid, HasSubstr("6 bytes")));
}

TEST(PushDecoderTest, MoreValuesThanTheShardHoldsIsInvalid) {
  TestDecoder decoder(kShard, kSize, kWorkers);
  EXPECT_THAT(decoder.Add(First({1, 2, 3, 4, 5, 6})),
              StatusIs(kInvalid, HasSubstr("ends beyond the 5 values")));

  TestDecoder split(kShard, kSize, kWorkers);
  ASSERT_OK(split.Add(First({1, 2, 3})));
  EXPECT_THAT(split.Add(Chunk(3, {4, 5, 6})),
              StatusIs(kInvalid, HasSubstr("ends beyond the 5 values")));
}

TEST(PushDecoderTest, TooShortPushIsInvalid) {
  TestDecoder decoder(kShard, kSize, kWorkers);
  ASSERT_OK(decoder.Add(First({1, 2})));
  ASSERT_OK(decoder.Add(Chunk(2, {3})));
  EXPECT_THAT(decoder.Finish(),
              StatusIs(kInvalid, HasSubstr("ended after 3 of 5 values")));
}

TEST(PushDecoderTest, EmptyStreamIsInvalid) {
  TestDecoder decoder(kShard, kSize, kWorkers);
  EXPECT_THAT(decoder.Finish(), StatusIs(kInvalid, HasSubstr("no header")));
}

TEST(PushDecoderTest, NonFiniteValuesAreInvalidNamingTheIndex) {
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  for (float bad : {kNan, kInf, -kInf}) {
    SCOPED_TRACE(bad);
    TestDecoder decoder(kShard, kSize, kWorkers);
    ASSERT_OK(decoder.Add(First({1, 2})));
    // Refused with the chunk that carries it, before the push ends.
    EXPECT_THAT(decoder.Add(Chunk(2, {3, bad, 5})),
                StatusIs(kInvalid, HasSubstr("push value 3 is")));
  }
}

TEST(PushDecoderTest, ValuesBeyondTheBoundAreInvalidNamingIt) {
  const PushLimits limits{/*max_abs_value=*/100.0f, /*max_samples=*/64};
  for (float bad : {100.5f, -1e20f, 3e38f}) {
    SCOPED_TRACE(bad);
    TestDecoder decoder(kShard, kSize, kWorkers, ENCODING_FLOAT32, 512, limits);
    ASSERT_OK(decoder.Add(First({100.0f, -100.0f})));  // the bound itself
    EXPECT_THAT(decoder.Add(Chunk(2, {3, 4, bad})),
                StatusIs(kInvalid, HasSubstr("push value 4 is")));
  }
  TestDecoder decoder(kShard, kSize, kWorkers, ENCODING_FLOAT32, 512, limits);
  EXPECT_THAT(decoder.Add(First({1, 2, 1e20f, 4, 5})),
              StatusIs(kInvalid, HasSubstr("beyond the shard's bound of 100 "
                                           "(--max_abs_gradient)")));
}

TEST(PushDecoderTest, ClaimsOfMoreExamplesThanAPushHoldsAreInvalid) {
  const PushLimits limits{/*max_abs_value=*/1e9f, /*max_samples=*/64};
  {
    TestDecoder decoder(kShard, kSize, kWorkers, ENCODING_FLOAT32, 512, limits);
    PushHeader header = Header();
    header.set_samples(64);
    EXPECT_OK(decoder.Add(First({1, 2, 3, 4, 5}, header)));
  }
  {
    TestDecoder decoder(kShard, kSize, kWorkers, ENCODING_FLOAT32, 512, limits);
    PushHeader header = Header();
    header.set_samples(std::numeric_limits<int64_t>::max());
    EXPECT_THAT(decoder.Add(First({1, 2, 3, 4, 5}, header)),
                StatusIs(kInvalid, HasSubstr("summarizes at most 64")));
  }
  {
    TestDecoder decoder(kShard, kSize, kWorkers, ENCODING_FLOAT32, 512, limits);
    PushHeader header = Header();
    header.set_sample_offset(kMaxSampleOffset + 1);
    EXPECT_THAT(decoder.Add(First({1, 2, 3, 4, 5}, header)),
                StatusIs(kInvalid, HasSubstr("beyond any run's data")));
  }
}

TEST(PushDecoderTest, ARankHasAtMostItsSlotsOfPushesInFlight) {
  RankSlots slots(/*per_rank=*/2);
  PushLimits limits;
  limits.slots = &slots;
  auto decoder = [&] {
    return std::make_unique<TestDecoder>(kShard, kSize, kWorkers,
                                         ENCODING_FLOAT32, 512, limits);
  };
  auto a = decoder(), b = decoder(), c = decoder(), other = decoder();
  ASSERT_OK(a->Add(First({1, 2})));
  ASSERT_OK(b->Add(First({1, 2})));
  EXPECT_THAT(c->Add(First({1, 2})),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("rank 1 already has 2 pushes in flight")));
  // Another rank has slots of its own.
  ASSERT_OK(other->Add(First({1, 2}, Header(/*rank=*/0))));
  // A push that ends, however it ends, gives its slot back: one that is
  // whole as soon as it is handed over (Finish), even if its stream's call
  // lingers on (a push-pull waiting for its sync step).
  a.reset();
  c = decoder();
  EXPECT_OK(c->Add(First({1, 2})));
  ASSERT_OK(b->Add(Chunk(2, {3, 4, 5})));
  ASSERT_OK(b->Finish().status());
  auto d = decoder();
  EXPECT_OK(d->Add(First({1, 2})));
}

TEST(PushDecoderTest, MessageThatIsNotAPushChunkIsInvalid) {
  FloatBufferPool pool(kSize);
  PushDecoder decoder(kShard, kSize, kWorkers, ENCODING_FLOAT32, 512, &pool);
  grpc::Slice garbage(std::string("\x1a\x09\x01", 3));
  EXPECT_THAT(decoder.Add(grpc::ByteBuffer(&garbage, 1)),
              StatusIs(kInvalid, HasSubstr("malformed message")));
}

TEST(PushDecoderTest, PushesReuseThePoolsBuffers) {
  FloatBufferPool pool(kSize);
  for (int push = 0; push < 5; ++push) {
    PushDecoder decoder(kShard, kSize, kWorkers, ENCODING_FLOAT32, 512, &pool);
    ASSERT_OK(decoder.Add(common::SmallMessage(First({1, 2, 3, 4, 5}))));
    ASSERT_OK_AND_ASSIGN(PushData data, decoder.Finish());
    EXPECT_THAT(data.values, ElementsAre(1, 2, 3, 4, 5));
  }
  EXPECT_EQ(pool.allocations(), 1);
}

TEST(PushDecoderTest, Float32DecoderRefusesOtherEncodings) {
  TestDecoder decoder(kShard, kSize, kWorkers);
  PushHeader header = Header();
  header.set_encoding(ENCODING_ONEBIT);
  header.set_bucket_size(512);
  EXPECT_THAT(decoder.Add(First({1, 2, 3, 4, 5}, header)),
              StatusIs(kInvalid, HasSubstr("ENCODING_ONEBIT")));

  TestDecoder with_scales(kShard, kSize, kWorkers);
  PushChunk chunk = First({1, 2, 3, 4, 5});
  chunk.set_scales(std::string(8, '\0'));
  EXPECT_THAT(with_scales.Add(chunk), StatusIs(kInvalid, HasSubstr("scales")));
}

// 1-bit pushes in buckets of 2: the decoder yields exactly what
// common::OneBitDecode makes of the chunks' bits and scales.
class OneBitPushDecoderTest : public testing::Test {
 protected:
  static constexpr int kBucket = 2;

  PushHeader OneBitHeader(int bucket_size = kBucket) {
    PushHeader header = Header();
    header.set_encoding(ENCODING_ONEBIT);
    header.set_bucket_size(bucket_size);
    return header;
  }

  // Encodes values [begin, end) of kGradient as one chunk.
  PushChunk Encoded(uint64_t begin, uint64_t end) {
    std::vector<float> residual(end - begin, 0.0f);
    common::OneBitEncoded encoded;
    common::OneBitEncode(
        absl::MakeConstSpan(kGradient).subspan(begin, end - begin),
        absl::MakeSpan(residual), kBucket, &encoded);
    PushChunk chunk;
    chunk.set_offset(begin);
    chunk.set_data(encoded.bits);
    chunk.set_scales(encoded.scales);
    std::vector<float> decoded(end - begin);
    EXPECT_OK(common::OneBitDecode(encoded.bits, encoded.scales, kBucket,
                                   absl::MakeSpan(decoded)));
    expected_.insert(expected_.end(), decoded.begin(), decoded.end());
    return chunk;
  }

  const std::vector<float> kGradient = {0.5f, -1.5f, 2.0f, 4.0f, -3.0f};
  std::vector<float> expected_;
};

TEST_F(OneBitPushDecoderTest, MultiChunkPushDecodes) {
  TestDecoder decoder(kShard, kSize, kWorkers, ENCODING_ONEBIT, kBucket);
  PushChunk first = Encoded(0, 4);  // buckets 0 and 1
  *first.mutable_header() = OneBitHeader();
  ASSERT_OK(decoder.Add(first));
  ASSERT_OK(decoder.Add(Encoded(4, 5)));  // bucket 2, one value
  absl::StatusOr<PushData> push = decoder.Finish();
  ASSERT_OK(push.status());
  EXPECT_EQ(push->values, expected_);
  // One bucket per sign pattern: {0.5, -1.5} keeps both values exactly.
  EXPECT_FLOAT_EQ(push->values[0], 0.5f);
  EXPECT_FLOAT_EQ(push->values[1], -1.5f);
  // {2, 4} are both non-negative: each becomes their mean.
  EXPECT_FLOAT_EQ(push->values[2], 3.0f);
  EXPECT_FLOAT_EQ(push->values[3], 3.0f);
  EXPECT_FLOAT_EQ(push->values[4], -3.0f);
}

// The push as it came, for a primary to forward: the chunks' bits and
// scales joined, which decode to the push's values.
TEST_F(OneBitPushDecoderTest, APushKeepsItsBitsAndScalesWhole) {
  TestDecoder decoder(kShard, kSize, kWorkers, ENCODING_ONEBIT, kBucket);
  PushChunk first = Encoded(0, 4);
  *first.mutable_header() = OneBitHeader();
  const PushChunk second = Encoded(4, 5);
  ASSERT_OK(decoder.Add(first));
  ASSERT_OK(decoder.Add(second));
  absl::StatusOr<PushData> push = decoder.Finish();
  ASSERT_OK(push.status());
  EXPECT_EQ(push->encoding, ENCODING_ONEBIT);
  EXPECT_EQ(push->onebit_bits, first.data() + second.data());
  EXPECT_EQ(push->onebit_scales, first.scales() + second.scales());
  std::vector<float> decoded(kSize);
  ASSERT_OK(common::OneBitDecode(push->onebit_bits, push->onebit_scales,
                                 kBucket, absl::MakeSpan(decoded)));
  EXPECT_EQ(decoded, expected_);
}

// A primary's forward may outlive the push in gRPC's hands: the push's
// storage, released, is no longer the decoder's (nor its pool's).
TEST_F(OneBitPushDecoderTest, AReleasedPushOutlivesItsDecoder) {
  FloatBufferPool pool(kSize);
  auto decoder = std::make_unique<PushDecoder>(kShard, kSize, kWorkers,
                                               ENCODING_ONEBIT, kBucket, &pool);
  PushChunk first = Encoded(0, 4);
  *first.mutable_header() = OneBitHeader();
  const PushChunk second = Encoded(4, 5);
  ASSERT_OK(decoder->Add(common::SmallMessage(first)));
  ASSERT_OK(decoder->Add(common::SmallMessage(second)));
  absl::StatusOr<PushData> push = decoder->Finish();
  ASSERT_OK(push.status());
  std::shared_ptr<const void> storage = decoder->ReleaseStorage(&*push);
  ASSERT_NE(storage, nullptr);
  EXPECT_EQ(push->buffer, nullptr);
  decoder.reset();
  // Had the decoder kept the values' buffer, the pool would hand it out
  // again here, overwritten.
  FloatBufferPool::Buffer reused = pool.Take();
  std::fill(reused.get(), reused.get() + kSize, 7.0f);
  EXPECT_EQ(std::vector<float>(push->values.begin(), push->values.end()),
            expected_);
  EXPECT_EQ(push->onebit_bits, first.data() + second.data());
  EXPECT_EQ(push->onebit_scales, first.scales() + second.scales());
}

// A rule that took the values' buffer (sync's sum) leaves nothing to
// release.
TEST(PushDecoderTest, NothingIsReleasedOnceARuleTookTheValues) {
  FloatBufferPool pool(kSize);
  PushDecoder decoder(kShard, kSize, kWorkers, ENCODING_FLOAT32, 512, &pool);
  ASSERT_OK(decoder.Add(common::SmallMessage(First({1, 2, 3, 4, 5}))));
  absl::StatusOr<PushData> push = decoder.Finish();
  ASSERT_OK(push.status());
  FloatBufferPool::Buffer taken = std::move(*push->buffer);
  EXPECT_EQ(decoder.ReleaseStorage(&*push), nullptr);
  EXPECT_EQ(taken[4], 5.0f);
}

// A range's primary forwards a push as float32 values, or as it came in
// the run's encoding; no other.
TEST_F(OneBitPushDecoderTest, AForwardedPushIsFloat32OrInTheRunsEncoding) {
  PushHeader forwarded = OneBitHeader();
  forwarded.set_replica_seq(3);
  forwarded.set_replica_epoch(1);
  TestDecoder onebit_run(kShard, kSize, kWorkers, ENCODING_ONEBIT, kBucket);
  PushChunk first = Encoded(0, 4);
  *first.mutable_header() = forwarded;
  ASSERT_OK(onebit_run.Add(first));
  ASSERT_OK(onebit_run.Add(Encoded(4, 5)));
  absl::StatusOr<PushData> push = onebit_run.Finish();
  ASSERT_OK(push.status());
  EXPECT_EQ(push->replica_seq, 3);
  EXPECT_EQ(push->values, expected_);

  PushHeader as_float32 = Header();
  as_float32.set_replica_seq(3);
  as_float32.set_replica_epoch(1);
  TestDecoder onebit_run_float32(kShard, kSize, kWorkers, ENCODING_ONEBIT,
                                 kBucket);
  EXPECT_OK(onebit_run_float32.Add(First({1, 2, 3, 4, 5}, as_float32)));

  TestDecoder float32_run(kShard, kSize, kWorkers);
  EXPECT_THAT(float32_run.Add(first),
              StatusIs(kInvalid, HasSubstr("must be float32 or in this run's "
                                           "encoding (ENCODING_FLOAT32), not "
                                           "ENCODING_ONEBIT")));
}

TEST_F(OneBitPushDecoderTest, ChunksMustComeInOrder) {
  // 1-bit chunks hold whole buckets counted from the range's start: only
  // float32 pushes may come back to front.
  TestDecoder decoder(kShard, kSize, kWorkers, ENCODING_ONEBIT, kBucket);
  PushChunk last = Encoded(4, 5);
  *last.mutable_header() = OneBitHeader();
  EXPECT_THAT(decoder.Add(last),
              StatusIs(kInvalid, HasSubstr("1-bit chunk at offset 4 but 0 "
                                           "values have arrived")));
}

TEST_F(OneBitPushDecoderTest, WrongBucketSizeIsInvalid) {
  TestDecoder decoder(kShard, kSize, kWorkers, ENCODING_ONEBIT, kBucket);
  PushChunk first = Encoded(0, 5);
  *first.mutable_header() = OneBitHeader(4);
  EXPECT_THAT(decoder.Add(first),
              StatusIs(kInvalid, HasSubstr("buckets of 4")));
}

TEST_F(OneBitPushDecoderTest, NonFiniteScaleIsInvalid) {
  TestDecoder decoder(kShard, kSize, kWorkers, ENCODING_ONEBIT, kBucket);
  PushChunk first = Encoded(0, 5);
  *first.mutable_header() = OneBitHeader();
  std::string scales = first.scales();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(scales.data() + 4, &nan, sizeof(nan));
  first.set_scales(scales);
  EXPECT_THAT(decoder.Add(first),
              StatusIs(kInvalid, HasSubstr("bucket 0 has a non-finite")));
}

TEST_F(OneBitPushDecoderTest, ScaleBeyondTheBoundIsInvalid) {
  TestDecoder decoder(kShard, kSize, kWorkers, ENCODING_ONEBIT, kBucket,
                      PushLimits{/*max_abs_value=*/10.0f});
  PushChunk first = Encoded(0, 5);
  *first.mutable_header() = OneBitHeader();
  std::string scales = first.scales();
  const float huge = 1e20f;
  std::memcpy(scales.data() + 4, &huge, sizeof(huge));
  first.set_scales(scales);
  EXPECT_THAT(decoder.Add(first),
              StatusIs(kInvalid, HasSubstr("beyond the shard's bound of 10")));
}

TEST_F(OneBitPushDecoderTest, ChunkWithMoreBucketsThanRemainIsInvalid) {
  TestDecoder decoder(kShard, kSize, kWorkers, ENCODING_ONEBIT, kBucket);
  PushChunk first = Encoded(0, 4);
  *first.mutable_header() = OneBitHeader();
  ASSERT_OK(decoder.Add(first));
  PushChunk second = Encoded(4, 5);
  second.set_scales(second.scales() + second.scales());  // two buckets
  second.set_data(second.data() + second.data());
  EXPECT_THAT(decoder.Add(second), StatusIs(kInvalid, HasSubstr("buckets")));
}

TEST(PushEncodingForTest, FollowsTheConfigsCompression) {
  TrainingConfig config;
  config.set_compression(COMPRESSION_NONE);
  EXPECT_EQ(common::PushEncodingFor(config), ENCODING_FLOAT32);
  config.set_compression(COMPRESSION_ONEBIT);
  EXPECT_EQ(common::PushEncodingFor(config), ENCODING_ONEBIT);
}

}  // namespace
}  // namespace monsoon::server
