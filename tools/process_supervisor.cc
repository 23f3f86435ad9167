#include "tools/process_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"

extern char** environ;

namespace monsoon::tools {
namespace {

// Signals a child gets with their default action, whatever the supervisor
// ignores (a shell resets them so for the commands it starts).
constexpr int kDefaultedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE};

sigset_t SupervisedSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGCHLD);
  return set;
}

}  // namespace

ProcessSupervisor::ProcessSupervisor(FILE* out) : out_(out) {
  sigset_t set = SupervisedSignals();
  sigprocmask(SIG_BLOCK, &set, nullptr);
  signal_fd_ = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
}

ProcessSupervisor::~ProcessSupervisor() {
  StopAll(absl::Seconds(5));
  if (signal_fd_ >= 0) close(signal_fd_);
  sigset_t set = SupervisedSignals();
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
}

std::string ProcessSupervisor::command_line(int id) const {
  return absl::StrJoin(children_[id].argv, " ");
}

absl::StatusOr<int> ProcessSupervisor::Start(
    const std::string& role, const std::vector<std::string>& argv,
    const std::vector<std::string>& env) {
  if (access(argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(
        "cannot run '", argv[0], "' for ", role, ": ", std::strerror(errno),
        " (build it first, or point --bin_dir at the built binaries)"));
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  // Everything the child needs, prepared before fork: after it, only
  // async-signal-safe calls.
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  // Not this process's own MONSOON_* settings: every daemon setting goes
  // in as a flag or through `env`, so that a launcher's environment cannot
  // change a run behind its back.
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "MONSOON_", 8) != 0) env_strings.push_back(*e);
  }
  env_strings.insert(env_strings.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (const std::string& e : env_strings) {
    envp.push_back(const_cast<char*>(e.c_str()));
  }
  envp.push_back(nullptr);
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // Own process group: a terminal's Ctrl-C reaches only the supervisor,
    // which then stops the children in order.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);  // the supervisor already died
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    // The stop signals as a shell would give a command, whatever this
    // process ignores: a launcher started with `&` from a script ignores
    // SIGINT, and a child that inherited that could not be stopped with it.
    struct sigaction default_action = {};
    default_action.sa_handler = SIG_DFL;
    for (int signal : kDefaultedSignals) {
      sigaction(signal, &default_action, nullptr);
    }
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  close(fds[1]);
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  Child child;
  child.role = role;
  child.argv = argv;
  child.pid = pid;
  child.out_fd = fds[0];
  child.running = true;
  children_.push_back(std::move(child));
  return static_cast<int>(children_.size()) - 1;
}

void ProcessSupervisor::PrintLine(const Child& child, const std::string& line) {
  if (sink_) {
    sink_(static_cast<int>(&child - children_.data()), line);
    return;
  }
  // A JSON line stays one JSON object (its message names who speaks).
  if (common::CurrentLogFormat() == common::LogFormat::kJson && !line.empty() &&
      line.front() == '{') {
    std::fprintf(out_, "%s\n", line.c_str());
  } else {
    std::fprintf(out_, "[%s] %s\n", child.role.c_str(), line.c_str());
  }
  std::fflush(out_);
}

