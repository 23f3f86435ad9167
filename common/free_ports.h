// Free TCP ports on 127.0.0.1 for daemons and tests that must know their
// ports before they start (a peer's address, a metrics port).
#ifndef MONSOON_COMMON_FREE_PORTS_H_
#define MONSOON_COMMON_FREE_PORTS_H_

#include "absl/status/statusor.h"

namespace monsoon::common {

// A first port p such that p .. p+count-1 could all be bound on 127.0.0.1
// just now (another process may take one before the daemons do; they then
// fail to start with a message naming the port). UNAVAILABLE when no such
// range turned up.
absl::StatusOr<int> FreePortRange(int count);

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_FREE_PORTS_H_
