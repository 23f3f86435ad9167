// PullReceiver: the worker's pull decoder, beside the shard's push decoder
// (server/push_decoder.h). It takes one shard's weights out of PullChunk
// messages (common/wire.h) straight into the caller's span; or, where the
// pull holds a version, 1-bit differences from it (pull_compression),
// decoded and added in place. Malformed input is DATA_LOSS naming what was
// wrong. One stream's reactor at a time; not thread-safe.
#ifndef MONSOON_WORKER_PULL_DECODER_H_
#define MONSOON_WORKER_PULL_DECODER_H_

#include <grpcpp/support/byte_buffer.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/wire.h"
#include "proto/service.pb.h"

namespace monsoon::worker {

// `out` gets the values, `version` the version they are of, `bytes` the
// message bytes received; `have`: the version `out` holds, which 1-bit
// differences are added to.
class PullReceiver {
 public:
  PullReceiver(absl::Span<float> out, int64_t* version,
               std::atomic<int64_t>* bytes,
               std::optional<int64_t> have = std::nullopt, int bucket_size = 1)
      : out_(out),
        version_(version),
        bytes_(bytes),
        have_(have),
        bucket_size_(bucket_size) {}

  // Copies one message's values into place; `push` (if not null) gets the
  // PushPull answer the first chunk carries.
  absl::Status Take(const grpc::ByteBuffer& message, PushResponse* push);

  // The status of a stream that ended: DATA_LOSS if it was short.
  absl::Status Complete() const;

 private:
  // The first chunk's version (and `push`, the PushPull answer it
  // carries); every later chunk must be of the same version.
  absl::Status TakeVersion(PushResponse* push);
  // A 1-bit difference's chunk: whole buckets from received_ on.
  absl::Status TakeDelta(PushResponse* push);

  const absl::Span<float> out_;
  int64_t* const version_;
  std::atomic<int64_t>* const bytes_;
  const std::optional<int64_t> have_;
  const int bucket_size_;
  common::MessageReader reader_;
  common::MessageReader::PullChunkView chunk_;
  uint64_t received_ = 0;
  bool delta_ = false;  // the chunks so far were 1-bit differences
  std::vector<float> decoded_;
};

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_PULL_DECODER_H_
