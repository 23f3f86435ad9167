#include "server/push_decoder.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/onebit.h"

namespace monsoon::server {

PushDecoder::PushDecoder(int shard, uint64_t shard_size, int num_workers,
                         PushEncoding encoding, int bucket_size,
                         FloatBufferPool* buffers, PushLimits limits)
    : limits_(limits),
      shard_(shard),
      shard_size_(shard_size),
      num_workers_(num_workers),
      encoding_(encoding),
      bucket_size_(bucket_size),
      buffers_(buffers) {
  data_.max_abs = 0.0f;  // the largest so far: none yet
}

PushDecoder::~PushDecoder() { ReleaseSlot(); }

void PushDecoder::ReleaseSlot() {
  if (slot_rank_ >= 0) limits_.slots->Release(slot_rank_);
  slot_rank_ = -1;
}

absl::Status PushDecoder::Add(const grpc::ByteBuffer& message) {
  absl::Status parsed = reader_.ParsePushChunk(message, &chunk_);
  data_.wire_bytes += static_cast<int64_t>(chunk_.message_bytes);
  if (!parsed.ok()) return parsed;
  if (!have_header_) {
    if (!chunk_.has_header) {
      return absl::InvalidArgumentError(
          "the first chunk of a push must carry its header");
    }
    if (absl::Status taken = TakeHeader(chunk_.header); !taken.ok()) {
      return taken;
    }
  } else if (chunk_.has_header) {
    return absl::InvalidArgumentError(
        "only the first chunk may carry a header");
  }
  absl::Status added =
      push_encoding_ == ENCODING_ONEBIT ? AddOneBit(chunk_) : AddFloat32(chunk_);
  reader_.Reset();  // lets go of the message's slices
  return added;
}

absl::Status PushDecoder::TakeHeader(const PushHeader& h) {
  if (absl::Status valid = CheckHeader(h); !valid.ok()) return valid;
  if (limits_.slots != nullptr) {
    if (!limits_.slots->Acquire(h.worker_rank())) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "rank ", h.worker_rank(), " already has ", limits_.slots->per_rank(),
          " pushes in flight to this shard, the most it may"));
    }
    slot_rank_ = h.worker_rank();
  }
  have_header_ = true;
  data_.worker_rank = h.worker_rank();
  data_.base_version = h.base_version();
  if (h.has_have_version()) data_.have_version = h.have_version();
  data_.samples = h.samples();
  data_.sample_offset = h.sample_offset();
  data_.session = h.session();
  data_.repeat = h.repeat();
  data_.resume_point = h.resume_point();
  data_.replica_seq = h.replica_seq();
  data_.replica_epoch = h.replica_epoch();
  if (h.sync_step()) {
    auto step = std::make_shared<SyncStep>();
    step->version = h.replica_seq();
    step->max_abs = h.step_max_abs();
    step->without_update = h.step_without_update();
    for (const StepExamples& e : h.step_examples()) {
      step->examples.push_back({e.rank(), e.offset(), e.samples(), e.kind()});
    }
    data_.step = std::move(step);
  }
  push_encoding_ = h.encoding();
  digest_ = limits_.digest && h.replica_seq() == 0;
  if (push_encoding_ == ENCODING_ONEBIT) {
    const common::PayloadBytes bytes =
        common::PayloadBytesFor(ENCODING_ONEBIT, shard_size_, bucket_size_);
    bits_.reserve(bytes.data);
    scales_.reserve(bytes.scales);
  }
  values_ = buffers_->Take();
  return absl::OkStatus();
}

