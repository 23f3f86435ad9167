// GradientPusher: the one way a training loop pushes. It prepares a push
// from a gradient (or update) in a ComputeBackend's memory and hands it to
// client (ParameterClient) shard by shard, so that shard s's RPC is already under way while
// shard s+1's payload is still being prepared: it copies the slice off the
// device (float32), or quantizes it to 1 bit on the device with the one
// residual it keeps there (error feedback, Seide et al. 2014) and copies
// only the bits and scales, 1/32 of the size. It can also sum gradients
// over several steps on the device first (Downpour's n_push), and ask the
// shards to answer with the weights that include the push (PushPull: one
// round trip).
//
// The payloads live in host buffers it owns, which the RPCs borrow without
// copying; a push must have been waited on before the next one starts (Push
// waits for gRPC to let go of the buffers otherwise) and before the pusher
// is destroyed. Not thread-safe: one worker thread owns it, along with the
// backend and the client it was given, which must outlive it.
#ifndef MONSOON_WORKER_GRADIENT_PUSHER_H_
#define MONSOON_WORKER_GRADIENT_PUSHER_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/wire.h"
#include "proto/config.pb.h"
#include "worker/compute_backend.h"
#include "worker/parameter_client.h"
#include "worker/worker_counters.h"

namespace monsoon::worker {

class GradientPusher;

// A push handed to the shards while the backward pass still runs
// (GradientPusher::Start): shard s's RPC starts as soon as the gradients of
// its whole range are final (Ready), so that it crosses the wire, and in
// sync the shard's barrier may close and send the range's next weights,
// while backward goes on below it (as DDP and Horovod overlap their
// buckets with backward; here a shard's range is the bucket). Float32
// gradients in host memory that the push borrows (a push-pull) go further:
// the final end of a shard's range starts on its way, back to front, while
// backward still computes the rest of the range, so that a model on one
// shard overlaps too (the shard takes the push once all of it is final).
// The values sent are the same as Push's, so the outcome is bit for bit
// the same. Not thread-safe: the worker thread that runs backward calls
// it.
class StagedPush {
 public:
  ~StagedPush();
  StagedPush(const StagedPush&) = delete;
  StagedPush& operator=(const StagedPush&) = delete;

  // The gradients of parameters [from, end) are final and stay so until
  // the push has been waited on: sends each shard not sent yet whose range
  // lies there, the last shard first (and the final end of a range in
  // part, in whole chunks, where the values are borrowed). Holding the ends
  // (GradientPusher::Start), every shard's stream stays open for Finish,
  // which then sends each shard's first value (and Ready(0), the end of
  // backward, leaves what is unsent to Finish): until then the push may
  // still be given up by destroying it, and no shard takes any of it.
  void Ready(uint64_t from);
  // Sends the shards not sent yet, in order, and hands the push over as
  // GradientPusher::Push does (with its errors).
  absl::StatusOr<std::unique_ptr<PendingCall>> Finish();
  // Shards whose RPC Ready started while backward still ran (from > 0),
  // whole or in part.
  int sent_early() const { return sent_early_; }

 private:
  friend class GradientPusher;
  StagedPush(GradientPusher* pusher, const float* values, bool borrow,
             bool hold_ends, std::unique_ptr<ShardedPush> push);
  // Prepares and sends shard s; false (and failed_ set) if it could not.
  bool SendShard(int s);

  GradientPusher* const pusher_;
  const float* const values_;  // all parameters' gradients
  const bool borrow_;
  const bool hold_ends_;
  std::unique_ptr<ShardedPush> push_;
  // Each shard's: not sent yet, sent in part (SendFrom) and still open, or
  // sent whole.
  enum class ShardState { kUnsent, kPart, kWhole };
  std::vector<ShardState> state_;
  std::vector<uint64_t> part_from_;  // kPart: values from here are sent
  int sent_early_ = 0;
  absl::Status failed_;
};

class GradientPusher {
 public:
  // `config` is the resolved one the client connected with. With 1-bit
  // pushes and `counters`, the residual's norm goes into
  // counters->residual_norm at most once a second (a copy of the residual
  // off the device and one pass over it).
  static absl::StatusOr<std::unique_ptr<GradientPusher>> Create(
      ComputeBackend* backend, ParameterClient* client, const TrainingConfig& config,
      WorkerCounters* counters = nullptr);
  ~GradientPusher();
  GradientPusher(const GradientPusher&) = delete;
  GradientPusher& operator=(const GradientPusher&) = delete;

