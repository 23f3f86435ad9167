// Conversion between grpc::Status and absl::Status. The codes share numbering,
// so a status crosses the wire unchanged. Stateless; thread-safe.
#ifndef MONSOON_COMMON_GRPC_STATUS_H_
#define MONSOON_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace monsoon::common {

absl::Status ToAbslStatus(const grpc::Status& status);
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_GRPC_STATUS_H_
