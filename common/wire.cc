// common/wire.h but for reading messages (ByteRange, MessageReader,
// ParseSmallMessage), which is in wire_reader.cc.
#include "common/wire.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/onebit.h"
#include "common/wire_fields.h"

namespace monsoon::common {
namespace {

// Appends protobuf's base-128 varint of `value`.
void PutVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

void PutTag(uint32_t field, uint32_t wire_type, std::string* out) {
  PutVarint((static_cast<uint64_t>(field) << 3) | wire_type, out);
}

// A length-delimited field's tag and length, its bytes to follow.
void PutLengthPrefix(uint32_t field, uint64_t size, std::string* out) {
  PutTag(field, kLengthDelimited, out);
  PutVarint(size, out);
}

// The message from its parts: small prefixes copied, payloads borrowed.
grpc::ByteBuffer Assemble(std::string prefix, const grpc::Slice& data,
                          std::string middle, const grpc::Slice& scales,
                          std::string tail = {}) {
  grpc::Slice slices[5];
  size_t n = 0;
  if (!prefix.empty()) slices[n++] = grpc::Slice(prefix);
  if (data.size() > 0) slices[n++] = data;
  if (!middle.empty()) slices[n++] = grpc::Slice(middle);
  if (scales.size() > 0) slices[n++] = scales;
  if (!tail.empty()) slices[n++] = grpc::Slice(tail);
  return grpc::ByteBuffer(slices, n);
}

void ReleaseShared(void* owner) {
  delete static_cast<std::shared_ptr<const void>*>(owner);
}

}  // namespace

PushEncoding PushEncodingFor(const TrainingConfig& resolved) {
  return resolved.compression() == COMPRESSION_ONEBIT ? ENCODING_ONEBIT
                                                      : ENCODING_FLOAT32;
}

uint64_t Float32ChunkValues(const TrainingConfig& resolved) {
  return std::max<uint64_t>(
      1, static_cast<uint64_t>(resolved.chunk_bytes()) / sizeof(float));
}

PayloadBytes PayloadBytesFor(PushEncoding encoding, uint64_t n,
                             int bucket_size) {
  PayloadBytes bytes;
  if (encoding == ENCODING_ONEBIT) {
    bytes.data = OneBitBitsBytes(n, bucket_size);
    bytes.scales = OneBitBuckets(n, bucket_size) * 2 * sizeof(float);
  } else {
    bytes.data = n * sizeof(float);
  }
  return bytes;
}

ChunkPlan::ChunkPlan(PushEncoding encoding, uint64_t n, int bucket_size,
                     uint64_t chunk_bytes)
    : encoding_(encoding), n_(n), bucket_size_(bucket_size) {
  if (encoding == ENCODING_ONEBIT) {
    const uint64_t bucket_bytes =
        (static_cast<uint64_t>(bucket_size) + 7) / 8 + 2 * sizeof(float);
    const uint64_t buckets = std::max<uint64_t>(1, chunk_bytes / bucket_bytes);
    values_per_chunk_ = buckets * static_cast<uint64_t>(bucket_size);
  } else {
    values_per_chunk_ = std::max<uint64_t>(1, chunk_bytes / sizeof(float));
  }
  chunks_ = n == 0 ? 1 : (n + values_per_chunk_ - 1) / values_per_chunk_;
}

ChunkRange ChunkPlan::operator[](size_t i) const {
  ChunkRange chunk;
  chunk.first_value = std::min<uint64_t>(n_, i * values_per_chunk_);
  chunk.values = std::min<uint64_t>(n_ - chunk.first_value, values_per_chunk_);
  if (encoding_ == ENCODING_ONEBIT) {
    // Chunks start on bucket boundaries, buckets on byte boundaries.
    const uint64_t first_bucket = chunk.first_value / bucket_size_;
    chunk.data_offset =
        first_bucket * ((static_cast<uint64_t>(bucket_size_) + 7) / 8);
    chunk.data_bytes = OneBitBitsBytes(chunk.values, bucket_size_);
    chunk.scales_offset = first_bucket * 2 * sizeof(float);
    chunk.scales_bytes =
        OneBitBuckets(chunk.values, bucket_size_) * 2 * sizeof(float);
  } else {
    chunk.data_offset = chunk.first_value * sizeof(float);
    chunk.data_bytes = chunk.values * sizeof(float);
  }
  return chunk;
}

struct BufferLease::Count {
  absl::Mutex mu;
  int64_t borrowed ABSL_GUARDED_BY(mu) = 0;
};

BufferLease::BufferLease() : count_(std::make_shared<Count>()) {}

grpc::Slice BufferLease::Borrow(const void* data, size_t n) {
  {
    absl::MutexLock lock(&count_->mu);
    ++count_->borrowed;
  }
  // The slice keeps the count alive; its release decrements it.
  auto* hold = new std::shared_ptr<Count>(count_);
  return grpc::Slice(
      const_cast<void*>(data), n,
      [](void* user) {
        auto* held = static_cast<std::shared_ptr<Count>*>(user);
        {
          absl::MutexLock lock(&(*held)->mu);
          --(*held)->borrowed;
        }
        delete held;
      },
      hold);
}

bool BufferLease::AwaitReleased(absl::Duration timeout) {
  Count& count = *count_;
  absl::MutexLock lock(&count.mu);
  auto released = [&count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(count.mu) {
    return count.borrowed == 0;
  };
  return count.mu.AwaitWithTimeout(absl::Condition(&released), timeout);
}

grpc::Slice SharedSlice(const void* data, size_t n,
                        std::shared_ptr<const void> owner) {
  return grpc::Slice(const_cast<void*>(data), n, &ReleaseShared,
                     new std::shared_ptr<const void>(std::move(owner)));
}

grpc::ByteBuffer PushChunkMessage(const PushHeader* header, uint64_t offset,
                                  const grpc::Slice& data,
                                  const grpc::Slice& scales) {
  std::string prefix;
  if (header != nullptr) {
    const std::string bytes = header->SerializeAsString();
    PutLengthPrefix(kPushHeaderField, bytes.size(), &prefix);
    prefix += bytes;
  }
  if (offset != 0) {
    PutTag(kPushOffsetField, kVarint, &prefix);
    PutVarint(offset, &prefix);
  }
  if (data.size() > 0) PutLengthPrefix(kPushDataField, data.size(), &prefix);
  std::string middle;
  if (scales.size() > 0) {
    PutLengthPrefix(kPushScalesField, scales.size(), &middle);
  }
  return Assemble(std::move(prefix), data, std::move(middle), scales);
}

grpc::ByteBuffer PullChunkMessage(int64_t version, uint64_t offset,
                                  const grpc::Slice& data,
                                  const PushResponse* push,
                                  const PullDelta* delta) {
  std::string prefix;
  if (version != 0) {
    PutTag(kPullVersionField, kVarint, &prefix);
    PutVarint(static_cast<uint64_t>(version), &prefix);
  }
  if (offset != 0) {
    PutTag(kPullOffsetField, kVarint, &prefix);
    PutVarint(offset, &prefix);
  }
  if (data.size() > 0) PutLengthPrefix(kPullDataField, data.size(), &prefix);
  std::string after;
  if (push != nullptr) {
    const std::string bytes = push->SerializeAsString();
    PutLengthPrefix(kPullPushField, bytes.size(), &after);
    after += bytes;
  }
  if (delta == nullptr) {
    return Assemble(std::move(prefix), data, std::move(after), grpc::Slice());
  }
  PutTag(kPullEncodingField, kVarint, &after);
  PutVarint(static_cast<uint64_t>(ENCODING_ONEBIT), &after);
  if (delta->scales.size() > 0) {
    PutLengthPrefix(kPullScalesField, delta->scales.size(), &after);
  }
  std::string tail;
  if (delta->base_version != 0) {
    PutTag(kPullBaseVersionField, kVarint, &tail);
    PutVarint(static_cast<uint64_t>(delta->base_version), &tail);
  }
  return Assemble(std::move(prefix), data, std::move(after), delta->scales,
                  std::move(tail));
}

grpc::ByteBuffer SmallMessage(const google::protobuf::MessageLite& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

uint64_t FirstNonFinite(const float* data, uint64_t n) {
  return FirstOutside(data, n, std::numeric_limits<float>::max());
}

uint64_t FirstOutside(const float* data, uint64_t n, float bound,
                      float* max_abs) {
  // For a finite bound >= 0, |v| <= bound exactly when v's bits without the
  // sign are at most the bound's (IEEE floats of one sign order as their
  // bits); NaN and infinities are above any finite bound's. The largest
  // such bits of each block, a max that vectorizes, are compared with the
  // bound's; a block beyond it is then searched.
  uint32_t limit;
  std::memcpy(&limit, &bound, sizeof(limit));
  limit &= 0x7fffffffu;
  constexpr uint64_t kBlock = 1024;
  // Bits without the sign fit an int32: a signed max. Baseline x86-64 (SSE2)
  // has no 32-bit max instruction, so each takes a compare and three logic
  // operations; kLanes independent maxima (four registers) keep them from
  // waiting on one another: 3.2 times as fast as one running max over 4 MiB
  // here, about twice a memcpy's time.
  constexpr int kLanes = 16;
  int32_t largest_all = 0;
  for (uint64_t begin = 0; begin < n; begin += kBlock) {
    const uint64_t end = std::min(n, begin + kBlock);
    int32_t lanes[kLanes] = {};
    uint64_t i = begin;
    for (; i + kLanes <= end; i += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        uint32_t bits;
        std::memcpy(&bits, data + i + l, sizeof(bits));
        lanes[l] =
            std::max(lanes[l], static_cast<int32_t>(bits & 0x7fffffffu));
      }
    }
    int32_t largest = 0;
    for (; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, data + i, sizeof(bits));
      largest = std::max(largest, static_cast<int32_t>(bits & 0x7fffffffu));
    }
    for (int32_t lane : lanes) largest = std::max(largest, lane);
    if (static_cast<uint32_t>(largest) > limit) {
      for (uint64_t j = begin; j < end; ++j) {
        uint32_t bits;
        std::memcpy(&bits, data + j, sizeof(bits));
        if ((bits & 0x7fffffffu) > limit) return j;
      }
    }
    largest_all = std::max(largest_all, largest);
  }
  if (max_abs != nullptr) std::memcpy(max_abs, &largest_all, sizeof(float));
  return n;
}

DigestSums SumsForDigest(const float* data, uint64_t n) {
  constexpr int kLanes = DigestSums::kLanes;
  uint32_t a[kLanes] = {}, b[kLanes] = {};  // locals: they stay in registers
  uint64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      uint32_t bits;
      std::memcpy(&bits, data + i + l, sizeof(bits));
      a[l] += bits;
      b[l] += a[l];
    }
  }
  for (int l = 0; i < n; ++i, ++l) {
    uint32_t bits;
    std::memcpy(&bits, data + i, sizeof(bits));
    a[l] += bits;
    b[l] += a[l];
  }
  DigestSums sums;
  std::copy(a, a + kLanes, sums.a);
  std::copy(b, b + kLanes, sums.b);
  sums.n = n;
  return sums;
}

