#include "server/push_decoder.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/float_bytes.h"

namespace monsoon::server {

PushDecoder::PushDecoder(int shard, uint64_t shard_size, int num_workers)
    : shard_(shard), shard_size_(shard_size), num_workers_(num_workers) {}

absl::Status PushDecoder::Add(const PushChunk& chunk) {
  data_.wire_bytes += static_cast<int64_t>(chunk.ByteSizeLong());
  if (!have_header_) {
    if (!chunk.has_header()) {
      return absl::InvalidArgumentError(
          "the first chunk of a push must carry its header");
    }
    const PushHeader& h = chunk.header();
    if (h.shard() != shard_) {
      return absl::InvalidArgumentError(
          absl::StrCat("push for shard ", h.shard(), " reached shard ", shard_,
                       ": check the order of --servers"));
    }
    if (h.worker_rank() < 0 || h.worker_rank() >= num_workers_) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker rank ", h.worker_rank(), " is outside [0, ",
                       num_workers_, ")"));
    }
    if (h.length() != shard_size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("push of ", h.length(), " values, but shard ", shard_,
                       " holds ", shard_size_));
    }
    if (h.base_version() < 0 || h.samples() < 0) {
      return absl::InvalidArgumentError(
          "push header has a negative base_version or samples");
    }
    have_header_ = true;
    data_.worker_rank = h.worker_rank();
    data_.base_version = h.base_version();
    data_.samples = h.samples();
    data_.values.resize(shard_size_);
  } else if (chunk.has_header()) {
    return absl::InvalidArgumentError("only the first chunk may carry a header");
  }
  if (chunk.offset() != received_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk at offset ", chunk.offset(), " but ", received_,
                     " values have arrived: chunks must be in order"));
  }
  if (chunk.data().size() % sizeof(float) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of ", chunk.data().size(),
                     " bytes is not a whole number of float32 values"));
  }
  const uint64_t n = chunk.data().size() / sizeof(float);
  if (n > shard_size_ - received_) {
    return absl::InvalidArgumentError(
        absl::StrCat("push carries more than the ", shard_size_,
                     " values of shard ", shard_));
  }
  common::CopyBytesToFloats(chunk.data(), data_.values.data() + received_);
  received_ += n;
  return absl::OkStatus();
}

absl::StatusOr<PushData> PushDecoder::Finish() {
  if (!have_header_) {
    return absl::InvalidArgumentError("empty push: no header");
  }
  if (received_ != shard_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("push ended after ", received_, " of ", shard_size_,
                     " values"));
  }
  for (uint64_t i = 0; i < shard_size_; ++i) {
    if (!std::isfinite(data_.values[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("push value ", i, " is ", data_.values[i],
                       ": gradients must be finite (did training diverge? "
                       "try a lower learning rate)"));
    }
  }
  return std::move(data_);
}

}  // namespace monsoon::server
