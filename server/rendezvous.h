// Rendezvous: the key-value store through which an all-reduce run's
// workers find each other (mode ALLREDUCE; worker/ring.h). Each worker sets
// its ring address under a key and reads its peers'. Every value remembers
// who set it (rank and session), so that the shard can hide the values of
// processes that are gone (a restarted worker must not find its peer's old
// address). Bounded: at most
// kMaxKeys keys of kMaxKeyBytes, values of kMaxValueBytes, so that no
// caller can make it grow without end. One lock; thread-safe.
#ifndef MONSOON_SERVER_RENDEZVOUS_H_
#define MONSOON_SERVER_RENDEZVOUS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace monsoon::server {

class Rendezvous {
 public:
  static constexpr size_t kMaxKeys = 65536;
  static constexpr size_t kMaxKeyBytes = 256;
  static constexpr size_t kMaxValueBytes = 64 * 1024;

  // Sets `key` to `value` (replacing an earlier value). INVALID_ARGUMENT for
  // an empty or too long key or a too long value, RESOURCE_EXHAUSTED when
  // kMaxKeys keys are held and `key` is not one of them; nothing changes
  // then.
  absl::Status Set(const std::string& key, const std::string& value,
                   int rank, uint64_t session);
  struct Value {
    std::string value;
    int rank = 0;          // who set it
    uint64_t session = 0;  // and its session
  };
  // The value of `key`, if set.
  std::optional<Value> Get(const std::string& key) const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, Value> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_RENDEZVOUS_H_