void ProcessSupervisor::ReadOutput(Child& child) {
  char buffer[4096];
  while (child.out_fd >= 0) {
    const ssize_t n = read(child.out_fd, buffer, sizeof(buffer));
    if (n > 0) {
      child.partial.append(buffer, static_cast<size_t>(n));
      size_t newline;
      while ((newline = child.partial.find('\n')) != std::string::npos) {
        PrintLine(child, child.partial.substr(0, newline));
        child.partial.erase(0, newline + 1);
      }
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    // EOF (or an error): the child and everything it started are gone.
    if (!child.partial.empty()) PrintLine(child, child.partial);
    child.partial.clear();
    close(child.out_fd);
    child.out_fd = -1;
  }
}

void ProcessSupervisor::Reap() {
  for (Child& child : children_) {
    if (!child.running) continue;
    int status = 0;
    if (waitpid(child.pid, &status, WNOHANG) != child.pid) continue;
    child.running = false;
    child.exit_code =
        WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    ReadOutput(child);
  }
}

absl::Status ProcessSupervisor::Pump(const std::function<bool()>& done,
                                     absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError("timed out");
    }
    std::vector<pollfd> fds;
    std::vector<Child*> owners;
    fds.push_back({signal_fd_, POLLIN, 0});
    owners.push_back(nullptr);
    for (Child& child : children_) {
      if (child.out_fd >= 0) {
        fds.push_back({child.out_fd, POLLIN, 0});
        owners.push_back(&child);
      }
    }
    // Blocks until a child writes, a signal arrives (SIGCHLD included) or
    // 200 ms pass, so that a SIGCHLD merged with another is not lost and a
    // time-based done() is checked. `left` may be infinite: clamp it before
    // converting, or the sum overflows into a zero timeout and this spins.
    const int wait_ms = static_cast<int>(std::clamp<int64_t>(
        absl::ToInt64Milliseconds(std::min(left, absl::Milliseconds(200))) + 1,
        1, 200));
    poll(fds.data(), fds.size(), wait_ms);
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) ReadOutput(*owners[i]);
    }
    bool interrupted = false;
    signalfd_siginfo info;
    while (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
      if (info.ssi_signo == SIGINT || info.ssi_signo == SIGTERM) {
        interrupted = true;
      }
    }
    Reap();
    if (interrupted) return absl::CancelledError("interrupted by a signal");
  }
  return absl::OkStatus();
}

void ProcessSupervisor::Signal(int id, int sig) {
  if (children_[id].running) kill(children_[id].pid, sig);
}

void ProcessSupervisor::StopAll(absl::Duration grace) {
  StopWave(/*last=*/false, grace);
  StopWave(/*last=*/true, grace);
}

void ProcessSupervisor::StopWave(bool last, absl::Duration grace) {
  bool any = false;
  for (int id = 0; id < size(); ++id) {
    if (children_[id].running && children_[id].stop_last == last) {
      Signal(id, children_[id].stop_signal);
      any = true;
    }
  }
  if (!any) return;
  auto all_stopped = [this, last] {
    for (const Child& child : children_) {
      if (child.running && child.stop_last == last) return false;
    }
    return true;
  };
  if (!Pump(all_stopped, grace).ok()) {
    for (int id = 0; id < size(); ++id) {
      if (children_[id].stop_last == last) Signal(id, SIGKILL);
    }
    // SIGKILL cannot be resisted; a few tries cover interrupts meanwhile.
    for (int i = 0; i < 5 && !all_stopped(); ++i) {
      Pump(all_stopped, absl::Seconds(2)).IgnoreError();
    }
  }
}

absl::StatusOr<int> RunCommand(const std::vector<std::string>& argv,
                               std::string* output) {
  int fds[2] = {-1, -1};
  if (output != nullptr && pipe(fds) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (output != nullptr) {
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
  }
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);
  sigset_t defaulted;
  sigemptyset(&defaulted);
  for (int signal : kDefaultedSignals) sigaddset(&defaulted, signal);
  posix_spawnattr_setsigdefault(&attributes, &defaulted);
  posix_spawnattr_setflags(&attributes,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  const int error =
      posix_spawn(&pid, args[0], &actions, &attributes, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (output != nullptr) {
    close(fds[1]);
    output->clear();
    char buffer[1024];
    ssize_t n;
    while ((n = read(fds[0], buffer, sizeof(buffer))) > 0) {
      output->append(buffer, static_cast<size_t>(n));
    }
    close(fds[0]);
  }
  if (error != 0) {
    return absl::InternalError(
        absl::StrCat("cannot run ", argv[0], ": ", std::strerror(error)));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace monsoon::tools
