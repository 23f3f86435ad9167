#include "tools/script_workers.h"

#include <signal.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/config.h"

namespace monsoon::tools {
namespace {

// The settings monsoon.torch reads (worker/python/monsoon_ext.cc's flags).
constexpr const char* kScriptSettings[] = {
    "servers",   "rank",       "num_workers",      "config",   "report_out",
    "curve_out", "interval_s", "auth_token_file",  "tls_cert", "tls_key",
    "tls_ca",    "session",    "replaces_session",
};

bool IsScriptSetting(absl::string_view name) {
  for (const char* setting : kScriptSettings) {
    if (name == setting) return true;
  }
  return false;
}

}  // namespace

std::vector<std::string> ScriptArgv(const std::string& command,
                                    const std::vector<std::string>& daemon_argv,
                                    std::vector<std::string>* env) {
  for (size_t i = 1; i < daemon_argv.size(); ++i) {
    absl::string_view flag = daemon_argv[i];
    if (!absl::ConsumePrefix(&flag, "--")) continue;
    const size_t equals = flag.find('=');
    if (equals == absl::string_view::npos) continue;
    const absl::string_view name = flag.substr(0, equals);
    if (!IsScriptSetting(name)) continue;
    env->push_back(absl::StrCat("MONSOON_", absl::AsciiStrToUpper(name), "=",
                                flag.substr(equals + 1)));
  }
  // exec: the script itself is the process the launcher signals (dash
  // would otherwise stay its parent and die of a SIGTERM meant for it).
  return {"/bin/sh", "-c", "exec " + command};
}

absl::StatusOr<TrainingConfig> ExportScriptLayout(
    const std::string& command, const TrainingConfig& base,
    const std::string& work_dir, ProcessSupervisor* supervisor,
    absl::Duration timeout) {
  // The script's model replaces Monsoon's: the base keeps the mode, rates
  // and the rest, not a model.
  TrainingConfig without_model = base;
  without_model.clear_model();
  without_model.clear_layers();
  without_model.clear_layer_sizes();
  without_model.clear_input_shape();
  without_model.clear_num_classes();
  without_model.clear_tensors();
  without_model.clear_initial_weights();
  // A preset's initialization is its own layers' (lenet's zero output
  // layer); a script's model starts from its own rank 0's weights.
  without_model.clear_output_init();
  const std::string base_path = work_dir + "/script-base.config";
  const std::string layout_path = work_dir + "/script-layout.config";
  {
    std::ofstream out(base_path);
    out << common::ConfigToText(without_model);
    if (!out.flush()) {
      return absl::InternalError(absl::StrCat("cannot write ", base_path));
    }
  }
  std::remove(layout_path.c_str());
  absl::StatusOr<int> id = supervisor->Start(
      "layout", {"/bin/sh", "-c", "exec " + command},
      {"MONSOON_EXPORT_LAYOUT=" + layout_path, "MONSOON_CONFIG=" + base_path,
       "MONSOON_RANK=0", "MONSOON_NUM_WORKERS=1"});
  if (!id.ok()) return id.status();
  const absl::Status waited =
      supervisor->Pump([&] { return !supervisor->running(*id); }, timeout);
  if (!waited.ok()) {
    supervisor->Signal(*id, SIGKILL);
    return absl::FailedPreconditionError(absl::StrCat(
        "--worker_cmd did not write its model's layout within ",
        absl::FormatDuration(timeout), " (", waited.ToString(),
        "): a script started with MONSOON_EXPORT_LAYOUT must reach "
        "monsoon.torch.DistributedOptimizer before loading data or training"));
  }
  if (supervisor->exit_code(*id) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--worker_cmd exited with code ", supervisor->exit_code(*id),
        " when asked for its model's layout (its lines above, prefixed "
        "[layout], say why); command: ",
        command));
  }
  std::ifstream written(layout_path);
  if (!written) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--worker_cmd exited without writing its model's layout to ",
        layout_path,
        ": the script must call monsoon.torch.init() and make a "
        "monsoon.torch.DistributedOptimizer (which writes it and exits when "
        "MONSOON_EXPORT_LAYOUT is set)"));
  }
  return common::LoadResolvedConfig(layout_path);
}

}  // namespace monsoon::tools
