// PsClient: a worker's (or evaluator's) connection to every shard. Push and
// Pull reach all shards in parallel, one streaming RPC per shard, through
// gRPC's callback API: the *Async forms return a handle to Wait on, and the
// plain forms wait at once. Tensors are the whole flattened parameter vector;
// the client cuts and joins the shards' slices.
//
// Thread-safe for calls that do not share output buffers, except that 1-bit
// pushes (which update the residual) must not overlap; counters are atomic. A
// PendingCall must be waited on before its buffers go away.
#ifndef MONSOON_WORKER_PS_CLIENT_H_
#define MONSOON_WORKER_PS_CLIENT_H_

#include <grpcpp/channel.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/model_layout.h"
#include "common/onebit.h"
#include "proto/config.pb.h"
#include "proto/service.grpc.pb.h"

namespace monsoon::worker {

struct PsClientOptions {
  std::vector<std::string> server_addresses;  // in shard order
  TrainingConfig config;                      // resolved
  int worker_rank = 0;                        // -1 for an evaluator
  // How long Connect keeps trying to reach a shard that is not up yet.
  absl::Duration connect_timeout = absl::Seconds(60);
};

// One request to every shard; Wait() returns the first error, naming the
// shard and its address.
class PendingCall {
 public:
  virtual ~PendingCall() = default;
  virtual absl::Status Wait() = 0;
};

// A push to every shard, handed over one shard at a time: each shard's RPC
// starts as soon as its slice is given, while the caller prepares the next
// one (copies it off a GPU, say). Every shard must be sent exactly once;
// Wait() returns the first error, and a shard never sent fails the push
// with FAILED_PRECONDITION (no RPC reaches that shard). The slices are
// copied into the RPC's messages before Send returns. One thread at a time.
class ShardedPush : public PendingCall {
 public:
  // Shard s's slice (its ranges()[s].size() values): float32, or quantized
  // here with the client's residual under COMPRESSION_ONEBIT.
  virtual void Send(int shard, absl::Span<const float> slice) = 0;
  // Shard s's slice already quantized by the caller, with its own residual,
  // in common/onebit.h's layout and the config's bucket size. A config
  // without 1-bit compression or sizes that do not fit the shard make the
  // push INVALID_ARGUMENT, and that shard gets nothing.
  virtual void SendOneBit(int shard, const common::OneBitEncoded& encoded) = 0;
};

class PsClient {
 public:
  // Registers with every shard, retrying with backoff while they start.
  // UNAVAILABLE names the address that could not be reached in time;
  // FAILED_PRECONDITION carries a shard's config-mismatch message.
  static absl::StatusOr<std::unique_ptr<PsClient>> Connect(
      const PsClientOptions& options);

  int num_shards() const { return static_cast<int>(stubs_.size()); }
  const std::vector<common::ShardRange>& ranges() const { return ranges_; }
  // Versions the shards reported at registration.
  const std::vector<int64_t>& initial_versions() const {
    return initial_versions_;
  }
  // Training examples from this client's rank that every shard had applied
  // at registration (the least over the shards): where a restarted worker
  // resumes its data.
  int64_t applied_samples() const { return applied_samples_; }

  // Fills `params` (all parameters) once every shard's version is at least
  // min_version; versions[s] gets shard s's snapshot version. The call fails
  // with DEADLINE_EXCEEDED after `timeout`.
  std::unique_ptr<PendingCall> PullAsync(int64_t min_version,
                                         absl::Duration timeout,
                                         absl::Span<float> params,
                                         std::vector<int64_t>* versions);
  absl::Status Pull(int64_t min_version, absl::Duration timeout,
                    absl::Span<float> params, std::vector<int64_t>* versions);

  // Sends shard s the slice of `grads` it owns, computed from
  // base_versions[s]. results (if not null) gets each shard's response.
  // With the config's COMPRESSION_ONEBIT the values are quantized to 1 bit
  // with this client's residual (error feedback), which the call updates:
  // one push at a time then.
  std::unique_ptr<PendingCall> PushAsync(
      absl::Span<const float> grads, const std::vector<int64_t>& base_versions,
      int64_t samples, std::vector<PushResponse>* results);
  absl::Status Push(absl::Span<const float> grads,
                    const std::vector<int64_t>& base_versions, int64_t samples,
                    std::vector<PushResponse>* results = nullptr);

  // The same push handed over shard by shard (see ShardedPush).
  std::unique_ptr<ShardedPush> StartPush(
      const std::vector<int64_t>& base_versions, int64_t samples,
      std::vector<PushResponse>* results);

  absl::StatusOr<std::vector<StatsResponse>> Stats(absl::Duration timeout);

  // Serialized bytes this client has sent in pushes and received in pulls.
  int64_t bytes_pushed() const { return bytes_pushed_.load(); }
  int64_t bytes_pulled() const { return bytes_pulled_.load(); }

 private:
  PsClient() = default;
  // Cuts (and, for 1-bit, quantizes) one shard's slice into chunks; the
  // header goes into the first.
  std::vector<PushChunk> EncodeShard(int shard, absl::Span<const float> values,
                                     PushHeader header);
  // Cuts an encoded slice of n values into chunks of whole buckets.
  std::vector<PushChunk> ChunkOneBit(uint64_t n,
                                     const common::OneBitEncoded& encoded,
                                     PushHeader header);
  // Puts the header into the first of `chunks` (never empty) and counts
  // their bytes as pushed.
  std::vector<PushChunk> Seal(std::vector<PushChunk> chunks, PushHeader header);
  PushHeader Header(int shard, int64_t base_version, int64_t samples) const;
  friend class ShardedPushImpl;

  // Constant after Connect.
  TrainingConfig config_;
  int worker_rank_ = 0;
  size_t chunk_values_ = 0;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<ParameterService::Stub>> stubs_;
  std::vector<common::ShardRange> ranges_;
  std::vector<int64_t> initial_versions_;
  int64_t applied_samples_ = 0;

  // 1-bit error feedback for pushes quantized here: what earlier pushes'
  // quantization lost, all parameters (empty until the first).
  std::vector<float> residual_;

  std::atomic<int64_t> bytes_pushed_{0};
  std::atomic<int64_t> bytes_pulled_{0};
};

// A channel with Monsoon's message-size limits.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_PS_CLIENT_H_
