#include "worker/gradient_pusher.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model_layout.h"

namespace monsoon::worker {

absl::StatusOr<std::unique_ptr<GradientPusher>> GradientPusher::Create(
    ComputeBackend* backend, PsClient* client, const TrainingConfig& config) {
  std::unique_ptr<GradientPusher> pusher(
      new GradientPusher(backend, client, config));
  uint64_t largest = 0;
  for (const common::ShardRange& range : client->ranges()) {
    largest = std::max<uint64_t>(largest, range.size());
  }
  if (config.compression() != COMPRESSION_ONEBIT ||
      !backend->HasOneBitCodec()) {
    pusher->host_values_.resize(largest);
    return pusher;
  }
  const uint64_t params = client->ranges().back().end;
  const int bucket = config.onebit_bucket_size();
  absl::StatusOr<float*> residual = backend->AllocateFloats(params);
  if (!residual.ok()) return residual.status();
  pusher->residual_ = *residual;
  backend->Fill(params, 0.0f, pusher->residual_);
  absl::StatusOr<uint8_t*> bits =
      backend->AllocateBytes(common::OneBitBitsBytes(largest, bucket));
  if (!bits.ok()) return bits.status();
  pusher->device_bits_ = *bits;
  absl::StatusOr<float*> scales =
      backend->AllocateFloats(2 * common::OneBitBuckets(largest, bucket));
  if (!scales.ok()) return scales.status();
  pusher->device_scales_ = *scales;
  return pusher;
}

GradientPusher::~GradientPusher() {
  for (void* p :
       {static_cast<void*>(residual_), static_cast<void*>(device_bits_),
        static_cast<void*>(device_scales_), static_cast<void*>(sum_)}) {
    if (p != nullptr) backend_->Free(p);
  }
}

absl::StatusOr<std::unique_ptr<PendingCall>> GradientPusher::Push(
    const float* device_values, const std::vector<int64_t>& base_versions,
    int64_t samples) {
  std::unique_ptr<ShardedPush> push =
      client_->StartPush(base_versions, samples, nullptr);
  const int bucket = config_.onebit_bucket_size();
  // Shard by shard: each Send starts that shard's RPC before the next
  // shard's slice is copied.
  for (int s = 0; s < client_->num_shards(); ++s) {
    const common::ShardRange range = client_->ranges()[s];
    absl::Status status;
    if (quantizes_on_device()) {
      encoded_.bits.resize(common::OneBitBitsBytes(range.size(), bucket));
      encoded_.scales.resize(common::OneBitBuckets(range.size(), bucket) * 2 *
                             sizeof(float));
      status = backend_->OneBitEncode(device_values + range.begin,
                                      residual_ + range.begin, range.size(),
                                      bucket, device_bits_, device_scales_);
      if (status.ok()) {
        status = backend_->CopyToHost(device_bits_, encoded_.bits.data(),
                                      encoded_.bits.size());
      }
      if (status.ok()) {
        status = backend_->CopyToHost(device_scales_, encoded_.scales.data(),
                                      encoded_.scales.size());
      }
      if (status.ok()) push->SendOneBit(s, encoded_);
    } else {
      status =
          backend_->CopyToHost(device_values + range.begin, host_values_.data(),
                               range.size() * sizeof(float));
      if (status.ok()) {
        push->Send(s, absl::MakeConstSpan(host_values_.data(), range.size()));
      }
    }
    if (!status.ok()) {
      push->Wait().IgnoreError();  // the shards already sent
      return absl::Status(status.code(),
                          absl::StrCat("preparing the push to shard ", s, ": ",
                                       status.message()));
    }
  }
  return push;
}

absl::Status GradientPusher::Accumulate(const float* device_grads) {
  const uint64_t params = client_->ranges().back().end;
  if (sum_ == nullptr) {
    absl::StatusOr<float*> sum = backend_->AllocateFloats(params);
    if (!sum.ok()) return sum.status();
    sum_ = *sum;
    backend_->Fill(params, 0.0f, sum_);
  }
  backend_->Axpy(params, 1.0f, device_grads, sum_);
  ++accumulated_steps_;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PendingCall>> GradientPusher::PushAccumulated(
    const std::vector<int64_t>& base_versions, int64_t samples) {
  if (sum_ == nullptr) {
    return absl::FailedPreconditionError("nothing accumulated to push");
  }
  absl::StatusOr<std::unique_ptr<PendingCall>> push =
      Push(sum_, base_versions, samples);
  // Queued behind the copies above, which have all completed.
  backend_->Fill(client_->ranges().back().end, 0.0f, sum_);
  accumulated_steps_ = 0;
  return push;
}

}  // namespace monsoon::worker
