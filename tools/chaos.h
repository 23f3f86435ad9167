// Fault injection for local clusters: the --chaos specification of
// launch_local and compare_modes, parsed into the faults a run injects.
//
//   kill:server1@10s           SIGKILL server 1 ten seconds into training
//   kill:worker0@20s           SIGKILL worker 0 at 20 s
//   stop:server0@5s+10s        SIGSTOP server 0 at 5 s, SIGCONT at 15 s
//   add:worker@10s             elastic runs: start a worker of a new rank
//   remove:worker1@20s         elastic runs: worker 1 leaves (SIGTERM: it
//                              ends its step and leaves cleanly)
//
// Times count from the start of training: the first push a shard applied
// (in mode allreduce, whose shards take none, the workers' start). A fault
// list is comma-separated. Stateless functions; thread-safe.
#ifndef MONSOON_TOOLS_CHAOS_H_
#define MONSOON_TOOLS_CHAOS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace monsoon::tools {

struct Fault {
  enum class Kind { kKill, kStop, kAdd, kRemove };
  Kind kind = Kind::kKill;
  bool server = true;  // a server (shard), else a worker
  int index = 0;       // the shard or the worker's rank; kAdd: -1
  double at_s = 0;     // from the start of training
  double for_s = 0;    // kStop: how long the process stays stopped
  std::string text;    // as written, e.g. "stop:server0@5s+10s"

  // "server 0", "worker 1".
  std::string target() const;
};

// The faults of `spec` in time order. INVALID_ARGUMENT naming the part that
// is wrong: an unknown action or target, a server or worker beyond the
// run's counts, a negative or missing time, a stop without a duration, an
// add or a remove in a run that is not `elastic`, or one that takes the
// run's last worker away (a remove, or in an elastic run a kill: a killed
// worker is not started again). `workers` counts the ranks an elastic run
// starts with; its adds take the ranks after them.
absl::StatusOr<std::vector<Fault>> ParseChaos(absl::string_view spec,
                                              int servers, int workers,
                                              bool elastic = false);

// The ranks an elastic run needs: its first `workers` and one per add.
int RanksFor(const std::vector<Fault>& faults, int workers);

// --workers of the launchers: a count, or in an elastic run MIN:MAX, the
// workers started and the most ranks the run may have (every daemon's
// --num_workers), which leaves room for MAX - MIN to join, by an add fault
// or started by hand.
struct WorkerCount {
  int start = 0;
  int max = 0;  // 0: start plus the chaos's adds
};

// INVALID_ARGUMENT naming what is wrong: not a count or MIN:MAX, a count
// outside [1, 256], MAX below MIN, MIN:MAX without `elastic`.
absl::StatusOr<WorkerCount> ParseWorkerCount(absl::string_view text,
                                             bool elastic);

// The ranks of a run that starts `count` and injects `faults`: count.max
// if set, else RanksFor. INVALID_ARGUMENT when the adds need more ranks
// than count.max.
absl::StatusOr<int> RanksFor(const std::vector<Fault>& faults,
                             const WorkerCount& count);

}  // namespace monsoon::tools

#endif  // MONSOON_TOOLS_CHAOS_H_
