// Sessions: which process holds each worker rank of a shard, and the
// ranks' leases. A worker draws a session id at start and registers it
// (Open); every call for the rank must carry it (Check) once it is
// registered; a rank is alive while it called within the lease (every call
// renews it), or if it has never called (a worker still starting). One lock;
// thread-safe.
#ifndef MONSOON_SERVER_SESSIONS_H_
#define MONSOON_SERVER_SESSIONS_H_

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace monsoon::server {

class Sessions {
 public:
  // Elastic runs (TrainingConfig.elastic): a rank that has not registered
  // is not live (it may never come), rather than a worker still starting.
  // Set before serving.
  void set_elastic(bool elastic);
  void set_lease(absl::Duration lease);
  absl::Duration lease() const;
  // Registration of `rank` by the process that drew `session`: OK (and the
  // lease renewed), ALREADY_EXISTS when another session holds the rank
  // and called within the lease, unless that session is `replaces` (the
  // process that held it died: RegisterRequest.replaces_session),
  // INVALID_ARGUMENT for session 0 (no session: it would unbind the
  // holder).
  absl::Status Open(int rank, uint64_t session, uint64_t replaces = 0);
  // `rank`'s process, if it holds the session `session`, is done: it
  // counts as gone from now on (not Alive), and another session may take
  // the rank at once.
  void End(int rank, uint64_t session);
  // A range's backup: the primary ended `session` of `rank` (End there).
  // The rank counts as gone here too, whatever this copy had of it.
  void EndAsPrimaryDid(int rank, uint64_t session);
  // Whether the rank's last session ended with End.
  bool HasLeft(int rank) const;
  // OK when a call for `rank` carrying `session` may act for the rank: the
  // session holds it, or no process has registered the rank (a shard
  // restarted since, or a client that does not register). Otherwise
  // PERMISSION_DENIED naming the mistake.
  absl::Status Check(int rank, uint64_t session) const;
  // A call from `rank`: renews its lease.
  void Touch(int rank);
  // This shard's process did not run for `stall` (stopped, or its machine
  // paused): no worker could reach it then, so that time does not count
  // against any lease (each last call moves on by it).
  void Forgive(absl::Duration stall);
  bool Alive(int rank, absl::Time now) const;
  // Time since the rank's last call (InfiniteDuration if it never called).
  absl::Duration SinceContact(int rank, absl::Time now) const;
  // The registered ranks (not left) whose lease has run out since the last
  // call of this, each once until it calls again, with the time since its
  // last call. The shard's ticker logs them.
  std::vector<std::pair<int, absl::Duration>> NewlyLapsed(absl::Time now);
  // Every rank that has called, with the time of its last call, and the
  // ranks that registered and have not left.
  std::map<int, absl::Time> LastContacts() const;
  int NumRegistered() const;
  // For ranks [0, num_ranks), under one lock: whether each is live (never
  // called, or called within the lease and not left).
  std::vector<bool> LiveRanks(int num_ranks, absl::Time now) const;

  // Who is in the run: a rank joins when it registers, or calls again
  // after its lease ran out, not being live; it leaves when it ends its
  // session or its lease runs out (seen by NewlyLapsed). The epoch counts
  // both.
  struct Membership {
    int64_t epoch = 0;
    int64_t joins = 0;
    int64_t leaves = 0;
  };
  Membership membership() const;

 private:
  struct Session {
    uint64_t id = 0;
    absl::Time last_contact = absl::InfinitePast();
    bool left = false;
    bool lapse_reported = false;  // by NewlyLapsed, since the last call
  };
  // Live: registered (or, outside elastic runs, never called), called
  // within the lease and not left.
  bool IsLive(const Session& session, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  bool elastic_ ABSL_GUARDED_BY(mu_) = false;
  Membership membership_ ABSL_GUARDED_BY(mu_);
  absl::Duration lease_ ABSL_GUARDED_BY(mu_) = absl::Seconds(10);
  std::map<int, Session> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_SESSIONS_H_
