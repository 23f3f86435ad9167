// ParameterClient: what a worker's training loop asks of the shards, and
// nothing about how it reaches them: pull the weights, push a step (and get
// the next weights in the same call), ride out a lost shard, and where this
// rank's data resumes. PsClient (worker/ps_client.h) is the gRPC client;
// tests give the loops a fake (tests/fake_parameter_client.h). Methods are
// thread-safe unless a comment says otherwise.
#ifndef MONSOON_WORKER_PARAMETER_CLIENT_H_
#define MONSOON_WORKER_PARAMETER_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/model_layout.h"
#include "common/wire.h"
#include "proto/config.pb.h"
#include "proto/service.pb.h"

namespace monsoon::worker {

// A call under way; Wait() blocks until it has ended and returns its status.
class PendingCall {
 public:
  virtual ~PendingCall() = default;
  virtual absl::Status Wait() = 0;
};

// One shard's finished push payload: `values` values in `encoding`, as
// common/wire.h lays them out (common::PayloadBytesFor gives the sizes).
struct ShardPayload {
  PushEncoding encoding = ENCODING_FLOAT32;
  uint64_t values = 0;
  absl::Span<const uint8_t> data;
  absl::Span<const uint8_t> scales;  // 1-bit only
};

// Where the weights go that a push's shards answer with (PushPull: one
// round trip for a push and the pull after it).
struct PullTarget {
  absl::Span<float> params;        // all parameters
  std::vector<int64_t>* versions;  // gets each shard's version
  absl::Duration timeout;          // for the push and the wait together
  // `params` hold exactly the weights of the push's base versions (sync:
  // those of the last pull into them), so that under pull_compression a
  // shard may answer with the 1-bit difference from them.
  bool holds_base_versions = false;
};

// A push to every shard, handed over one shard at a time: each shard's RPC
// starts as soon as its payload is given, while the caller prepares the
// next one (copies it off a GPU, say). Every shard must be sent exactly
// once; Wait() returns the first error, and a shard never sent fails the
// push with FAILED_PRECONDITION (no RPC reaches that shard). Payload bytes
// are borrowed through the push's BufferLease, not copied. One thread at a
// time.
class ShardedPush : public PendingCall {
 public:
  // A payload whose encoding or sizes do not fit the shard and the config
  // makes the push INVALID_ARGUMENT, and that shard gets nothing.
  virtual void Send(int shard, const ShardPayload& payload) = 0;
  // Send for a float32 payload of which only values [from, n) (the shard's
  // own indices, 0 < from < n) are final yet: they start on their way now,
  // the rest as Extend says. The shard takes the push once Extend(shard, 0)
  // says the whole payload is final; a payload left unfinished when the
  // push is waited on is given up (the shard drops it; the push fails with
  // ABORTED). Counts as the shard's one Send.
  virtual void SendFrom(int shard, const ShardPayload& payload,
                        uint64_t from) = 0;
  // Values [from, n) of shard s's payload (given to SendFrom) are final.
  virtual void Extend(int shard, uint64_t from) = 0;
};

class ParameterClient {
 public:
  virtual ~ParameterClient() = default;

  virtual int num_shards() const = 0;
  // Shard s's part of the parameters.
  virtual const std::vector<common::ShardRange>& ranges() const = 0;
  // Where this rank's data resumes (PsClient::applied_samples).
  virtual int64_t applied_samples() const = 0;
  virtual const TrainingConfig& config() const = 0;
  // Whether shards may answer pulls with 1-bit differences
  // (pull_compression ONEBIT).
  bool pull_onebit() const {
    return config().pull_compression() == COMPRESSION_ONEBIT;
  }

  // Fills `params` (all parameters) once shard s's version is at least
  // min_versions[s]; versions[s] gets shard s's version. With
  // `params_hold_versions`, `params` hold exactly the weights of the
  // versions in *versions, so that a shard may send a 1-bit difference.
  // DEADLINE_EXCEEDED after `timeout`.
  virtual std::unique_ptr<PendingCall> PullAsync(
      const std::vector<int64_t>& min_versions, absl::Duration timeout,
      absl::Span<float> params, std::vector<int64_t>* versions,
      bool params_hold_versions = false) = 0;
  // The same with one min_version for every shard, and waited for.
  std::unique_ptr<PendingCall> PullAsync(int64_t min_version,
                                         absl::Duration timeout,
                                         absl::Span<float> params,
                                         std::vector<int64_t>* versions);
  absl::Status Pull(int64_t min_version, absl::Duration timeout,
                    absl::Span<float> params, std::vector<int64_t>* versions,
                    bool params_hold_versions = false);

  // A push computed from base_versions[s] on shard s of `samples` examples
  // starting at `sample_offset` in this rank's data, handed over shard by
  // shard (see ShardedPush), its bytes borrowed through `lease`; results
  // (if not null) gets each shard's answer; with `pull`, each shard then
  // sends the weights of the version that includes the push.
  virtual std::unique_ptr<ShardedPush> StartPush(
      const std::vector<int64_t>& base_versions, int64_t samples,
      int64_t sample_offset, common::BufferLease* lease,
      std::vector<PushResponse>* results, const PullTarget* pull = nullptr) = 0;

  // After a call lost a shard: waits up to `timeout` for every shard to
  // answer again, logging every `log_every`; applied_samples() is then
  // the shards' current one, and the next push repeats a step.
  virtual absl::Status Reconnect(absl::Duration timeout,
                                 absl::Duration log_every) = 0;
  // Each shard's version when the last Reconnect found it again (empty:
  // not known).
  virtual std::vector<int64_t> versions_at_reconnect() const { return {}; }

  // Tells every shard this rank is done (`finished`) or stepping out: no
  // sync step waits for it. UNIMPLEMENTED for a client without shards.
  virtual absl::Status Leave(absl::Duration timeout, bool finished = false) {
    return absl::UnimplementedError("this client has no shards to leave");
  }

  // Elastic runs (TrainingConfig.elastic): this rank's next data shard
  // from shard 0's queue (ParameterService.TakeData), `done` the one it
  // finished, `next_offset` the sample offset of its next batch;
  // `examples_per_epoch` is the size of its training set. UNIMPLEMENTED
  // for a client without a queue to ask.
  virtual absl::StatusOr<TakeDataResponse> TakeData(
      int64_t examples_per_epoch, const std::optional<DataShardRef>& done,
      int64_t next_offset, absl::Duration timeout) {
    return absl::UnimplementedError("this client has no data queue to ask");
  }

  // Serialized bytes sent in pushes and received in pulls.
  virtual int64_t bytes_pushed() const = 0;
  virtual int64_t bytes_pulled() const = 0;
};

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_PARAMETER_CLIENT_H_
