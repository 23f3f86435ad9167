// PushDecoder reassembles and validates one push stream for one shard: the
// header, chunk offsets and sizes, the total length and finiteness. Nothing
// reaches an update rule unless all of it checks out. One instance per push;
// not thread-safe (gRPC delivers a stream's chunks one at a time).
#ifndef MONSOON_SERVER_PUSH_DECODER_H_
#define MONSOON_SERVER_PUSH_DECODER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/service.pb.h"
#include "server/update_rule.h"

namespace monsoon::server {

class PushDecoder {
 public:
  PushDecoder(int shard, uint64_t shard_size, int num_workers);

  // Takes the next chunk. INVALID_ARGUMENT says what is wrong with it.
  absl::Status Add(const PushChunk& chunk);

  // The complete push, once the stream has ended. INVALID_ARGUMENT if it is
  // short, or holds NaN or Inf (the message names the first bad index).
  absl::StatusOr<PushData> Finish();

 private:
  // Constant after construction.
  const int shard_;
  const uint64_t shard_size_;
  const int num_workers_;

  bool have_header_ = false;
  uint64_t received_ = 0;
  PushData data_;
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_PUSH_DECODER_H_
