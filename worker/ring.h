// Ring: this worker's place in the all-reduce of mode ALLREDUCE. gloo (the
// collective library PyTorch's CPU backend uses) over TCP: the workers meet
// through a rendezvous (RingRendezvous: shard 0's, PsClient), each connects
// to every other, and Allreduce sums a buffer over all of them with gloo's
// ring algorithm (reduce-scatter, then all-gather: each worker sends and
// receives 2(N-1)/N of the buffer, to and from its two neighbours).
//
// gloo reports failures with exceptions; Ring turns them into statuses. A
// worker that dies breaks the ring: its peers' next Allreduce fails
// (UNAVAILABLE, or DEADLINE_EXCEEDED after the timeout) and the run ends.
// Not thread-safe: one training thread owns it.
#ifndef MONSOON_WORKER_RING_H_
#define MONSOON_WORKER_RING_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace gloo {
class Context;
}

namespace monsoon::worker {

// The key-value store where ring members publish their addresses.
class RingRendezvous {
 public:
  virtual ~RingRendezvous() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // The value of `key`; nullopt while no member has set it.
  virtual absl::StatusOr<std::optional<std::string>> Get(
      const std::string& key) = 0;
};

struct RingOptions {
  int rank = 0;
  int size = 1;
  // The address this worker's peers reach it at (it listens there on a
  // port of the system's choosing).
  std::string host = "127.0.0.1";
  // Namespaces the keys of this ring in the rendezvous.
  std::string prefix = "ring";
  // How long connecting may take, and each Allreduce.
  absl::Duration timeout = absl::Seconds(60);
};

class Ring {
 public:
  // Connects to every other member. UNAVAILABLE when a member is not
  // reached in time (naming whom it waited for), INVALID_ARGUMENT for a
  // host this machine cannot listen on.
  static absl::StatusOr<std::unique_ptr<Ring>> Connect(
      const RingOptions& options, RingRendezvous* rendezvous);
  ~Ring();

  // values = the sum of every member's values, element by element (each
  // element summed in the same order on every member: all get the same
  // bits). With one member, nothing to do.
  absl::Status Allreduce(absl::Span<float> values);

  int rank() const { return options_.rank; }
  int size() const { return options_.size; }
  // What the ring algorithm has sent and received so far, in payload bytes:
  // 2(N-1) segments of about 1/N of each buffer, each way.
  int64_t bytes_sent() const { return bytes_sent_; }
  int64_t bytes_received() const { return bytes_sent_; }

 private:
  explicit Ring(const RingOptions& options) : options_(options) {}

  const RingOptions options_;
  std::shared_ptr<gloo::Context> context_;
  int64_t bytes_sent_ = 0;
  int64_t calls_ = 0;
};

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_RING_H_
