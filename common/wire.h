// The wire: how pushes and pulls cross between workers and shards, defined
// once for both sides (as leveldb keeps log_format.h beside its writer and
// reader). The client and the server call the functions here and nothing
// else to put tensors into messages or take them out.
//
// Messages are those of proto/service.proto (PushChunk, PullChunk), so that
// any gRPC client speaks to a shard. Tensor chunks are written and read here
// by hand rather than through generated code, so that a tensor goes from the
// sender's own buffer to the socket with no copy (the message's payload is a
// slice borrowing that buffer) and from the received slices straight into
// the receiver's buffer with one. The bytes are exactly what protobuf would
// serialize for the same message (fields in number order, defaults left
// out); tests/wire_test.cc checks it.
//
// Payloads: a tensor slice of n values is ENCODING_FLOAT32 (4n bytes of
// little-endian float32 in `data`) or ENCODING_ONEBIT (common/onebit.h's
// packed bits in `data`, two float32 per bucket in `scales`). A stream cuts
// a payload into chunks by ChunkPlan: float32 chunks of chunk_bytes / 4
// values; 1-bit chunks of as many whole buckets as fit in chunk_bytes. The
// first push chunk carries the PushHeader; every chunk carries the offset,
// in values, of its first value.
#ifndef MONSOON_COMMON_WIRE_H_
#define MONSOON_COMMON_WIRE_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/message_lite.h"
#include "proto/config.pb.h"
#include "proto/service.pb.h"

namespace monsoon::common {

// ---------------------------------------------------------------------------
// Limits and sizes

// The largest message either side accepts (chunks are at most 4 MiB, the
// config's chunk_bytes limit, plus headers).
inline constexpr int kMaxMessageBytes = 8 << 20;

// Call metadata naming the shard whose range a call is for. A ps_server
// with --replicas holds two ranges (its own and the previous shard's
// backup) behind one address; a call without it is for the process's own
// range.
inline constexpr char kRangeMetadataKey[] = "monsoon-range";

// The fully qualified method names, for calls made without generated stubs.
inline constexpr char kPushMethod[] = "/monsoon.ParameterService/Push";
inline constexpr char kPullMethod[] = "/monsoon.ParameterService/Pull";
inline constexpr char kPushPullMethod[] = "/monsoon.ParameterService/PushPull";
inline constexpr char kReplicateMethod[] =
    "/monsoon.ParameterService/Replicate";

// The encoding a resolved config makes workers push.
PushEncoding PushEncodingFor(const TrainingConfig& resolved);

// Float32 values in one chunk of a push or pull stream (chunk_bytes).
uint64_t Float32ChunkValues(const TrainingConfig& resolved);

// Bytes of a payload of n values.
struct PayloadBytes {
  uint64_t data = 0;
  uint64_t scales = 0;
};
PayloadBytes PayloadBytesFor(PushEncoding encoding, uint64_t n,
                             int bucket_size);

// One chunk of a payload: its values and where its bytes lie in the
// payload's data and scales.
struct ChunkRange {
  uint64_t first_value = 0;
  uint64_t values = 0;
  uint64_t data_offset = 0;
  uint64_t data_bytes = 0;
  uint64_t scales_offset = 0;
  uint64_t scales_bytes = 0;
};

// How a payload of n values is cut into chunks (see the file comment). A
// payload of 0 values is one empty chunk.
class ChunkPlan {
 public:
  ChunkPlan(PushEncoding encoding, uint64_t n, int bucket_size,
            uint64_t chunk_bytes);
  size_t size() const { return chunks_; }
  ChunkRange operator[](size_t i) const;

 private:
  PushEncoding encoding_;
  uint64_t n_;
  int bucket_size_;
  uint64_t values_per_chunk_;  // a whole number of buckets under 1-bit
  size_t chunks_;
};

// ---------------------------------------------------------------------------
// Payload memory that gRPC borrows

// Counts the slices that borrow one buffer, so that its owner knows when
// gRPC has let go of every one (a sent message's slices may be held a little
// after the call's last callback). The owner waits for AwaitReleased before
// it overwrites or frees the buffer. Thread-safe; the count outlives the
// lease while slices hold it.
class BufferLease {
 public:
  BufferLease();

  // A slice of n bytes at `data`, without a copy; sub-slices of it count as
  // the same borrow.
  grpc::Slice Borrow(const void* data, size_t n);
  // Waits until no slice borrows the buffer. False if some still do after
  // `timeout`.
  bool AwaitReleased(absl::Duration timeout);

