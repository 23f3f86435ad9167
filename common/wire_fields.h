// The protobuf wire types and the field numbers of proto/service.proto's
// PushChunk and PullChunk, for the two halves of common/wire.h: wire.cc
// writes messages, wire_reader.cc reads them. Private to the wire library
// (listed in its srcs): nothing else includes it.
#ifndef MONSOON_COMMON_WIRE_FIELDS_H_
#define MONSOON_COMMON_WIRE_FIELDS_H_

#include <cstdint>

namespace monsoon::common {

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

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_WIRE_FIELDS_H_
