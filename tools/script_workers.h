// A training script (a PyTorch script using the monsoon package) in place
// of ps_worker and ps_evaluator: launch_local and compare_modes
// --worker_cmd. The script reads its settings from MONSOON_* variables
// (worker/python/monsoon/torch.py), so a daemon's flags become its
// environment; the run's model is the script's, whose layout the script
// writes when started with MONSOON_EXPORT_LAYOUT. Stateless functions.
#ifndef MONSOON_TOOLS_SCRIPT_WORKERS_H_
#define MONSOON_TOOLS_SCRIPT_WORKERS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/config.pb.h"
#include "tools/process_supervisor.h"

namespace monsoon::tools {

// The run's config for the script's model: `base` without a model of its
// own is written to WORK_DIR/script-base.config, `command` runs once (under
// `supervisor`, as "layout") with MONSOON_CONFIG naming it and
// MONSOON_EXPORT_LAYOUT=WORK_DIR/script-layout.config, and the config it
// wrote there (the model's parameters as `tensors`, its weights as
// `initial_weights`) is loaded and resolved. FAILED_PRECONDITION, saying
// what to do, when the script exits nonzero, writes nothing (it never made
// a monsoon.torch.DistributedOptimizer) or takes longer than `timeout`.
absl::StatusOr<TrainingConfig> ExportScriptLayout(
    const std::string& command, const TrainingConfig& base,
    const std::string& work_dir, ProcessSupervisor* supervisor,
    absl::Duration timeout);

// `command` (one command, which /bin/sh execs, so that signals reach it:
// not a list such as `cd dir && ...`) in place of a daemon started as
// `daemon_argv`
// (the program, then --name=value flags): the argv to start, with the
// flags the monsoon package reads appended to *env as MONSOON_NAME=value
// (servers, rank, num_workers, config, report_out, curve_out, interval_s,
// auth_token_file, tls_cert, tls_key, tls_ca); the others (the C++
// daemons' own, such as --device and --metrics_listen) are dropped.
std::vector<std::string> ScriptArgv(const std::string& command,
                                    const std::vector<std::string>& daemon_argv,
                                    std::vector<std::string>* env);

}  // namespace monsoon::tools

#endif  // MONSOON_TOOLS_SCRIPT_WORKERS_H_