 private:
  struct Count;
  std::shared_ptr<Count> count_;
};

// A slice of n bytes at `data`, kept alive by a reference to `owner` until
// gRPC lets go of it.
grpc::Slice SharedSlice(const void* data, size_t n,
                        std::shared_ptr<const void> owner);

// ---------------------------------------------------------------------------
// Writing messages

// A PushChunk: `header` in the first chunk only (else null), `data` and
// `scales` (empty slices for none) borrowed, not copied.
grpc::ByteBuffer PushChunkMessage(const PushHeader* header, uint64_t offset,
                                  const grpc::Slice& data,
                                  const grpc::Slice& scales);

// What makes a PullChunk a 1-bit difference (PullChunk.encoding ONEBIT):
// its chunk's scales, borrowed, and the version it is a difference from.
struct PullDelta {
  grpc::Slice scales;
  int64_t base_version = 0;
};

// A PullChunk; `push` (the answer to the push of a PushPull call) in the
// first chunk of such a call only, else null; `delta` for a 1-bit
// difference's chunk (then `data` holds its bits), else null.
grpc::ByteBuffer PullChunkMessage(int64_t version, uint64_t offset,
                                  const grpc::Slice& data,
                                  const PushResponse* push,
                                  const PullDelta* delta = nullptr);

// A small message (requests, answers), serialized and copied.
grpc::ByteBuffer SmallMessage(const google::protobuf::MessageLite& message);

// ---------------------------------------------------------------------------
// Reading messages

// Bytes of a received message, left where gRPC put them (possibly across
// several slices) until copied out.
class ByteRange {
 public:
  ByteRange() = default;
  uint64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Copies all size() bytes to `out`.
  void CopyTo(void* out) const;
  std::string ToString() const;

 private:
  friend class MessageReader;
  const std::vector<grpc::Slice>* slices_ = nullptr;
  size_t slice_ = 0;   // where the range begins
  size_t offset_ = 0;  // within that slice
  uint64_t size_ = 0;
};

// Takes a received message's slices (a reference each, not a copy) and
// reads PushChunk or PullChunk fields from them. The views it fills stay
// valid until the next Parse or Reset. What it accepts, protobuf parses to
// the same fields (tests/fuzz/push_decoder_fuzzer checks it); it is stricter:
// a PushChunk's unknown fields are refused (a PullChunk's are skipped, as
// protobuf does), and so is a known field of the wrong wire type. One per
// stream; not thread-safe.
class MessageReader {
 public:
  struct PushChunkView {
    bool has_header = false;
    PushHeader header;
    uint64_t offset = 0;
    ByteRange data;
    ByteRange scales;
    uint64_t message_bytes = 0;  // the whole message's size
  };
  struct PullChunkView {
    int64_t version = 0;
    uint64_t offset = 0;
    ByteRange data;
    bool has_push = false;
    PushResponse push;
    // PullChunk.encoding as sent (ENCODING_FLOAT32 when absent), scales and
    // base_version.
    int64_t encoding = ENCODING_FLOAT32;
    ByteRange scales;
    int64_t base_version = 0;
    uint64_t message_bytes = 0;
  };

  // INVALID_ARGUMENT for bytes that are not such a message.
  absl::Status ParsePushChunk(const grpc::ByteBuffer& message,
                              PushChunkView* out);
  absl::Status ParsePullChunk(const grpc::ByteBuffer& message,
                              PullChunkView* out);
  // Releases the slices of the last message.
  void Reset();

 private:
  struct Field {
    uint32_t number = 0;
    uint32_t wire_type = 0;
    uint64_t varint = 0;  // VARINT
    ByteRange bytes;      // LEN
  };
  absl::Status Load(const grpc::ByteBuffer& message);
  // The next field, or false at the end of the message.
  absl::StatusOr<bool> Next(Field* field);
  bool ReadByte(uint8_t* byte);
  bool ReadVarint(uint64_t* value);
  bool Skip(uint64_t n);

  std::vector<grpc::Slice> slices_;
  size_t slice_ = 0;
  size_t offset_ = 0;
  uint64_t left_ = 0;
};

// Parses a small message (a request, an answer) from `message`.
// INVALID_ARGUMENT if it does not parse.
absl::Status ParseSmallMessage(const grpc::ByteBuffer& message,
                               google::protobuf::MessageLite* out);

// The index of the first value of data[0, n) that is NaN or infinite, or n
// when all are finite. Vectorizes.
uint64_t FirstNonFinite(const float* data, uint64_t n);

// The index of the first value of data[0, n) that is NaN or whose magnitude
// exceeds `bound` (finite, >= 0), or n when there is none. When there is
// none and `max_abs` is given, sets it to the largest magnitude (0 for
// n = 0), found in the same pass. Vectorizes.
uint64_t FirstOutside(const float* data, uint64_t n, float bound,
                      float* max_abs = nullptr);

// A digest of data[0, n)'s bits, for telling a push sent again from a
// different one (not a cryptographic hash: it guards against mistakes, not
// against a client, which rank binding keeps out). Fletcher sums in eight
// 32-bit lanes, so that it vectorizes; any change of a value or of the
// order changes it, except with a chance of about 2^-64.
uint64_t ValuesDigest(const float* data, uint64_t n);

// ValuesDigest in parts, for values that arrive in chunks: the sums of one
// run of values, which join with the next run's (in either order of
// arrival) as long as the first of the two holds a whole number of groups
// of eight, and give the run's digest.
struct DigestSums {
  static constexpr int kLanes = 8;
  uint32_t a[kLanes] = {};
  uint32_t b[kLanes] = {};
  uint64_t n = 0;  // values summed
};

// The sums of data[0, n).
DigestSums SumsForDigest(const float* data, uint64_t n);

// The sums of `first`'s values followed by `then`'s; `first.n` must be a
// multiple of DigestSums::kLanes (checked by the caller).
DigestSums JoinDigestSums(const DigestSums& first, const DigestSums& then);

// The digest of the values summed: ValuesDigest(data, n) ==
// DigestOfSums(SumsForDigest(data, n)).
uint64_t DigestOfSums(const DigestSums& sums);

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_WIRE_H_