absl::Status PushDecoder::CheckHeader(const PushHeader& h) const {
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
  if (h.replica_seq() < 0 || h.replica_epoch() < 0 ||
      (h.replica_seq() > 0) != (h.replica_epoch() > 0)) {
    return absl::InvalidArgumentError(
        "push header has a negative replica_seq or replica_epoch, or one "
        "without the other");
  }
  if (h.sync_step() || h.step_examples_size() > 0) {
    if (!h.sync_step() || h.replica_seq() == 0) {
      return absl::InvalidArgumentError(
          "step_examples belong to a forwarded sync step (sync_step and "
          "replica_seq set)");
    }
    if (h.step_examples_size() > num_workers_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a forwarded sync step with ", h.step_examples_size(),
          " ranks' examples, in a run of ", num_workers_, " workers"));
    }
    for (const StepExamples& e : h.step_examples()) {
      if (e.rank() < 0 || e.rank() >= num_workers_ || e.offset() < 0 ||
          e.samples() < 0 || e.offset() > kMaxSampleOffset ||
          e.samples() > limits_.max_samples ||
          !StepExamples::Kind_IsValid(e.kind())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a forwarded sync step's examples are out of range: rank ",
            e.rank(), ", examples ", e.offset(), "+", e.samples()));
      }
    }
    if (!(h.step_max_abs() >= 0)) {
      return absl::InvalidArgumentError(
          "a forwarded sync step's step_max_abs must be at least 0");
    }
  }
  // A primary forwards the values its rule applied: float32.
  if (h.replica_seq() > 0 && h.encoding() != ENCODING_FLOAT32 &&
      h.encoding() != encoding_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a forwarded (replicated) push must be float32 or in this run's "
        "encoding (",
        PushEncoding_Name(encoding_), "), not ",
        PushEncoding_Name(h.encoding())));
  }
  if (h.replica_seq() == 0 && h.encoding() != encoding_) {
    return absl::InvalidArgumentError(
        absl::StrCat("push encoded as ", PushEncoding_Name(h.encoding()),
                     " but this run's config makes workers push ",
                     PushEncoding_Name(encoding_)));
  }
  if (h.encoding() == ENCODING_ONEBIT && h.bucket_size() != bucket_size_) {
    return absl::InvalidArgumentError(absl::StrCat("1-bit push in buckets of ",
                                                   h.bucket_size(),
                                                   " but the config's "
                                                   "onebit_bucket_size is ",
                                                   bucket_size_));
  }
  if (h.base_version() < 0 || h.samples() < 0 || h.sample_offset() < 0) {
    return absl::InvalidArgumentError(
        "push header has a negative base_version, samples or "
        "sample_offset");
  }
  if (h.samples() > limits_.max_samples) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push claims ", h.samples(),
        " examples; a push of this run "
        "summarizes at most ",
        limits_.max_samples, " (batch_size x the steps summed into one push)"));
  }
  if (h.sample_offset() > kMaxSampleOffset) {
    return absl::InvalidArgumentError(
        absl::StrCat("push claims its examples start at ", h.sample_offset(),
                     ", beyond any run's data (", kMaxSampleOffset, ")"));
  }
  return absl::OkStatus();
}

absl::Status PushDecoder::AddFloat32(
    const common::MessageReader::PushChunkView& chunk) {
  if (!chunk.scales.empty()) {
    return absl::InvalidArgumentError("a float32 push chunk carries scales");
  }
  if (chunk.data.size() % sizeof(float) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of ", chunk.data.size(),
                     " bytes is not a whole number of float32 values"));
  }
  const uint64_t n = chunk.data.size() / sizeof(float);
  const uint64_t at = chunk.offset;
  if (at > shard_size_ || n > shard_size_ - at) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk of ", n, " values at offset ", at, " ends beyond the ",
        shard_size_, " values of shard ", shard_));
  }
  // Float32 chunks go on from either end of what has arrived: in order, or
  // back to front from where the first one began (a worker sends the end
  // of its range while its backward pass still computes the beginning).
  if (chunks_ > 0 && at != hi_ && at + n != lo_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk of ", n, " values at offset ", at, " after values [", lo_,
        ", ", hi_, "): a chunk must begin where they end or end where they "
        "begin"));
  }
  float* out = values_.get() + at;
  chunk.data.CopyTo(out);
  // Checked while the chunk is still in cache.
  if (absl::Status bounded = CheckValues(out, n, at); !bounded.ok()) {
    return bounded;
  }
  SumForDigest(at, n);
  if (chunks_ == 0) {
    lo_ = at;
    hi_ = at + n;
  } else if (at == hi_) {
    hi_ += n;
  } else {
    lo_ = at;
  }
  ++chunks_;
  return absl::OkStatus();
}

void PushDecoder::SumForDigest(uint64_t at, uint64_t n) {
  if (!digest_ || !digest_by_chunk_) return;
  const common::DigestSums sums =
      common::SumsForDigest(values_.get() + at, n);
  constexpr uint64_t kLanes = common::DigestSums::kLanes;
  if (chunks_ == 0) {
    digest_sums_ = sums;
  } else if (at == hi_ && digest_sums_.n % kLanes == 0) {
    digest_sums_ = common::JoinDigestSums(digest_sums_, sums);
  } else if (at + n == lo_ && n % kLanes == 0) {
    digest_sums_ = common::JoinDigestSums(sums, digest_sums_);
  } else {
    digest_by_chunk_ = false;
  }
}