  // Starts pushing `device_grads` (all parameters, in the backend's memory;
  // null for none) plus whatever Accumulate has summed since the last push,
  // computed from base_versions[s] on shard s and summarizing `samples`
  // examples. When it returns, device_grads may be overwritten; the RPCs may
  // still run: Wait() on the result gives their outcome. With `pull`, every
  // shard then answers with the weights of the version that includes the
  // push (see ParameterClient::StartPush), and device_grads must stay unchanged
  // until the push has been waited on (a loop that waits for its weights
  // before it computes again does): a backend in host memory then sends
  // them without a copy. An error here means no more shards were sent;
  // those already sent are waited for first.
  // `sample_offset` is where the pushed examples begin in the rank's data
  // (ParameterClient::StartPush).
  absl::StatusOr<std::unique_ptr<PendingCall>> Push(
      const float* device_grads, const std::vector<int64_t>& base_versions,
      int64_t samples, int64_t sample_offset, const PullTarget* pull = nullptr);

  // Push's arguments, for a gradient the backward pass is still computing
  // into device_grads: StagedPush::Ready sends each shard's part once it is
  // final, Finish the rest. Only with nothing accumulated (Accumulate).
  // device_grads must stay unchanged, once a part is final, until the push
  // has been waited on; with `pull`, so must the parameters of a part
  // sent, which its answer overwrites.
  // With `hold_ends` (float32 in host memory with a pull only), no shard
  // takes the push before Finish, so that the caller may still give it up
  // (a script whose step turned out to differ from what it said when
  // backward began).
  absl::StatusOr<std::unique_ptr<StagedPush>> Start(
      const float* device_grads, const std::vector<int64_t>& base_versions,
      int64_t samples, int64_t sample_offset, const PullTarget* pull = nullptr,
      bool hold_ends = false);

  // The last push again, as it was (a step sent again after a lost shard):
  // 1-bit payloads are sent as they were encoded, not encoded a second
  // time, so that the residual counts the step once and every shard gets
  // the same bits it would have. `device_grads` must still hold the last
  // push's gradient (a shard whose payload was never prepared is prepared
  // from it). Only with nothing accumulated.
  absl::StatusOr<std::unique_ptr<PendingCall>> PushAgain(
      const float* device_grads, const std::vector<int64_t>& base_versions,
      int64_t samples, int64_t sample_offset, const PullTarget* pull = nullptr);

  // sum += device_grads, on the device, for the next Push.
  absl::Status Accumulate(const float* device_grads);
  // Steps accumulated since the last push.
  int accumulated_steps() const { return accumulated_steps_; }

 private:
  friend class StagedPush;
  GradientPusher(ComputeBackend* backend, ParameterClient* client,
                 const TrainingConfig& config, WorkerCounters* counters);
  // Measures the residual's norm into counters_ if a second has passed.
  absl::Status MeasureResidual();
  // Shard s's payload from `values` (device memory, the shard's slice): in
  // the host buffers, or where `borrow`, float32 values in host memory
  // sent from where they are. In PushAgain, a 1-bit payload the last push
  // encoded is sent as it is.
  absl::StatusOr<ShardPayload> Prepare(int shard, const float* values,
                                       bool borrow);

  ComputeBackend* const backend_;
  ParameterClient* const client_;
  const TrainingConfig config_;
  const PushEncoding encoding_;
  const int bucket_size_;
  const uint64_t chunk_values_;  // float32 values in a chunk_bytes chunk

  // What the RPCs borrow: the host payloads of every shard.
  common::BufferLease lease_;
  std::vector<float> host_values_;  // float32
  std::vector<uint8_t> host_bits_;  // 1-bit, every shard's, in shard order
  std::vector<float> host_scales_;
  std::vector<uint64_t> bits_at_;    // shard s's bits begin here, scales
  std::vector<uint64_t> scales_at_;  // (in floats) here
  // 1-bit: encoded_[s], the host buffers hold shard s's payload of the last
  // push (Start clears them, Prepare sets them); again_, within PushAgain.
  std::vector<bool> encoded_;
  bool again_ = false;
  // 1-bit on the device: the residual of every parameter, and the encoding.
  float* residual_ = nullptr;
  uint8_t* device_bits_ = nullptr;
  float* device_scales_ = nullptr;
  // Device sum for Accumulate, allocated on first use.
  float* sum_ = nullptr;
  int accumulated_steps_ = 0;
  WorkerCounters* const counters_;
  std::vector<float> host_residual_;  // MeasureResidual's copy
  absl::Time last_measured_ = absl::InfinitePast();
};

// The one push a loop keeps in flight while it computes its next steps.
// Finish() waits for it; the destructor does too, so that no RPC outlives
// the loop. Not thread-safe.
class PushInFlight {
 public:
  PushInFlight() = default;
  PushInFlight(const PushInFlight&) = delete;
  PushInFlight& operator=(const PushInFlight&) = delete;
  ~PushInFlight() { Finish().IgnoreError(); }

  // Waits for the push in flight, if any, and returns its outcome.
  absl::Status Finish() {
    if (call_ == nullptr) return absl::OkStatus();
    absl::Status status = call_->Wait();
    call_.reset();
    return status;
  }
  // Keeps `call` in flight; call Finish() before starting it.
  void Hold(std::unique_ptr<PendingCall> call) { call_ = std::move(call); }

 private:
  std::unique_ptr<PendingCall> call_;
};

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_GRADIENT_PUSHER_H_
