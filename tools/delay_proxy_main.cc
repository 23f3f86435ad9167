// delay_proxy: forwards TCP connections from --listen to --target, holding
// every byte for --delay_ms in each direction (see tools/delay_proxy.h).
// The launcher runs one per worker and server on emulated links where the
// kernel has no netem qdisc; it stops on SIGTERM or SIGINT.
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/daemon.h"
#include "common/log.h"
#include "common/termination.h"
#include "tools/delay_proxy.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "IPv4 HOST:PORT to listen on (port 0: any free one).");
ABSL_FLAG(std::string, target, "", "IPv4 HOST:PORT to forward to.");
ABSL_FLAG(double, delay_ms, 0,
          "Milliseconds every byte is held, in each direction (0 to 10000).");
ABSL_FLAG(std::string, port_file, "",
          "If set, write the port listened on here once listening.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Forwards TCP connections from --listen to --target, delaying both "
      "directions by --delay_ms.\n\n  delay_proxy --target=10.0.0.1:5000 "
      "--delay_ms=2 --port_file=proxy.port");
  absl::ParseCommandLine(argc, argv);
  monsoon::common::TerminationWatcher termination;
  auto proxy = monsoon::tools::DelayProxy::Start(
      absl::GetFlag(FLAGS_listen), absl::GetFlag(FLAGS_target),
      absl::Microseconds(1000 * absl::GetFlag(FLAGS_delay_ms)));
  if (!proxy.ok()) {
    return monsoon::common::Fail(
        "delay_proxy", monsoon::common::kExitConfigError, proxy.status());
  }
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    // Written whole, then renamed: a reader never sees half a port.
    if (!monsoon::common::WriteFileAtomically(
             path, absl::StrCat((*proxy)->port(), "\n"))
             .ok()) {
      monsoon::common::LogError("delay_proxy: cannot write --port_file=%s",
                                path);
      return monsoon::common::kExitFailure;
    }
  }
  monsoon::common::Log("delay_proxy: %s -> %s, %g ms each way, on port %d",
                       absl::GetFlag(FLAGS_listen), absl::GetFlag(FLAGS_target),
                       absl::GetFlag(FLAGS_delay_ms), (*proxy)->port());
  termination.terminated().WaitForNotification();
  return monsoon::common::kExitOk;
}