absl::Status PushDecoder::AddOneBit(
    const common::MessageReader::PushChunkView& chunk) {
  // Chunks hold whole buckets: the scales say how many.
  constexpr uint64_t kScaleBytes = 2 * sizeof(float);
  if (chunk.scales.size() % kScaleBytes != 0 || chunk.scales.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "1-bit chunk has ", chunk.scales.size(),
        " bytes of scales; it needs two float32 per bucket, at least one"));
  }
  if (chunk.offset != hi_) {
    return absl::InvalidArgumentError(
        absl::StrCat("1-bit chunk at offset ", chunk.offset, " but ", hi_,
                     " values have arrived: 1-bit chunks must be in order"));
  }
  const uint64_t buckets = chunk.scales.size() / kScaleBytes;
  const uint64_t left = shard_size_ - hi_;
  if (buckets > common::OneBitBuckets(left, bucket_size_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("1-bit chunk has ", buckets, " buckets but only ", left,
                     " values of shard ", shard_, " remain (buckets of ",
                     bucket_size_, ")"));
  }
  const uint64_t n = std::min<uint64_t>(left, buckets * bucket_size_);
  // Kept whole, as the push came (PushData::onebit_bits): a primary
  // forwards them.
  const size_t bits_at = bits_.size();
  bits_.resize(bits_at + chunk.data.size());
  chunk.data.CopyTo(bits_.data() + bits_at);
  const size_t scales_at = scales_.size();
  scales_.resize(scales_at + chunk.scales.size());
  chunk.scales.CopyTo(scales_.data() + scales_at);
  absl::Status status = common::OneBitDecode(
      absl::string_view(bits_).substr(bits_at),
      absl::string_view(scales_).substr(scales_at), bucket_size_,
      absl::MakeSpan(values_.get() + hi_, n));
  if (!status.ok()) return status;
  if (absl::Status bounded = CheckValues(values_.get() + hi_, n, hi_);
      !bounded.ok()) {
    return bounded;
  }
  SumForDigest(hi_, n);
  hi_ += n;
  ++chunks_;
  return absl::OkStatus();
}

absl::Status PushDecoder::CheckValues(const float* values, uint64_t n,
                                      uint64_t first) {
  float max_abs = 0.0f;
  const uint64_t bad =
      common::FirstOutside(values, n, limits_.max_abs_value, &max_abs);
  if (bad == n) {
    data_.max_abs = std::max(data_.max_abs, max_abs);
    return absl::OkStatus();
  }
  if (!std::isfinite(values[bad])) {
    return absl::InvalidArgumentError(
        absl::StrCat("push value ", first + bad, " is ", values[bad],
                     ": gradients must be finite (did training diverge? "
                     "try a lower learning rate)"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "push value ", first + bad, " is ", values[bad],
      ", beyond the shard's bound of ", limits_.max_abs_value,
      " (--max_abs_gradient): a value that large would swamp the weights "
      "or the optimizer's state"));
}

std::shared_ptr<const void> PushDecoder::ReleaseStorage(PushData* push) {
  if (push->buffer != &values_ || values_ == nullptr) return nullptr;
  struct Storage {
    FloatBufferPool::Buffer values;
    std::string bits;
    std::string scales;
  };
  auto storage = std::make_shared<Storage>();
  storage->values = std::move(values_);
  storage->bits = std::move(bits_);
  storage->scales = std::move(scales_);
  push->buffer = nullptr;
  push->values = absl::MakeConstSpan(storage->values.get(), shard_size_);
  if (push->encoding == ENCODING_ONEBIT) {
    push->onebit_bits = storage->bits;
    push->onebit_scales = storage->scales;
  }
  return storage;
}

absl::StatusOr<PushData> PushDecoder::Finish() {
  // The push is whole (or never will be): what it holds from here on is the
  // caller's to account for, not the stream's.
  ReleaseSlot();
  if (!have_header_) {
    return absl::InvalidArgumentError("empty push: no header");
  }
  if (lo_ != 0 || hi_ != shard_size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push ended after ", hi_ - lo_, " of ", shard_size_, " values"));
  }
  PushData push = data_;
  push.values = absl::MakeConstSpan(values_.get(), shard_size_);
  push.encoding = push_encoding_;
  if (push_encoding_ == ENCODING_ONEBIT) {
    push.onebit_bits = bits_;
    push.onebit_scales = scales_;
  }
  push.buffer = &values_;
  if (digest_) {
    push.digest = digest_by_chunk_
                      ? common::DigestOfSums(digest_sums_)
                      : common::ValuesDigest(values_.get(), shard_size_);
  }
  return push;
}

}  // namespace monsoon::server
