#include "server/policies/compressed_pulls.h"

#include <algorithm>
#include <utility>

#include "common/onebit.h"

namespace monsoon::server {

StepPullEncoder::StepPullEncoder(int bucket_size, size_t size)
    : bucket_size_(bucket_size), residual_(size, 0.0f) {}

void StepPullEncoder::EncodeStep(absl::Span<const float> previous, float* w,
                                 int64_t version) {
  const size_t n = previous.size();
  update_.resize(n);
  for (size_t i = 0; i < n; ++i) update_[i] = w[i] - previous[i];
  auto delta = std::make_shared<EncodedDelta>();
  delta->base_version = version - 1;
  delta->version = version;
  common::OneBitEncoded encoded;
  common::OneBitEncode(update_, absl::MakeSpan(residual_), bucket_size_,
                       &encoded);
  // Decoding what was just encoded cannot fail: the sizes match and the
  // scales are means of finite values.
  common::OneBitDecode(encoded.bits, encoded.scales, bucket_size_,
                       absl::MakeSpan(update_))
      .IgnoreError();
  delta->bits = std::move(encoded.bits);
  delta->scales = std::move(encoded.scales);
  for (size_t i = 0; i < n; ++i) w[i] = previous[i] + update_[i];
  delta_ = std::move(delta);
}

std::shared_ptr<const EncodedDelta> StepPullEncoder::DeltaFor(
    std::optional<int64_t> have_version, int64_t version) const {
  if (delta_ != nullptr && have_version.has_value() &&
      *have_version == delta_->base_version && delta_->version == version) {
    return delta_;
  }
  return nullptr;
}

void StepPullEncoder::Reset() {
  std::fill(residual_.begin(), residual_.end(), 0.0f);
  delta_.reset();
}

void StepPullEncoder::RestoreResidual(absl::Span<const float> residual) {
  residual_.assign(residual.begin(), residual.end());
  delta_.reset();
}

void WorkerPullCopies::Drop(int rank) {
  absl::MutexLock lock(&mu_);
  views_.erase(rank);
}

int WorkerPullCopies::workers() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(views_.size());
}

std::shared_ptr<const EncodedDelta> WorkerPullCopies::DeltaFor(
    int rank, std::optional<int64_t> have_version, const WeightsPtr& weights) {
  const absl::Span<const float> now = weights->values();
  absl::MutexLock lock(&mu_);
  WorkerView& view = views_[rank];
  if (!have_version.has_value() || view.values.empty() ||
      *have_version != view.version) {
    // A full pull: the worker's copy is the weights sent.
    view.values.assign(now.begin(), now.end());
    view.residual.assign(now.size(), 0.0f);
    view.version = weights->version();
    return nullptr;
  }
  const size_t n = now.size();
  scratch_.resize(n);
  for (size_t i = 0; i < n; ++i) scratch_[i] = now[i] - view.values[i];
  common::OneBitEncoded encoded;
  common::OneBitEncode(scratch_, absl::MakeSpan(view.residual), bucket_size_,
                       &encoded);
  // Decoding what was just encoded cannot fail (see EncodeStep).
  common::OneBitDecode(encoded.bits, encoded.scales, bucket_size_,
                       absl::MakeSpan(scratch_))
      .IgnoreError();
  for (size_t i = 0; i < n; ++i) {
    view.values[i] = view.values[i] + scratch_[i];
  }
  auto delta = std::make_shared<EncodedDelta>();
  delta->base_version = view.version;
  delta->version = weights->version();
  delta->bits = std::move(encoded.bits);
  delta->scales = std::move(encoded.scales);
  view.version = delta->version;
  return delta;
}

}  // namespace monsoon::server
