#include "worker/gradient_pusher.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model_layout.h"
#include "common/onebit.h"

namespace monsoon::worker {
namespace {

// How long a push waits for gRPC to let go of the previous push's buffers
// (it does once that push has been waited on; this only bounds a misuse).
constexpr absl::Duration kReleaseTimeout = absl::Seconds(60);

absl::Span<const uint8_t> Bytes(const void* data, size_t n) {
  return absl::MakeConstSpan(static_cast<const uint8_t*>(data), n);
}

// A push whose Wait() also waits for gRPC to let go of the payload bytes,
// so that the caller may change them as soon as it returns.
class LeasedPush : public PendingCall {
 public:
  LeasedPush(std::unique_ptr<PendingCall> push, common::BufferLease* lease)
      : push_(std::move(push)), lease_(lease) {}
  ~LeasedPush() override { Wait().IgnoreError(); }

  absl::Status Wait() override {
    if (push_ == nullptr) return status_;
    status_ = push_->Wait();
    push_.reset();
    if (!lease_->AwaitReleased(kReleaseTimeout) && status_.ok()) {
      status_ = absl::InternalError(absl::StrCat(
          "gRPC still held the pushed bytes ",
          absl::FormatDuration(kReleaseTimeout), " after the push ended"));
    }
    return status_;
  }

