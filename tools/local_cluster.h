// RunLocalCluster: S ps_server shards, W ps_worker replicas and one
// ps_evaluator as local processes on loopback, supervised until training
// ends; then the run's metrics. Used by launch_local.
#ifndef MONSOON_TOOLS_LOCAL_CLUSTER_H_
#define MONSOON_TOOLS_LOCAL_CLUSTER_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/config.pb.h"
#include "tools/metrics.h"
#include "tools/process_supervisor.h"

namespace monsoon::tools {

struct LocalClusterOptions {
  TrainingConfig config;  // resolved
  int servers = 2;
  int workers = 2;
  // Folder with server/ps_server, worker/ps_worker, worker/ps_evaluator.
  std::string bin_dir;
  // Where the config, port files and the curve are written (must exist).
  std::string work_dir;
  double eval_interval_s = 2;
  std::string device = "cpu";
  // Seconds a server may take to start listening.
  double start_timeout_s = 30;
};

// Runs the cluster to the end. CANCELLED on Ctrl-C, after stopping every
// process; INTERNAL naming the process when one fails. `supervisor` must be
// the process's only one, constructed before any thread started.
absl::StatusOr<RunMetrics> RunLocalCluster(const LocalClusterOptions& options,
                                           ProcessSupervisor* supervisor);

}  // namespace monsoon::tools

#endif  // MONSOON_TOOLS_LOCAL_CLUSTER_H_
