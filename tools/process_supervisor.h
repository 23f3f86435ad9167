// ProcessSupervisor: starts child processes, streams their output line by
// line with a role prefix ("[worker 1] ..."), notices their exits, and stops
// them. SIGINT and SIGTERM sent to the supervising process interrupt Pump()
// instead of killing it, so that it can stop its children first; children
// also get SIGTERM if the supervisor dies (PR_SET_PDEATHSIG), so none is
// orphaned.
//
// Construct it in main() before any thread starts: it blocks SIGINT, SIGTERM
// and SIGCHLD (threads started later inherit that) and reads them from a
// signalfd. At most one per process. Not thread-safe.
#ifndef MONSOON_TOOLS_PROCESS_SUPERVISOR_H_
#define MONSOON_TOOLS_PROCESS_SUPERVISOR_H_

#include <sys/types.h>

#include <csignal>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace monsoon::tools {

class ProcessSupervisor {
 public:
  // Prefixed output goes to `out` (not owned), unless a line sink is set.
  explicit ProcessSupervisor(FILE* out = stdout);
  ~ProcessSupervisor();  // stops every child still running
  ProcessSupervisor(const ProcessSupervisor&) = delete;
  ProcessSupervisor& operator=(const ProcessSupervisor&) = delete;

  // Starts argv[0] (a path) with the current environment, less its
  // MONSOON_* variables, plus `env` ("NAME=value" entries). Returns the
  // child's id for the calls below.
  absl::StatusOr<int> Start(const std::string& role,
                            const std::vector<std::string>& argv,
                            const std::vector<std::string>& env = {});

  // Streams output and reaps children until `done()` is true (checked after
  // every event) or `timeout` passes (DEADLINE_EXCEEDED). CANCELLED when
  // SIGINT or SIGTERM arrives.
  absl::Status Pump(const std::function<bool()>& done, absl::Duration timeout);

  bool running(int id) const { return children_[id].running; }
  // Exit status once not running: the exit code, or 128 + signal.
  int exit_code(int id) const { return children_[id].exit_code; }
  const std::string& role(int id) const { return children_[id].role; }
  int size() const { return static_cast<int>(children_.size()); }
  // The command line, as it was started (for logs).
  std::string command_line(int id) const;

  // Receives every complete output line instead of `out` (without prefix).
  using LineSink = std::function<void(int id, const std::string& line)>;
  void set_line_sink(LineSink sink) { sink_ = std::move(sink); }

  void Signal(int id, int sig);
  // Marks `id` as one that StopAll stops only once the others have stopped
  // (the servers, which the others are clients of: stopped first, a worker
  // would ride out their loss and log it).
  void StopAfterTheOthers(int id) { children_[id].stop_last = true; }
  // The signal StopAll sends `id` (SIGTERM unless set).
  void SetStopSignal(int id, int sig) { children_[id].stop_signal = sig; }
  // Each running child's stop signal (SIGTERM unless SetStopSignal), SIGKILL
  // to those still running after `grace`; then all are reaped and their
  // output drained. Those marked StopAfterTheOthers get theirs once the
  // others have stopped (each wave its own `grace`).
  void StopAll(absl::Duration grace);

 private:
  struct Child {
    std::string role;
    std::vector<std::string> argv;
    pid_t pid = -1;
    int out_fd = -1;  // read end of the child's stdout+stderr pipe
    std::string partial;
    bool running = false;
    int exit_code = -1;
    bool stop_last = false;  // StopAfterTheOthers
    int stop_signal = SIGTERM;  // SetStopSignal
  };
  // StopAll's wave: the running children whose stop_last is `last`.
  void StopWave(bool last, absl::Duration grace);
  void ReadOutput(Child& child);
  void Reap();
  void PrintLine(const Child& child, const std::string& line);

  FILE* const out_;
  LineSink sink_;
  int signal_fd_ = -1;
  std::vector<Child> children_;
};

// Runs argv[0] (a path) to completion with an empty signal mask (the
// supervisor's mask would otherwise be inherited) and returns its exit
// status (128 + signal if killed). With `output`, its stdout and stderr are
// captured there; without, they go to this process's. INTERNAL if it cannot
// be started.
absl::StatusOr<int> RunCommand(const std::vector<std::string>& argv,
                               std::string* output = nullptr);

}  // namespace monsoon::tools

#endif  // MONSOON_TOOLS_PROCESS_SUPERVISOR_H_