 private:
  std::unique_ptr<PendingCall> push_;
  common::BufferLease* const lease_;
  absl::Status status_;
};

}  // namespace

GradientPusher::GradientPusher(ComputeBackend* backend, ParameterClient* client,
                               const TrainingConfig& config,
                               WorkerCounters* counters)
    : backend_(backend),
      client_(client),
      config_(config),
      encoding_(common::PushEncodingFor(config)),
      bucket_size_(config.onebit_bucket_size()),
      chunk_values_(common::Float32ChunkValues(config)),
      counters_(counters) {}

absl::StatusOr<std::unique_ptr<GradientPusher>> GradientPusher::Create(
    ComputeBackend* backend, ParameterClient* client,
    const TrainingConfig& config, WorkerCounters* counters) {
  std::unique_ptr<GradientPusher> pusher(
      new GradientPusher(backend, client, config, counters));
  const uint64_t params = client->ranges().back().end;
  if (pusher->encoding_ == ENCODING_FLOAT32) {
    pusher->host_values_.resize(params);
    return pusher;
  }
  // 1-bit: each shard's encoding starts on a bucket boundary of its own.
  uint64_t bits = 0;
  uint64_t scales = 0;
  for (const common::ShardRange& range : client->ranges()) {
    pusher->bits_at_.push_back(bits);
    pusher->scales_at_.push_back(scales);
    const common::PayloadBytes bytes = common::PayloadBytesFor(
        ENCODING_ONEBIT, range.size(), pusher->bucket_size_);
    bits += bytes.data;
    scales += bytes.scales / sizeof(float);
  }
  pusher->host_bits_.resize(bits);
  pusher->host_scales_.resize(scales);
  absl::StatusOr<float*> residual = backend->AllocateFloats(params);
  if (!residual.ok()) return residual.status();
  pusher->residual_ = *residual;
  backend->Fill(params, 0.0f, pusher->residual_);
  absl::StatusOr<uint8_t*> device_bits = backend->AllocateBytes(bits);
  if (!device_bits.ok()) return device_bits.status();
  pusher->device_bits_ = *device_bits;
  absl::StatusOr<float*> device_scales = backend->AllocateFloats(scales);
  if (!device_scales.ok()) return device_scales.status();
  pusher->device_scales_ = *device_scales;
  return pusher;
}

GradientPusher::~GradientPusher() {
  // The host buffers must outlive gRPC's hold on them (pushes are waited on
  // before this, so this returns at once).
  lease_.AwaitReleased(kReleaseTimeout);
  for (void* p :
       {static_cast<void*>(residual_), static_cast<void*>(device_bits_),
        static_cast<void*>(device_scales_), static_cast<void*>(sum_)}) {
    if (p != nullptr) backend_->Free(p);
  }
}

absl::StatusOr<ShardPayload> GradientPusher::Prepare(int shard,
                                                     const float* values,
                                                     bool borrow) {
  const common::ShardRange range = client_->ranges()[shard];
  ShardPayload payload;
  payload.encoding = encoding_;
  payload.values = range.size();
  if (borrow) {
    payload.data = Bytes(values, range.size() * sizeof(float));
    return payload;
  }
  if (encoding_ == ENCODING_FLOAT32) {
    float* host = host_values_.data() + range.begin;
    absl::Status copied =
        backend_->CopyToHost(values, host, range.size() * sizeof(float));
    if (!copied.ok()) return copied;
    payload.data = Bytes(host, range.size() * sizeof(float));
    return payload;
  }
  const common::PayloadBytes bytes =
      common::PayloadBytesFor(ENCODING_ONEBIT, range.size(), bucket_size_);
  if (again_ && encoded_[shard]) {
    payload.data = Bytes(host_bits_.data() + bits_at_[shard], bytes.data);
    payload.scales =
        Bytes(host_scales_.data() + scales_at_[shard], bytes.scales);
    return payload;
  }
  uint8_t* bits = device_bits_ + bits_at_[shard];
  float* scales = device_scales_ + scales_at_[shard];
  absl::Status status =
      backend_->OneBitEncode(values, residual_ + range.begin, range.size(),
                             bucket_size_, bits, scales);
  if (status.ok()) {
    status = backend_->CopyToHost(bits, host_bits_.data() + bits_at_[shard],
                                  bytes.data);
  }
  if (status.ok()) {
    status = backend_->CopyToHost(
        scales, host_scales_.data() + scales_at_[shard], bytes.scales);
  }
  if (!status.ok()) return status;
  encoded_[shard] = true;
  payload.data = Bytes(host_bits_.data() + bits_at_[shard], bytes.data);
  payload.scales = Bytes(host_scales_.data() + scales_at_[shard], bytes.scales);
  return payload;
}

absl::StatusOr<std::unique_ptr<PendingCall>> GradientPusher::Push(
    const float* device_grads, const std::vector<int64_t>& base_versions,
    int64_t samples, int64_t sample_offset, const PullTarget* pull) {
  const float* values = device_grads;
  if (accumulated_steps_ > 0) {
    if (device_grads != nullptr) {
      backend_->Axpy(client_->ranges().back().end, 1.0f, device_grads, sum_);
    }
    values = sum_;
    accumulated_steps_ = 0;  // the next Accumulate starts a new sum
  } else if (device_grads == nullptr) {
    return absl::FailedPreconditionError(
        "a push of nothing: no gradient given and none accumulated");
  }
  absl::StatusOr<std::unique_ptr<StagedPush>> staged =
      Start(values, base_versions, samples, sample_offset, pull);
  if (!staged.ok()) return staged.status();
  return (*staged)->Finish();
}

absl::StatusOr<std::unique_ptr<PendingCall>> GradientPusher::PushAgain(
    const float* device_grads, const std::vector<int64_t>& base_versions,
    int64_t samples, int64_t sample_offset, const PullTarget* pull) {
  if (accumulated_steps_ > 0) {
    return absl::FailedPreconditionError(
        "a push sent again takes the last push's gradient, with nothing "
        "accumulated since");
  }
  again_ = true;
  absl::StatusOr<std::unique_ptr<StagedPush>> staged =
      Start(device_grads, base_versions, samples, sample_offset, pull);
  absl::StatusOr<std::unique_ptr<PendingCall>> call =
      staged.ok() ? (*staged)->Finish() : staged.status();
  again_ = false;
  return call;
}

absl::StatusOr<std::unique_ptr<StagedPush>> GradientPusher::Start(
    const float* device_grads, const std::vector<int64_t>& base_versions,
    int64_t samples, int64_t sample_offset, const PullTarget* pull,
    bool hold_ends) {
  if (device_grads == nullptr || accumulated_steps_ > 0) {
    return absl::FailedPreconditionError(
        "a staged push takes one step's gradient, with nothing accumulated");
  }
  // Float32 values already in host memory that stay put until Wait() are
  // sent from where they are.
  const bool borrow = pull != nullptr && encoding_ == ENCODING_FLOAT32 &&
                      backend_->HostMemory();
  if (hold_ends && !borrow) {
    return absl::FailedPreconditionError(
        "a staged push holds its ends only for float32 gradients in host "
        "memory, pushed with a pull");
  }
  // The previous push's RPCs may still borrow the host buffers.
  if (!lease_.AwaitReleased(kReleaseTimeout)) {
    return absl::FailedPreconditionError(
        absl::StrCat("gRPC still held the previous push's buffers after ",
                     absl::FormatDuration(kReleaseTimeout),
                     ": wait on a push before starting the next"));
  }
  if (!again_ ||
      encoded_.size() != static_cast<size_t>(client_->num_shards())) {
    encoded_.assign(client_->num_shards(), false);
  }
  return std::unique_ptr<StagedPush>(new StagedPush(
      this, device_grads, borrow, hold_ends,
      client_->StartPush(base_versions, samples, sample_offset, &lease_,
                         nullptr, pull)));
}

StagedPush::StagedPush(GradientPusher* pusher, const float* values,
                       bool borrow, bool hold_ends,
                       std::unique_ptr<ShardedPush> push)
    : pusher_(pusher),
      values_(values),
      borrow_(borrow),
      hold_ends_(hold_ends),
      push_(std::move(push)),
      state_(pusher->client_->num_shards(), ShardState::kUnsent),
      part_from_(pusher->client_->num_shards(), 0) {}

StagedPush::~StagedPush() {
  // Not finished (backward failed, or the caller gave the push up): the
  // shards sent are waited for, so that no RPC outlives the buffers it
  // borrows; a shard sent in part takes none of it.
  if (push_ == nullptr) return;
  LeasedPush unfinished(std::move(push_), &pusher_->lease_);
  unfinished.Wait().IgnoreError();
}

bool StagedPush::SendShard(int s) {
  const common::ShardRange range = pusher_->client_->ranges()[s];
  absl::StatusOr<ShardPayload> payload =
      pusher_->Prepare(s, values_ + range.begin, borrow_);
  if (!payload.ok()) {
    failed_ = absl::Status(payload.status().code(),
                           absl::StrCat("preparing the push to shard ", s,
                                        ": ", payload.status().message()));
    return false;
  }
  push_->Send(s, *payload);
  state_[s] = ShardState::kWhole;
  return true;
}

void StagedPush::Ready(uint64_t from) {
  // Backward has ended: holding the ends, Finish sends the rest at once,
  // in the messages a push after backward sends.
  if (hold_ends_ && from == 0) return;
  const std::vector<common::ShardRange>& ranges = pusher_->client_->ranges();
  // From the last shard down, as far as the final values reach.
  for (int s = static_cast<int>(ranges.size()) - 1; s >= 0 && failed_.ok();
       --s) {
    const common::ShardRange range = ranges[s];
    if (range.end <= from) return;  // nothing final here or below
    if (state_[s] == ShardState::kWhole) continue;
    // The shard's own index from which its values are final; holding the
    // ends, its first value waits for Finish.
    uint64_t part = from > range.begin ? from - range.begin : 0;
    if (hold_ends_) part = std::max<uint64_t>(part, 1);
    if (part == 0) {
      if (state_[s] == ShardState::kPart) {
        push_->Extend(s, 0);
        state_[s] = ShardState::kWhole;
      } else {
        if (!SendShard(s)) return;
        if (from > 0) ++sent_early_;  // from 0: backward has ended
      }
      continue;
    }
    // Part of shard s is final (or, holding the ends, all but its first
    // value): borrowed float32 values go as far as they are, and the shard
    // takes them once the rest follow. Within a range they go in whole
    // chunks (chunk_bytes), the messages a plain push sends them in, so
    // that a model smaller than a chunk a shard sends no more messages than
    // it would after backward.
    if (!borrow_ || part >= range.size()) return;
    const uint64_t sent_from =
        state_[s] == ShardState::kPart ? part_from_[s] : range.size();
    if (from > range.begin) {
      const uint64_t chunks = (sent_from - part) / pusher_->chunk_values_;
      if (chunks == 0) return;
      part = sent_from - chunks * pusher_->chunk_values_;
    }
    if (part < sent_from) {
      if (state_[s] == ShardState::kPart) {
        push_->Extend(s, part);
      } else {
        absl::StatusOr<ShardPayload> payload =
            pusher_->Prepare(s, values_ + range.begin, borrow_);
        if (!payload.ok()) {
          failed_ = payload.status();
          return;
        }
        push_->SendFrom(s, *payload, part);
        state_[s] = ShardState::kPart;
        ++sent_early_;
      }
      part_from_[s] = part;
    }
    if (from > range.begin) return;  // the shards below have nothing final
  }
}

absl::StatusOr<std::unique_ptr<PendingCall>> StagedPush::Finish() {
  // Shard by shard: each Send starts that shard's RPC before the next
  // shard's payload is prepared; a shard sent in part gets the rest.
  for (int s = 0; failed_.ok() && s < static_cast<int>(state_.size()); ++s) {
    if (state_[s] == ShardState::kPart) {
      push_->Extend(s, 0);
      state_[s] = ShardState::kWhole;
    } else if (state_[s] == ShardState::kUnsent) {
      SendShard(s);
    }
  }
  if (failed_.ok()) failed_ = pusher_->MeasureResidual();
  auto leased = std::make_unique<LeasedPush>(std::move(push_), &pusher_->lease_);
  if (!failed_.ok()) {
    leased->Wait().IgnoreError();  // the shards already sent
    return failed_;
  }
  return leased;
}

absl::Status GradientPusher::MeasureResidual() {
  if (residual_ == nullptr || counters_ == nullptr) return absl::OkStatus();
  const absl::Time now = absl::Now();
  if (now - last_measured_ < absl::Seconds(1)) return absl::OkStatus();
  last_measured_ = now;
  host_residual_.resize(client_->ranges().back().end);
  if (absl::Status copied =
          backend_->CopyToHost(residual_, host_residual_.data(),
                               host_residual_.size() * sizeof(float));
      !copied.ok()) {
    return absl::Status(copied.code(),
                        absl::StrCat("copying the 1-bit residual to measure "
                                     "it: ",
                                     copied.message()));
  }
  double sum = 0;
  for (float r : host_residual_) sum += static_cast<double>(r) * r;
  counters_->residual_norm.store(std::sqrt(sum));
  return absl::OkStatus();
}

absl::Status GradientPusher::Accumulate(const float* device_grads) {
  const uint64_t params = client_->ranges().back().end;
  if (sum_ == nullptr) {
    absl::StatusOr<float*> sum = backend_->AllocateFloats(params);
    if (!sum.ok()) return sum.status();
    sum_ = *sum;
  }
  if (accumulated_steps_ == 0) backend_->Fill(params, 0.0f, sum_);
  backend_->Axpy(params, 1.0f, device_grads, sum_);
  ++accumulated_steps_;
  return absl::OkStatus();
}

}  // namespace monsoon::worker
