// PushDecoder reassembles and validates one push stream for one shard: the
// header, chunk offsets and sizes (float32 chunks in order or back to
// front, proto/service.proto's Push), the total length and finiteness,
// chunk by chunk as the messages arrive (common/wire.h reads them). It also
// decodes 1-bit pushes (common/onebit.h) into float32 values. The values go
// into one buffer from the shard's pool, copied once out of the received
// messages. Nothing reaches an update rule unless all of it checks out. One
// instance per push; not thread-safe (gRPC delivers a stream's chunks one at
// a time).
#ifndef MONSOON_SERVER_PUSH_DECODER_H_
#define MONSOON_SERVER_PUSH_DECODER_H_

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/wire.h"
#include "proto/service.pb.h"
#include "server/buffer_pool.h"
#include "server/rank_slots.h"
#include "server/update_rule.h"

namespace monsoon::server {

// What a push may claim, beyond its shape.
struct PushLimits {
  // The largest magnitude of a value (after 1-bit decoding): a finite but
  // huge value would poison the weights or the optimizer's state.
  float max_abs_value = std::numeric_limits<float>::max();
  // The most examples one push may summarize (batch_size x the steps a
  // worker sums into a push).
  int64_t max_samples = std::numeric_limits<int64_t>::max();
  // If set, a push takes a slot for its rank once its header is read (before
  // any buffer), or is refused RESOURCE_EXHAUSTED; the decoder gives it back
  // at Finish (the push is whole and goes to the rule) or when destroyed.
  RankSlots* slots = nullptr;
  // Not a limit: whether Finish gives a worker's push its PushData::digest
  // (summed chunk by chunk as they land; sync needs it to tell a push sent
  // again from another). A forwarded one (replica_seq) needs none: its
  // seq tells.
  bool digest = false;
};

// Where a rank's data may end at most: positions stay far from overflow.
inline constexpr int64_t kMaxSampleOffset = int64_t{1} << 53;

class PushDecoder {
 public:
  // `encoding` is what the run's config makes workers send; a push in any
  // other encoding is refused. `buffers` (not owned, of shard_size floats)
  // must outlive the decoder.
  PushDecoder(int shard, uint64_t shard_size, int num_workers,
              PushEncoding encoding, int bucket_size, FloatBufferPool* buffers,
              PushLimits limits = {});
  ~PushDecoder();
  PushDecoder(const PushDecoder&) = delete;
  PushDecoder& operator=(const PushDecoder&) = delete;

  // Takes the next message of the stream. INVALID_ARGUMENT says what is
  // wrong with it (also a NaN, infinite or out-of-bounds value, naming its
  // index, or a claim of more examples than a push can hold).
  absl::Status Add(const grpc::ByteBuffer& message);

  // The complete push, once the stream has ended; its values stay valid as
  // long as the decoder, or the rule that takes over their buffer
  // (PushData::buffer). INVALID_ARGUMENT if it is empty or short.
  absl::StatusOr<PushData> Finish();

  // Hands the storage of `push` (what Finish returned: its values' buffer,
  // and a 1-bit push's bits and scales) to a holder that keeps it as long
  // as the holder lives, and points `push` at it. Null, and `push`
  // unchanged, when a rule took the values' buffer (PushData::buffer).
  std::shared_ptr<const void> ReleaseStorage(PushData* push);

  // Whether the header has been read (and with it worker_rank and session
  // of the push Finish returns).
  bool has_header() const { return have_header_; }
  int worker_rank() const { return data_.worker_rank; }
  uint64_t session() const { return data_.session; }
  // Whether the push is one its range's primary forwarded (replica_seq).
  bool forwarded() const { return data_.replica_seq > 0; }
  // Whether every value of the push is in (Finish would return it): where
  // pushes follow one another on one call (Replicate), the end of one.
  bool whole() const { return have_header_ && lo_ == 0 && hi_ == shard_size_; }

  // Serialized bytes received so far.
  int64_t wire_bytes() const { return data_.wire_bytes; }

 private:
  // Takes the first chunk's header: checks it (CheckHeader), takes the
  // rank's slot where limits_.slots is set (RESOURCE_EXHAUSTED when none is
  // free), keeps what the push says of itself in data_, and takes the
  // buffer for its values from the pool.
  absl::Status TakeHeader(const PushHeader& header);
  // INVALID_ARGUMENT where `header` does not fit this shard and run: another
  // shard, rank, length, encoding or bucket size, negative counts, more
  // examples than a push may hold, an offset beyond any run's data.
  absl::Status CheckHeader(const PushHeader& header) const;
  absl::Status AddFloat32(const common::MessageReader::PushChunkView& chunk);
  absl::Status AddOneBit(const common::MessageReader::PushChunkView& chunk);
  // Gives the rank's slot back, if this push holds one.
  void ReleaseSlot();
  // INVALID_ARGUMENT for the first of values[0, n) (the push's values
  // first to first + n) that is not finite or beyond limits_.max_abs_value;
  // else takes their largest magnitude into the push's max_abs.
  absl::Status CheckValues(const float* values, uint64_t n, uint64_t first);
  // With limits_.digest: takes values_[at, at + n), just arrived before or
  // after those summed so far, into the digest's sums while they are in
  // cache; where the lanes would not line up, Finish makes a pass instead.
  void SumForDigest(uint64_t at, uint64_t n);

  // Constant after construction.
  const PushLimits limits_;
  const int shard_;
  const uint64_t shard_size_;
  const int num_workers_;
  const PushEncoding encoding_;  // the run's
  const int bucket_size_;
  FloatBufferPool* const buffers_;

  // This push's encoding: the run's, or float32 for a forwarded one
  // (replica_seq).
  PushEncoding push_encoding_ = ENCODING_FLOAT32;
  // Whether this push gets a digest (limits_.digest, a worker's push).
  bool digest_ = false;

  int slot_rank_ = -1;  // the rank whose slot this push holds
  common::MessageReader reader_;
  common::MessageReader::PushChunkView chunk_;
  bool have_header_ = false;
  // Values [lo_, hi_) of the shard's have arrived, in chunks_ chunks.
  uint64_t lo_ = 0;
  uint64_t hi_ = 0;
  int64_t chunks_ = 0;
  FloatBufferPool::Buffer values_;
  // The digest's sums of values [lo_, hi_), while every chunk joined them
  // (digest_by_chunk_).
  common::DigestSums digest_sums_;
  bool digest_by_chunk_ = true;
  PushData data_;
  // 1-bit: the push's bits and scales so far, copied out of the messages.
  std::string bits_;
  std::string scales_;
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_PUSH_DECODER_H_
