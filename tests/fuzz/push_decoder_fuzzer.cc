// libFuzzer target: a push stream into PushDecoder, float32 or (built with
// -DMONSOON_FUZZ_ONEBIT) 1-bit. The input is a sequence of messages, each a
// 2-byte little-endian length and that many bytes (a serialized PushChunk,
// or garbage); the stream ends at the first refused message or the input's
// end. Whatever the decoder accepts must be whole, finite, within its
// bounds, and described truly (max_abs, digest): otherwise the target
// traps.
#include <grpc/grpc.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/wire.h"
#include "server/buffer_pool.h"
#include "server/push_decoder.h"
#include "server/rank_slots.h"

namespace {

constexpr uint64_t kShardSize = 1000;
constexpr int kWorkers = 4;
constexpr int kBucket = 64;
constexpr float kMaxAbs = 1e9f;

#ifdef MONSOON_FUZZ_ONEBIT
constexpr monsoon::PushEncoding kEncoding = monsoon::ENCODING_ONEBIT;
#else
constexpr monsoon::PushEncoding kEncoding = monsoon::ENCODING_FLOAT32;
#endif

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  grpc_init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static monsoon::server::FloatBufferPool* pool =
      new monsoon::server::FloatBufferPool(kShardSize);
  monsoon::server::RankSlots slots(2);
  monsoon::server::PushLimits limits;
  limits.max_abs_value = kMaxAbs;
  limits.max_samples = 1024;
  limits.slots = &slots;
  limits.digest = true;
  monsoon::server::PushDecoder decoder(/*shard=*/0, kShardSize, kWorkers,
                                       kEncoding, kBucket, pool, limits);
  size_t at = 0;
  bool refused = false;
  while (at + 2 <= size) {
    const size_t n = data[at] | (static_cast<size_t>(data[at + 1]) << 8);
    at += 2;
    const size_t take = n < size - at ? n : size - at;
    grpc::Slice slice(data + at, take);
    grpc::ByteBuffer message(&slice, 1);
    at += take;
    if (!decoder.Add(message).ok()) {
      refused = true;
      break;
    }
  }
  if (refused) return 0;
  absl::StatusOr<monsoon::server::PushData> push = decoder.Finish();
  if (!push.ok()) return 0;
  // Accepted: it must be all there and sound.
  Check(push->values.size() == kShardSize);
  Check(push->worker_rank >= 0 && push->worker_rank < kWorkers);
  Check(push->samples >= 0 && push->samples <= limits.max_samples);
  Check(push->base_version >= 0);
  float max_abs = 0;
  for (float v : push->values) {
    Check(std::isfinite(v) && std::fabs(v) <= kMaxAbs);
    if (std::fabs(v) > max_abs) max_abs = std::fabs(v);
  }
  Check(push->max_abs == max_abs);
  Check(push->digest == monsoon::common::ValuesDigest(push->values.data(),
                                                     push->values.size()));
  return 0;
}