DigestSums JoinDigestSums(const DigestSums& first, const DigestSums& then) {
  // In each lane, b sums every value times the number of the lane's
  // values from it to the run's end: `first`'s values gain those of
  // `then` in the same lane (lanes line up: first.n is whole groups).
  constexpr int kLanes = DigestSums::kLanes;
  DigestSums joined;
  for (int l = 0; l < kLanes; ++l) {
    const uint64_t later = then.n / kLanes + (static_cast<uint64_t>(l) <
                                              then.n % kLanes);
    joined.a[l] = first.a[l] + then.a[l];
    joined.b[l] = first.b[l] + static_cast<uint32_t>(later) * first.a[l] +
                  then.b[l];
  }
  joined.n = first.n + then.n;
  return joined;
}

uint64_t DigestOfSums(const DigestSums& sums) {
  // Mixed into 64 bits (FNV-1a's multiplier over the lanes, then the
  // length), so that every lane counts.
  uint64_t digest = 0xcbf29ce484222325u;
  for (int l = 0; l < DigestSums::kLanes; ++l) {
    digest = (digest ^ sums.a[l]) * 0x100000001b3u;
    digest = (digest ^ sums.b[l]) * 0x100000001b3u;
  }
  return (digest ^ sums.n) * 0x100000001b3u;
}

uint64_t ValuesDigest(const float* data, uint64_t n) {
  return DigestOfSums(SumsForDigest(data, n));
}

}  // namespace monsoon::common
