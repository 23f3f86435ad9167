// GradientPusher: sends a gradient that lives in a ComputeBackend's memory
// to every shard, one shard at a time, so that shard s's RPC is already
// under way while shard s+1's slice is still being copied off the device.
//
// Under 1-bit compression, on a backend with a codec
// (ComputeBackend::HasOneBitCodec), each shard's slice is quantized on the
// device with a residual kept there, and only its bits and scales cross to
// the host: the gradient leaves a GPU already compressed, 1/32 of its size.
// Otherwise float32 values cross and PsClient quantizes them on the host.
// Both paths put the same bytes on the wire.
//
// It can also sum gradients over several steps on the device (Downpour's
// n_push) before pushing them. Not thread-safe: one worker thread owns it,
// along with the backend and the client it was given, which must outlive it.
#ifndef MONSOON_WORKER_GRADIENT_PUSHER_H_
#define MONSOON_WORKER_GRADIENT_PUSHER_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/onebit.h"
#include "proto/config.pb.h"
#include "worker/compute_backend.h"
#include "worker/ps_client.h"

namespace monsoon::worker {

class GradientPusher {
 public:
  // `config` is the resolved one the client connected with.
  static absl::StatusOr<std::unique_ptr<GradientPusher>> Create(
      ComputeBackend* backend, PsClient* client, const TrainingConfig& config);
  ~GradientPusher();
  GradientPusher(const GradientPusher&) = delete;
  GradientPusher& operator=(const GradientPusher&) = delete;

  // True where 1-bit pushes are quantized on the backend's device.
  bool quantizes_on_device() const { return residual_ != nullptr; }

  // Starts pushing the model's gradient at `device_values` (all parameters,
  // in the backend's memory), computed from base_versions[s] on shard s.
  // When it returns, every slice has left `device_values`, which may then be
  // overwritten; the RPCs may still be running: Wait() on the result (before
  // the client goes away) gives their outcome. An error here means no more
  // shards were sent; those already sent are waited for first.
  absl::StatusOr<std::unique_ptr<PendingCall>> Push(
      const float* device_values, const std::vector<int64_t>& base_versions,
      int64_t samples);

  // sum += device_grads, on the device.
  absl::Status Accumulate(const float* device_grads);
  // Push(sum), then sum = 0. Steps accumulated since the last push.
  absl::StatusOr<std::unique_ptr<PendingCall>> PushAccumulated(
      const std::vector<int64_t>& base_versions, int64_t samples);
  int accumulated_steps() const { return accumulated_steps_; }

 private:
  GradientPusher(ComputeBackend* backend, PsClient* client,
                 const TrainingConfig& config)
      : backend_(backend), client_(client), config_(config) {}

  ComputeBackend* const backend_;
  PsClient* const client_;
  const TrainingConfig config_;
  // Float32 path: one shard's values at a time, on the host.
  std::vector<float> host_values_;
  // Device codec path: the residual of every parameter, and one shard's
  // encoding at a time (device buffers sized for the largest shard).
  float* residual_ = nullptr;
  uint8_t* device_bits_ = nullptr;
  float* device_scales_ = nullptr;
  common::OneBitEncoded encoded_;
  // Device sum for Accumulate, allocated on first use.
  float* sum_ = nullptr;
  int accumulated_steps_ = 0;
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
