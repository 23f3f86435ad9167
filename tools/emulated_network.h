// EmulatedNetwork puts every server and worker of a local run on its own
// emulated host: a network namespace whose link to a shared bridge is shaped
// to a given rate (and delay, where the kernel has the netem qdisc) in both
// directions. Servers also get an unshaped control link, so that the
// evaluator's pulls and the launcher's statistics do not compete with the
// traffic being measured. Everything is created by Create() and removed by
// TearDown() or the destructor; namespaces left by a run that died are
// removed by the next one. Needs root or CAP_NET_ADMIN, and iproute2.
// Addresses exist only inside those namespaces and on the bridges.
// Not thread-safe.
#ifndef MONSOON_TOOLS_EMULATED_NETWORK_H_
#define MONSOON_TOOLS_EMULATED_NETWORK_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tools/local_cluster.h"

namespace monsoon::tools {

struct LinkSpec {
  int64_t rate_bits_per_s = 0;
  double delay_ms = 0;
  std::string text;  // as given, e.g. "100mbit,2ms"
};

// Parses RATE[,DELAY]: RATE is a number with kbit, mbit or gbit (or bit);
// DELAY a number with ms or us. INVALID_ARGUMENT says what is expected.
absl::StatusOr<LinkSpec> ParseLink(absl::string_view text);

// OK when this process may create namespaces and shape links (root or
// CAP_NET_ADMIN, and `ip` and `tc` present); PERMISSION_DENIED or
// FAILED_PRECONDITION say what is missing.
absl::Status CheckNetworkPrivileges();

// Parses "RANK:RATE[,RANK:RATE]..." (--link_worker): worker RANK's link has
// RATE instead of --link's (the delay stays --link's). INVALID_ARGUMENT for
// a bad rank or rate, a delay, or a rank given twice.
absl::StatusOr<std::map<int, int64_t>> ParseWorkerRates(absl::string_view text);

class EmulatedNetwork {
 public:
  // `worker_rates` (rank -> bits per second) overrides link's rate on those
  // workers' links.
  static absl::StatusOr<std::unique_ptr<EmulatedNetwork>> Create(
      int servers, int workers, const LinkSpec& link,
      const std::map<int, int64_t>& worker_rates = {});
  ~EmulatedNetwork();  // TearDown()
  EmulatedNetwork(const EmulatedNetwork&) = delete;
  EmulatedNetwork& operator=(const EmulatedNetwork&) = delete;

  const HostPlacement& placement() const { return placement_; }
  // Whether the link's delay is emulated: by netem, or where the kernel
  // lacks it, by delay proxies the launcher starts on the workers' hosts
  // (placement().proxy_delay_ms).
  bool delay_emulated() const { return delay_emulated_; }
  // "netem", "proxy", or "none" (no delay asked for).
  const std::string& delay_method() const { return delay_method_; }
  // The namespaces this network made, for tests and logs.
  const std::vector<std::string>& namespaces() const { return namespaces_; }

  // Removes every namespace, link and bridge; idempotent. Reports the first
  // failure but tries everything.
  absl::Status TearDown();

 private:
  EmulatedNetwork() = default;
  absl::Status Build(int servers, int workers, const LinkSpec& link,
                     const std::map<int, int64_t>& worker_rates);
  absl::Status Shape(const std::string& netns, const std::string& device,
                     const LinkSpec& link);

  std::string prefix_;  // "mon<pid>"
  std::vector<std::string> namespaces_;
  std::vector<std::string> bridges_;
  bool delay_emulated_ = true;
  bool netem_missing_ = false;
  std::string delay_method_ = "none";
  HostPlacement placement_;
};

}  // namespace monsoon::tools

#endif  // MONSOON_TOOLS_EMULATED_NETWORK_H_
