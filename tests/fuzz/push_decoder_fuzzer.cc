// libFuzzer target: a push stream into PushDecoder, float32 or (built with
// -DMONSOON_FUZZ_ONEBIT) 1-bit. The input is a sequence of messages, each a
// 2-byte little-endian prefix and that many bytes (a serialized PushChunk,
// or garbage): the prefix's low 14 bits are the length, its top 2 bits how
// many more slices the message is cut into, as gRPC may hand a message over
// in several. The stream ends at the first refused message or the input's
// end. Whatever the decoder accepts must be whole (every value written by
// it), finite, within PushLimits::max_abs_value, and described truly
// (max_abs, digest, wire bytes): otherwise the target traps.
//
// Each message is also read by MessageReader as a PushChunk and as a
// PullChunk on its own: what the reader accepts, protobuf must parse to the
// same fields (the reader is stricter, never looser, than protobuf).
#include <grpc/grpc.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/wire.h"
#include "proto/service.pb.h"
#include "server/buffer_pool.h"
#include "server/push_decoder.h"
#include "server/rank_slots.h"

namespace {

constexpr uint64_t kShardSize = 1000;
constexpr int kWorkers = 4;
constexpr int kBucket = 64;
constexpr float kMaxAbs = 1e9f;
constexpr int64_t kMaxSamples = 1024;

#ifdef MONSOON_FUZZ_ONEBIT
constexpr monsoon::PushEncoding kEncoding = monsoon::ENCODING_ONEBIT;
#else
constexpr monsoon::PushEncoding kEncoding = monsoon::ENCODING_FLOAT32;
#endif

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

// `bytes` as gRPC may deliver it: in `slices` pieces of about equal size.
grpc::ByteBuffer Message(const uint8_t* bytes, size_t n, int slices) {
  std::vector<grpc::Slice> pieces;
  size_t at = 0;
  for (int i = 0; i < slices; ++i) {
    const size_t end = i + 1 == slices ? n : n * (i + 1) / slices;
    pieces.emplace_back(bytes + at, end - at);
    at = end;
  }
  return grpc::ByteBuffer(pieces.data(), pieces.size());
}

// The reader against protobuf on one message.
void CheckAgainstProtobuf(const grpc::ByteBuffer& message,
                          const uint8_t* bytes, size_t n) {
  monsoon::common::MessageReader reader;
  monsoon::common::MessageReader::PushChunkView push;
  if (reader.ParsePushChunk(message, &push).ok()) {
    monsoon::PushChunk parsed;
    Check(parsed.ParseFromArray(bytes, static_cast<int>(n)));
    Check(push.message_bytes == n);
    Check(push.has_header == parsed.has_header());
    Check(push.header.SerializeAsString() ==
          parsed.header().SerializeAsString());
    Check(push.offset == parsed.offset());
    Check(push.data.ToString() == parsed.data());
    Check(push.scales.ToString() == parsed.scales());
    std::string copied(push.data.size(), '\0');
    push.data.CopyTo(copied.data());
    Check(copied == parsed.data());
  }
  reader.Reset();
  monsoon::common::MessageReader::PullChunkView pull;
  if (reader.ParsePullChunk(message, &pull).ok()) {
    monsoon::PullChunk parsed;
    Check(parsed.ParseFromArray(bytes, static_cast<int>(n)));
    Check(pull.message_bytes == n);
    Check(pull.version == parsed.version());
    Check(pull.offset == parsed.offset());
    Check(pull.data.ToString() == parsed.data());
    Check(pull.has_push == parsed.has_push());
    Check(pull.push.SerializeAsString() == parsed.push().SerializeAsString());
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  grpc_init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static monsoon::server::FloatBufferPool* pool =
      new monsoon::server::FloatBufferPool(kShardSize);
  // The pool holds one buffer, which the decoder will take: NaN in every
  // value it does not write makes a push accepted short fail below.
  {
    monsoon::server::FloatBufferPool::Buffer buffer = pool->Take();
    for (uint64_t i = 0; i < kShardSize; ++i) {
      buffer[i] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  monsoon::server::RankSlots slots(2);
  monsoon::server::PushLimits limits;
  limits.max_abs_value = kMaxAbs;
  limits.max_samples = kMaxSamples;
  limits.slots = &slots;
  limits.digest = true;
  monsoon::server::PushDecoder decoder(/*shard=*/0, kShardSize, kWorkers,
                                       kEncoding, kBucket, pool, limits);
  size_t at = 0;
  int64_t wire_bytes = 0;
  while (at + 2 <= size) {
    const size_t prefix = data[at] | (static_cast<size_t>(data[at + 1]) << 8);
    at += 2;
    const size_t n = std::min(prefix & 0x3fff, size - at);
    const int slices = 1 + static_cast<int>(prefix >> 14);
    grpc::ByteBuffer message = Message(data + at, n, slices);
    CheckAgainstProtobuf(message, data + at, n);
    at += n;
    wire_bytes += static_cast<int64_t>(n);
    if (!decoder.Add(message).ok()) return 0;
  }
  absl::StatusOr<monsoon::server::PushData> push = decoder.Finish();
  if (!push.ok()) return 0;
  // Accepted: it must be all there and sound.
  Check(push->values.size() == kShardSize);
  Check(push->worker_rank >= 0 && push->worker_rank < kWorkers);
  Check(push->samples >= 0 && push->samples <= kMaxSamples);
  Check(push->base_version >= 0);
  Check(push->sample_offset >= 0 &&
        push->sample_offset <= monsoon::server::kMaxSampleOffset);
  Check(push->wire_bytes == wire_bytes);
  float max_abs = 0;
  for (float v : push->values) {
    Check(std::isfinite(v) && std::fabs(v) <= kMaxAbs);
    if (std::fabs(v) > max_abs) max_abs = std::fabs(v);
  }
  Check(push->max_abs == max_abs);
  Check(push->digest == monsoon::common::ValuesDigest(push->values.data(),
                                                     push->values.size()));
  // Finish gave the rank's slot back.
  Check(slots.Acquire(push->worker_rank) && slots.Acquire(push->worker_rank));
  return 0;
}
