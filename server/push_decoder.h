// PushDecoder reassembles and validates one push stream for one shard: the
// header, chunk offsets and sizes, the total length and finiteness. It also
// decodes 1-bit pushes (common/onebit.h) into float32 values. Nothing
// reaches an update rule unless all of it checks out. One instance per push;
// not thread-safe (gRPC delivers a stream's chunks one at a time).
#ifndef MONSOON_SERVER_PUSH_DECODER_H_
#define MONSOON_SERVER_PUSH_DECODER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/config.pb.h"
#include "proto/service.pb.h"
#include "server/update_rule.h"

namespace monsoon::server {

class PushDecoder {
 public:
  // `encoding` is what the run's config makes workers send; a push in any
  // other encoding is refused.
  PushDecoder(int shard, uint64_t shard_size, int num_workers,
              PushEncoding encoding = ENCODING_FLOAT32, int bucket_size = 512);

  // Takes the next chunk. INVALID_ARGUMENT says what is wrong with it.
  absl::Status Add(const PushChunk& chunk);

  // The complete push, once the stream has ended. INVALID_ARGUMENT if it is
  // short, or holds NaN or Inf (the message names the first bad index).
  absl::StatusOr<PushData> Finish();

 private:
  absl::Status AddOneBit(const PushChunk& chunk);

  // Constant after construction.
  const int shard_;
  const uint64_t shard_size_;
  const int num_workers_;
  const PushEncoding encoding_;
  const int bucket_size_;

  bool have_header_ = false;
  uint64_t received_ = 0;
  PushData data_;
};

// The encoding a resolved config makes workers push.
PushEncoding PushEncodingFor(const TrainingConfig& resolved);

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_PUSH_DECODER_H_
