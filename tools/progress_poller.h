// ProgressPoller: how far a local cluster's run has come (RunProgressSample),
// read from its daemons on a thread of its own, for RunLocalCluster's
// on_progress. Private to the local_cluster library.
#ifndef MONSOON_TOOLS_PROGRESS_POLLER_H_
#define MONSOON_TOOLS_PROGRESS_POLLER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "proto/config.pb.h"
#include "tools/local_cluster.h"
#include "worker/ps_client.h"

namespace monsoon::tools {

// The examples one epoch of every worker trains: each worker does the
// smallest partition's whole batches (worker/training_loop.h). Reads only
// the training labels' header and bytes; 0 when they cannot be read.
int64_t ExamplesPerEpoch(const TrainingConfig& config, int workers);

// Reads a run's progress from its daemons about once a second on a thread
// of its own (started by the constructor, joined by the destructor): the
// shards' Stats through a client of its own, and the evaluator's curve
// file. A shard that does not answer holds up only this thread, never the
// supervisor's loop. Take() is safe from any one other thread.
class ProgressPoller {
 public:
  ProgressPoller(worker::PsClientOptions client_options, std::string curve_path,
                 absl::Time start, int64_t examples_per_epoch, int epochs);
  ~ProgressPoller();
  ProgressPoller(const ProgressPoller&) = delete;
  ProgressPoller& operator=(const ProgressPoller&) = delete;

  // The newest sample since the last call, if there is one.
  std::optional<RunProgressSample> Take();

 private:
  void Loop();
  // The shards' figures into `sample`: its samples, version, rate and
  // epoch. *last_stats and *have_stats: when the figures were last read.
  void ReadStats(worker::PsClient* client, RunProgressSample* sample,
                 absl::Time* last_stats, bool* have_stats) const;
  // The evaluator's latest point into `sample`, if the curve file has one
  // and at least *curve_points points (then its count).
  void ReadCurve(RunProgressSample* sample, int* curve_points) const;

  // Constant after construction.
  const worker::PsClientOptions client_options_;
  const std::string curve_path_;
  const absl::Time start_;
  const int64_t examples_per_epoch_;
  const int epochs_;

  absl::Notification stop_;
  absl::Mutex mu_;
  std::optional<RunProgressSample> latest_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: it uses the members above
};

}  // namespace monsoon::tools

#endif  // MONSOON_TOOLS_PROGRESS_POLLER_H_
