#include "worker/pull_decoder.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/onebit.h"

namespace monsoon::worker {

absl::Status PullReceiver::TakeVersion(PushResponse* push) {
  if (received_ == 0) {
    *version_ = chunk_.version;
    if (push != nullptr) {
      if (!chunk_.has_push) {
        return absl::DataLossError("push-pull answer without the push's");
      }
      *push = chunk_.push;
    }
  } else if (chunk_.version != *version_) {
    return absl::DataLossError("pull chunks of different versions");
  }
  return absl::OkStatus();
}

absl::Status PullReceiver::Take(const grpc::ByteBuffer& message,
                                PushResponse* push) {
  absl::Status parsed = reader_.ParsePullChunk(message, &chunk_);
  bytes_->fetch_add(static_cast<int64_t>(chunk_.message_bytes));
  if (!parsed.ok()) return absl::DataLossError(parsed.message());
  if (chunk_.encoding == ENCODING_ONEBIT) return TakeDelta(push);
  if (chunk_.encoding != ENCODING_FLOAT32) {
    return absl::DataLossError(absl::StrCat("pull chunk in encoding ",
                                            chunk_.encoding,
                                            ", which this worker "
                                            "does not know"));
  }
  if (delta_) {
    return absl::DataLossError("pull mixes float32 and 1-bit chunks");
  }
  const uint64_t n = chunk_.data.size() / sizeof(float);
  if (chunk_.offset != received_ || chunk_.data.size() % 4 != 0 ||
      n > out_.size() - received_) {
    return absl::DataLossError(
        absl::StrCat("malformed pull chunk at offset ", chunk_.offset, " with ",
                     chunk_.data.size(), " bytes (", received_, " of ",
                     out_.size(), " values received)"));
  }
  if (absl::Status version = TakeVersion(push); !version.ok()) {
    return version;
  }
  chunk_.data.CopyTo(out_.data() + received_);
  received_ += n;
  reader_.Reset();
  return absl::OkStatus();
}

absl::Status PullReceiver::TakeDelta(PushResponse* push) {
  if (!have_.has_value()) {
    return absl::DataLossError(
        "a 1-bit pull difference for a pull that holds no weights");
  }
  if (chunk_.base_version != *have_) {
    return absl::DataLossError(
        absl::StrCat("a 1-bit pull difference from version ",
                     chunk_.base_version, " for weights of version ", *have_));
  }
  if (received_ > 0 && !delta_) {
    return absl::DataLossError("pull mixes float32 and 1-bit chunks");
  }
  const uint64_t buckets = chunk_.scales.size() / (2 * sizeof(float));
  const uint64_t left = out_.size() - received_;
  const uint64_t n =
      std::min<uint64_t>(left, buckets * static_cast<uint64_t>(bucket_size_));
  if (chunk_.offset != received_ || buckets == 0 ||
      chunk_.scales.size() % (2 * sizeof(float)) != 0 ||
      common::OneBitBuckets(n, bucket_size_) != buckets) {
    return absl::DataLossError(
        absl::StrCat("malformed 1-bit pull chunk at offset ", chunk_.offset,
                     " with ", chunk_.scales.size(), " bytes of scales (",
                     received_, " of ", out_.size(), " values received)"));
  }
  if (absl::Status version = TakeVersion(push); !version.ok()) {
    return version;
  }
  decoded_.resize(n);
  if (absl::Status decoded =
          common::OneBitDecode(chunk_.data.ToString(), chunk_.scales.ToString(),
                               bucket_size_, absl::MakeSpan(decoded_));
      !decoded.ok()) {
    return absl::DataLossError(absl::StrCat(
        "1-bit pull chunk at offset ", chunk_.offset, ": ", decoded.message()));
  }
  float* w = out_.data() + received_;
  for (uint64_t i = 0; i < n; ++i) w[i] = w[i] + decoded_[i];
  received_ += n;
  delta_ = true;
  reader_.Reset();
  return absl::OkStatus();
}

absl::Status PullReceiver::Complete() const {
  if (received_ == out_.size()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("pull ended after ", received_,
                                          " of ", out_.size(), " values"));
}

}  // namespace monsoon::worker
