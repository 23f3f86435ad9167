#include "server/push_decoder.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/float_bytes.h"
#include "common/onebit.h"

namespace monsoon::server {

PushEncoding PushEncodingFor(const TrainingConfig& resolved) {
  return resolved.compression() == COMPRESSION_ONEBIT ? ENCODING_ONEBIT
                                                      : ENCODING_FLOAT32;
}

PushDecoder::PushDecoder(int shard, uint64_t shard_size, int num_workers,
                         PushEncoding encoding, int bucket_size)
    : shard_(shard),
      shard_size_(shard_size),
      num_workers_(num_workers),
      encoding_(encoding),
      bucket_size_(bucket_size) {}

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
    if (h.encoding() != encoding_) {
      return absl::InvalidArgumentError(
          absl::StrCat("push encoded as ", PushEncoding_Name(h.encoding()),
                       " but this run's config makes workers push ",
                       PushEncoding_Name(encoding_)));
    }
    if (encoding_ == ENCODING_ONEBIT && h.bucket_size() != bucket_size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("1-bit push in buckets of ", h.bucket_size(),
                       " but the config's "
                       "onebit_bucket_size is ",
                       bucket_size_));
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
    return absl::InvalidArgumentError(
        "only the first chunk may carry a header");
  }
  if (chunk.offset() != received_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk at offset ", chunk.offset(), " but ", received_,
                     " values have arrived: chunks must be in order"));
  }
  if (encoding_ == ENCODING_ONEBIT) return AddOneBit(chunk);
  if (!chunk.scales().empty()) {
    return absl::InvalidArgumentError("a float32 push chunk carries scales");
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

absl::Status PushDecoder::AddOneBit(const PushChunk& chunk) {
  // Chunks hold whole buckets: the scales say how many.
  constexpr uint64_t kScaleBytes = 2 * sizeof(float);
  if (chunk.scales().size() % kScaleBytes != 0 || chunk.scales().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "1-bit chunk has ", chunk.scales().size(),
        " bytes of scales; it needs two float32 per bucket, at least one"));
  }
  const uint64_t buckets = chunk.scales().size() / kScaleBytes;
  const uint64_t left = shard_size_ - received_;
  if (buckets > common::OneBitBuckets(left, bucket_size_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("1-bit chunk has ", buckets, " buckets but only ", left,
                     " values of shard ", shard_, " remain (buckets of ",
                     bucket_size_, ")"));
  }
  const uint64_t n = std::min<uint64_t>(left, buckets * bucket_size_);
  absl::Status status =
      common::OneBitDecode(chunk.data(), chunk.scales(), bucket_size_,
                           absl::MakeSpan(data_.values.data() + received_, n));
  if (!status.ok()) return status;
  received_ += n;
  return absl::OkStatus();
}

absl::StatusOr<PushData> PushDecoder::Finish() {
  if (!have_header_) {
    return absl::InvalidArgumentError("empty push: no header");
  }
  if (received_ != shard_size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push ended after ", received_, " of ", shard_size_, " values"));
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
