// ShardTicker: what a shard does on the clock rather than on a call, five
// times a second on its own thread: the rule's tick (a sync step that its
// live workers have all pushed closes; a waiting step logs whom it waits
// for), waits past their deadline answered, waits that a lapsed or departed
// worker no longer holds let go (bounded staleness), lapsed leases logged,
// and a line of the shard's progress every `log_every`. Time the process did
// not run (a tick over a second late) does not count against the leases
// (ShardState::ForgiveStall). The thread starts
// in the constructor and is joined by Stop or the destructor.
#ifndef MONSOON_SERVER_SHARD_TICKER_H_
#define MONSOON_SERVER_SHARD_TICKER_H_

#include <functional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "proto/service.pb.h"
#include "server/shard_state.h"
#include "server/update_rule.h"

namespace monsoon::server {

class ShardTicker {
 public:
  // `state` and `rule` are not owned and must outlive the ticker.
  // `max_staleness` names the bound in the log (-1: none). Without
  // `log_lapses` the ranks whose lease ran out are not logged (allreduce:
  // its workers call the shards only to start, and rank 0 to publish).
  // With `serving`, a tick does nothing while it is false (the backup copy
  // of a range, which workers call only once it has taken the range over).
  ShardTicker(ShardState* state, UpdateRule* rule, absl::Duration log_every,
              int max_staleness, bool log_lapses = true,
              std::function<bool()> serving = nullptr);
  ~ShardTicker();
  ShardTicker(const ShardTicker&) = delete;
  ShardTicker& operator=(const ShardTicker&) = delete;

  // Stops and joins the thread; idempotent.
  void Stop();

 private:
  // One tick at `now`.
  void Tick(absl::Time now);
  // Logs what happened since `last_stats_` (nothing: no line).
  void LogProgress(absl::Duration since);

  // Constant after construction.
  ShardState* const state_;
  UpdateRule* const rule_;
  const absl::Duration log_every_;
  const int max_staleness_;
  const bool log_lapses_;
  const std::function<bool()> serving_;  // null: always

  // Used by the thread only.
  StatsResponse last_stats_;
  absl::Time last_log_;

  absl::Notification stop_;
  absl::Mutex join_mu_;
  std::thread thread_;  // last: starts once the rest is set
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_SHARD_TICKER_H_
