// DelayProxy: a TCP forwarder that holds every byte it forwards for a fixed
// delay, in each direction, so that a link whose kernel lacks the netem
// qdisc still has the latency it is meant to have (EmulatedNetwork shapes
// the rate with tbf; the launcher puts a proxy in front of each server on
// each worker's emulated host). Bytes read at time t are written at t +
// delay, in order; the rate is whatever the links below allow. Owns its
// threads (an acceptor, and per connection one reader and one writer per
// direction); the destructor closes every connection. Thread-safe.
#ifndef MONSOON_TOOLS_DELAY_PROXY_H_
#define MONSOON_TOOLS_DELAY_PROXY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace monsoon::tools {

class DelayProxy {
 public:
  // Listens on `listen` (IPv4 HOST:PORT, port 0 for any) and forwards each
  // connection to `target` (IPv4 HOST:PORT), delaying both directions by
  // `delay`. INVALID_ARGUMENT for a bad address or delay, UNAVAILABLE when
  // it cannot listen.
  static absl::StatusOr<std::unique_ptr<DelayProxy>> Start(
      const std::string& listen, const std::string& target,
      absl::Duration delay);
  virtual ~DelayProxy() = default;

  // The port it listens on.
  virtual int port() const = 0;
};

}  // namespace monsoon::tools

#endif  // MONSOON_TOOLS_DELAY_PROXY_H_
