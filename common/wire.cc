#include "common/wire.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/onebit.h"

namespace monsoon::common {
namespace {

// Protobuf wire types.
constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kLengthDelimited = 2;
constexpr uint32_t kFixed32 = 5;

// Field numbers of proto/service.proto.
constexpr uint32_t kPushHeaderField = 1;
constexpr uint32_t kPushOffsetField = 2;
constexpr uint32_t kPushDataField = 3;
constexpr uint32_t kPushScalesField = 4;
constexpr uint32_t kPullVersionField = 1;
constexpr uint32_t kPullOffsetField = 2;
constexpr uint32_t kPullDataField = 3;
constexpr uint32_t kPullPushField = 4;
constexpr uint32_t kPullEncodingField = 5;
constexpr uint32_t kPullScalesField = 6;
constexpr uint32_t kPullBaseVersionField = 7;

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

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed message: ", what));
}

absl::Status WrongType(absl::string_view message, uint32_t field) {
  return Malformed(
      absl::StrCat(message, " field ", field, " has the wrong wire type"));
}

}  // namespace

PushEncoding PushEncodingFor(const TrainingConfig& resolved) {
  return resolved.compression() == COMPRESSION_ONEBIT ? ENCODING_ONEBIT
                                                      : ENCODING_FLOAT32;
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

void ByteRange::CopyTo(void* out) const {
  char* to = static_cast<char*>(out);
  uint64_t left = size_;
  size_t slice = slice_;
  size_t offset = offset_;
  while (left > 0) {
    const grpc::Slice& s = (*slices_)[slice];
    const size_t n = std::min<uint64_t>(left, s.size() - offset);
    std::memcpy(to, s.begin() + offset, n);
    to += n;
    left -= n;
    ++slice;
    offset = 0;
  }
}

std::string ByteRange::ToString() const {
  std::string out(size_, '\0');
  CopyTo(out.data());
  return out;
}

absl::Status MessageReader::Load(const grpc::ByteBuffer& message) {
  grpc::Status dumped = message.Dump(&slices_);
  if (!dumped.ok()) return Malformed("unreadable message buffer");
  slice_ = 0;
  offset_ = 0;
  left_ = 0;
  for (const grpc::Slice& s : slices_) left_ += s.size();
  return absl::OkStatus();
}

void MessageReader::Reset() {
  slices_.clear();
  slice_ = 0;
  offset_ = 0;
  left_ = 0;
}

bool MessageReader::ReadByte(uint8_t* byte) {
  while (left_ > 0) {
    const grpc::Slice& s = slices_[slice_];
    if (offset_ < s.size()) {
      *byte = s.begin()[offset_++];
      --left_;
      return true;
    }
    ++slice_;
    offset_ = 0;
  }
  return false;
}

bool MessageReader::ReadVarint(uint64_t* value) {
  *value = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    uint8_t byte;
    if (!ReadByte(&byte)) return false;
    *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;  // more than 10 bytes
}

bool MessageReader::Skip(uint64_t n) {
  if (n > left_) return false;
  left_ -= n;
  while (n > 0) {
    const size_t here = slices_[slice_].size() - offset_;
    if (n < here) {
      offset_ += n;
      return true;
    }
    n -= here;
    ++slice_;
    offset_ = 0;
  }
  return true;
}

absl::StatusOr<bool> MessageReader::Next(Field* field) {
  if (left_ == 0) return false;
  uint64_t tag;
  const uint64_t before = left_;
  if (!ReadVarint(&tag)) return Malformed("truncated field tag");
  // Protobuf reads a tag in at most 5 bytes and refuses the message
  // otherwise (found by tests/fuzz/push_decoder_fuzzer).
  if (before - left_ > 5) return Malformed("field tag longer than 5 bytes");
  field->number = static_cast<uint32_t>(tag >> 3);
  field->wire_type = static_cast<uint32_t>(tag & 7);
  if (field->number == 0 || (tag >> 3) > 0x1fffffff) {
    return Malformed("field number out of range");
  }
  switch (field->wire_type) {
    case kVarint:
      if (!ReadVarint(&field->varint)) return Malformed("truncated varint");
      return true;
    case kFixed64:
      if (!Skip(8)) return Malformed("truncated fixed64");
      return true;
    case kFixed32:
      if (!Skip(4)) return Malformed("truncated fixed32");
      return true;
    case kLengthDelimited: {
      uint64_t size;
      const uint64_t at = left_;
      if (!ReadVarint(&size)) return Malformed("truncated length");
      // As a tag's, a length's varint is at most 5 bytes for protobuf.
      if (at - left_ > 5) return Malformed("field length longer than 5 bytes");
      if (size > left_) return Malformed("a field runs past the message");
      // Skip empty slices so that the range starts where its bytes are.
      while (slice_ < slices_.size() && offset_ == slices_[slice_].size()) {
        ++slice_;
        offset_ = 0;
      }
      field->bytes.slices_ = &slices_;
      field->bytes.slice_ = slice_;
      field->bytes.offset_ = offset_;
      field->bytes.size_ = size;
      Skip(size);
      return true;
    }
    default:
      return Malformed(
          absl::StrCat("unsupported wire type ", field->wire_type));
  }
}

absl::Status MessageReader::ParsePushChunk(const grpc::ByteBuffer& message,
                                           PushChunkView* out) {
  if (absl::Status s = Load(message); !s.ok()) return s;
  *out = PushChunkView();
  out->message_bytes = left_;
  Field field;
  while (true) {
    absl::StatusOr<bool> more = Next(&field);
    if (!more.ok()) return more.status();
    if (!*more) return absl::OkStatus();
    const bool len = field.wire_type == kLengthDelimited;
    switch (field.number) {
      case kPushHeaderField:
        if (!len) return WrongType("PushChunk", field.number);
        // Repeated occurrences merge, as protobuf's do.
        if (!out->header.MergeFromString(field.bytes.ToString())) {
          return Malformed("PushChunk.header does not parse");
        }
        out->has_header = true;
        break;
      case kPushOffsetField:
        if (field.wire_type != kVarint) {
          return WrongType("PushChunk", field.number);
        }
        out->offset = field.varint;
        break;
      case kPushDataField:
        if (!len) return WrongType("PushChunk", field.number);
        out->data = field.bytes;
        break;
      case kPushScalesField:
        if (!len) return WrongType("PushChunk", field.number);
        out->scales = field.bytes;
        break;
      default:
        // A shard reads pushes from the network: fields it does not know
        // would be bytes it takes in for nothing (padding), so they are
        // refused, not skipped as protobuf would.
        return Malformed(absl::StrCat(
            "PushChunk field ", field.number,
            " is unknown to this shard (a client of another Monsoon "
            "version?)"));
    }
  }
}

absl::Status MessageReader::ParsePullChunk(const grpc::ByteBuffer& message,
                                           PullChunkView* out) {
  if (absl::Status s = Load(message); !s.ok()) return s;
  *out = PullChunkView();
  out->message_bytes = left_;
  Field field;
  while (true) {
    absl::StatusOr<bool> more = Next(&field);
    if (!more.ok()) return more.status();
    if (!*more) return absl::OkStatus();
    const bool len = field.wire_type == kLengthDelimited;
    switch (field.number) {
      case kPullVersionField:
        if (field.wire_type != kVarint) {
          return WrongType("PullChunk", field.number);
        }
        out->version = static_cast<int64_t>(field.varint);
        break;
      case kPullOffsetField:
        if (field.wire_type != kVarint) {
          return WrongType("PullChunk", field.number);
        }
        out->offset = field.varint;
        break;
      case kPullDataField:
        if (!len) return WrongType("PullChunk", field.number);
        out->data = field.bytes;
        break;
      case kPullPushField:
        if (!len) return WrongType("PullChunk", field.number);
        if (!out->push.MergeFromString(field.bytes.ToString())) {
          return Malformed("PullChunk.push does not parse");
        }
        out->has_push = true;
        break;
      case kPullEncodingField:
        if (field.wire_type != kVarint) {
          return WrongType("PullChunk", field.number);
        }
        // Kept as sent (an enum's unknown values too, as protobuf keeps
        // them): the receiver refuses what it cannot decode.
        out->encoding = static_cast<int64_t>(field.varint);
        break;
      case kPullScalesField:
        if (!len) return WrongType("PullChunk", field.number);
        out->scales = field.bytes;
        break;
      case kPullBaseVersionField:
        if (field.wire_type != kVarint) {
          return WrongType("PullChunk", field.number);
        }
        out->base_version = static_cast<int64_t>(field.varint);
        break;
      default:
        break;
    }
  }
}

absl::Status ParseSmallMessage(const grpc::ByteBuffer& message,
                               google::protobuf::MessageLite* out) {
  grpc::Slice slice;
  if (!message.DumpToSingleSlice(&slice).ok() ||
      !out->ParseFromArray(slice.begin(), static_cast<int>(slice.size()))) {
    return Malformed(absl::StrCat("not a ", out->GetTypeName()));
  }
  return absl::OkStatus();
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
  int32_t largest_all = 0;
  for (uint64_t begin = 0; begin < n; begin += kBlock) {
    const uint64_t end = std::min(n, begin + kBlock);
    // Bits without the sign fit an int32: a signed max, which SSE2 has.
    int32_t largest = 0;
    for (uint64_t i = begin; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, data + i, sizeof(bits));
      largest = std::max(largest, static_cast<int32_t>(bits & 0x7fffffffu));
    }
    if (static_cast<uint32_t>(largest) > limit) {
      for (uint64_t i = begin; i < end; ++i) {
        uint32_t bits;
        std::memcpy(&bits, data + i, sizeof(bits));
        if ((bits & 0x7fffffffu) > limit) return i;
      }
    }
    largest_all = std::max(largest_all, largest);
  }
  if (max_abs != nullptr) std::memcpy(max_abs, &largest_all, sizeof(float));
  return n;
}

uint64_t ValuesDigest(const float* data, uint64_t n) {
  constexpr int kLanes = 8;
  uint32_t a[kLanes] = {}, b[kLanes] = {};
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
  // Mixed into 64 bits (FNV-1a's multiplier over the lanes, then the
  // length), so that every lane counts.
  uint64_t digest = 0xcbf29ce484222325u;
  for (int l = 0; l < kLanes; ++l) {
    digest = (digest ^ a[l]) * 0x100000001b3u;
    digest = (digest ^ b[l]) * 0x100000001b3u;
  }
  return (digest ^ n) * 0x100000001b3u;
}

}  // namespace monsoon::common
