// The reactors of a shard's three tensor streams on gRPC's callback API:
// Push (read a push, apply it), Pull (wait for a version without a thread,
// then stream the weights as slices of the shared snapshot, no copy) and
// PushPull (both in one round trip). They read and write raw messages that
// common/wire.h encodes, and leave every decision to the Shard
// (server/shard.h). Each reactor deletes itself when its call is done.
#ifndef MONSOON_SERVER_STREAM_REACTORS_H_
#define MONSOON_SERVER_STREAM_REACTORS_H_

#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/service.pb.h"
#include "server/push_decoder.h"
#include "server/rank_slots.h"
#include "server/shard.h"
#include "server/task_threads.h"

namespace monsoon::server {

// What every stream of one shard's service shares. Not owned; outlives
// every call.
struct StreamContext {
  Shard* shard = nullptr;
  size_t chunk_values = 0;  // float32 values per pull chunk
  PushEncoding encoding = ENCODING_FLOAT32;
  int bucket_size = 0;
  PushLimits limits;
  RankSlots* pull_slots = nullptr;
  // Sync: a push-pull's wait for its step is the barrier, timed into
  // ShardState::barrier_wait_seconds().
  bool barrier = false;
  // With replication: the threads that forward pushes to the range's
  // backup (which blocks) before they are acknowledged. Null: none.
  TaskThreads* tasks = nullptr;
};

grpc::ServerReadReactor<grpc::ByteBuffer>* NewPushReactor(
    grpc::CallbackServerContext* context, const StreamContext& streams,
    grpc::ByteBuffer* response);

// A pull admitted by Shard::AdmitPull, holding one of `rank`'s pull slots
// (taken by the caller) until it ends.
grpc::ServerWriteReactor<grpc::ByteBuffer>* NewPullReactor(
    const StreamContext& streams, int rank, int64_t min_version,
    std::optional<int64_t> have_version);

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewPushPullReactor(
    grpc::CallbackServerContext* context, const StreamContext& streams);

// The Replicate calls a service has open. A range's primary keeps its call
// to the backup open for the run, so a service that stops ends them
// (EndAll) rather than wait for the primaries to. Thread-safe.
class ReplicateCalls {
 public:
  class Call {
   public:
    virtual ~Call() = default;
    // Ends the call with `status` (now, or once its write in flight is
    // done); the updates it still applies are not acknowledged.
    virtual void End(const grpc::Status& status) = 0;
    // Keep the call from being deleted until Release (while End runs
    // outside the registry's lock).
    virtual void Hold() = 0;
    virtual void Release() = 0;
  };
  void Add(Call* call);
  void Remove(Call* call);
  // Ends every open call, and each one opened from now on.
  void EndAll(const grpc::Status& status);

 private:
  absl::Mutex mu_;
  std::set<Call*> open_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> ended_ ABSL_GUARDED_BY(mu_);
};

// Replicate: the updates the range's primary forwards, one after another
// on one call, each applied in the primary's order (Shard::ApplyForwarded)
// and answered with a ReplicaAck; the call ends when the primary ends it
// (every update answered) or `calls` ends it.
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
NewReplicateReactor(const StreamContext& streams, ReplicateCalls* calls);

// Calls refused before anything is read: answered `status` at once.
grpc::ServerReadReactor<grpc::ByteBuffer>* FailedPush(
    const grpc::Status& status);
grpc::ServerWriteReactor<grpc::ByteBuffer>* FailedPull(
    const grpc::Status& status);
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* FailedPushPull(
    const grpc::Status& status);
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* FailedReplicate(
    const grpc::Status& status);

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_STREAM_REACTORS_H_
