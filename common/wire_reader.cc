// The reading half of common/wire.h: ByteRange, MessageReader (PushChunk
// and PullChunk read in place from a received message's slices) and
// ParseSmallMessage. The rest of wire.h, message writing included, is in
// wire.cc.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/wire.h"
#include "common/wire_fields.h"

namespace monsoon::common {
namespace {

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed message: ", what));
}

absl::Status WrongType(absl::string_view message, uint32_t field) {
  return Malformed(
      absl::StrCat(message, " field ", field, " has the wrong wire type"));
}

}  // namespace

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

}  // namespace monsoon::common
