// The two streaming calls a client makes to one shard, as gRPC callback
// reactors that report to a ShardCalls (worker/shard_calls.h), which owns
// them until its Wait(): a push (Push, or PushPull with the weights after
// it), built chunk by chunk from borrowed slices, and a pull. Internal to
// PsClient.
#ifndef MONSOON_WORKER_SHARD_STREAMS_H_
#define MONSOON_WORKER_SHARD_STREAMS_H_

#include <grpcpp/support/slice.h>

#include <atomic>
#include <cstdint>
#include <optional>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/wire.h"
#include "proto/service.pb.h"
#include "worker/shard_calls.h"

namespace monsoon::worker {

// A push stream whose values become final back to front (see
// StartPushCall).
class PushStream {
 public:
  virtual ~PushStream() = default;
  // Values [from, n) are final: streams those not sent yet; from 0 ends
  // the stream, and the shard takes the push. Any thread, one at a time.
  virtual void Extend(uint64_t from) = 0;
  // Gives the push up: the shard gets no end of it and drops what it got.
  virtual void Cancel() = 0;
};

// Streams `header`, then `data` and `scales` in the chunks of `plan`, to
// shard `index`; `response` gets its answer. With `with_pull` (PushPull),
// the weights that include the push go into `pull_out` and their version
// into *pull_version (`pull_have`: the version pull_out holds, for 1-bit
// differences). Reports to `calls`, which owns the call and the returned
// stream. With ready_from > 0 (float32 only) only values [ready_from, n) of
// `data` are final: they go now, back to front in chunks of at most
// `max_chunk_values`, and the rest as the stream's Extend says.
PushStream* StartPushCall(const ShardConnection& shard, ShardCalls* calls,
                          int index, PushHeader header, grpc::Slice data,
                          grpc::Slice scales, const common::ChunkPlan& plan,
                          uint64_t ready_from, uint64_t max_chunk_values,
                          absl::Duration timeout, PushResponse* response,
                          std::atomic<int64_t>* bytes_pushed, bool with_pull,
                          absl::Span<float> pull_out, int64_t* pull_version,
                          std::atomic<int64_t>* bytes_pulled,
                          std::optional<int64_t> pull_have, int bucket_size);

// Sends `request` to shard `index` and receives its slice of the weights
// into `out` (its version into *version). Reports to `calls`, which owns
// the call.
void StartPullCall(const ShardConnection& shard, ShardCalls* calls, int index,
                   const PullRequest& request, absl::Duration timeout,
                   absl::Span<float> out, std::atomic<int64_t>* bytes,
                   int64_t* version, int bucket_size);

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_SHARD_STREAMS_H_
