// ProcessSupervisor: a run's children stopped in two waves, the servers'
// clients first, each with its stop signal.
#include "tools/process_supervisor.h"

#include <algorithm>
#include <csignal>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/temp_dir.h"
#include "gtest/gtest.h"

namespace monsoon::tools {
namespace {

// A shell child that says "up" once its trap is set, and on SIGTERM runs
// `on_term`, then exits 0.
std::vector<std::string> Child(const std::string& on_term) {
  return {"/bin/sh", "-c",
          absl::StrCat("trap '", on_term,
                       "; exit 0' TERM; echo up; while :; do sleep 0.02; done")};
}

// Collects the children's lines as "ROLE: LINE" in `lines`, and counts
// their "up" lines in `up`.
void CollectLines(ProcessSupervisor& supervisor,
                  std::vector<std::string>* lines, int* up) {
  supervisor.set_line_sink(
      [&supervisor, lines, up](int id, const std::string& line) {
        if (line == "up") {
          ++*up;
        } else {
          lines->push_back(absl::StrCat(supervisor.role(id), ": ", line));
        }
      });
}

TEST(ProcessSupervisorTest, StopsTheServersOnlyOnceTheirClientsHaveStopped) {
  absl::StatusOr<std::string> dir = common::MakeTempDir("supervisor");
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::string alive = *dir + "/server-alive";
  ProcessSupervisor supervisor;
  std::vector<std::string> lines;
  int up = 0;
  CollectLines(supervisor, &lines, &up);
  // The server's file exists until it gets SIGTERM; each client says
  // whether it still did when the client got its own.
  ASSERT_TRUE(std::ofstream(alive).good());
  absl::StatusOr<int> server = supervisor.Start(
      "server", Child(absl::StrCat("rm ", alive, "; echo stopped")));
  ASSERT_TRUE(server.ok()) << server.status();
  supervisor.StopAfterTheOthers(*server);
  for (int c = 0; c < 2; ++c) {
    absl::StatusOr<int> client = supervisor.Start(
        absl::StrCat("client ", c),
        Child(absl::StrCat("test -e ", alive,
                           " && echo server up || echo server gone")));
    ASSERT_TRUE(client.ok()) << client.status();
  }
  // Each has set its trap.
  ASSERT_TRUE(
      supervisor.Pump([&] { return up == 3; }, absl::Seconds(30)).ok());

  supervisor.StopAll(absl::Seconds(30));

  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[2], "server: stopped");
  std::sort(lines.begin(), lines.begin() + 2);
  EXPECT_EQ(lines[0], "client 0: server up");
  EXPECT_EQ(lines[1], "client 1: server up");
  for (int id = 0; id < supervisor.size(); ++id) {
    EXPECT_FALSE(supervisor.running(id));
    EXPECT_EQ(supervisor.exit_code(id), 0) << supervisor.role(id);
  }
}

// Starts two children that each print which signal came (and exit 0 on
// either), "plain" stopped with SIGTERM and "evaluator" with SIGINT, stops
// them, and returns what they printed, sorted.
std::vector<std::string> StopAPlainChildAndAnEvaluator() {
  ProcessSupervisor supervisor;
  std::vector<std::string> lines;
  int up = 0;
  CollectLines(supervisor, &lines, &up);
  const std::vector<std::string> argv = {
      "/bin/sh", "-c",
      "trap 'echo TERM; exit 0' TERM; trap 'echo INT; exit 0' INT; echo up; "
      "while :; do sleep 0.02; done"};
  absl::StatusOr<int> plain = supervisor.Start("plain", argv);
  EXPECT_TRUE(plain.ok()) << plain.status();
  absl::StatusOr<int> evaluator = supervisor.Start("evaluator", argv);
  EXPECT_TRUE(evaluator.ok()) << evaluator.status();
  if (!plain.ok() || !evaluator.ok()) return lines;
  supervisor.SetStopSignal(*evaluator, SIGINT);
  EXPECT_TRUE(supervisor.Pump([&] { return up == 2; }, absl::Seconds(30)).ok());
  supervisor.StopAll(absl::Seconds(30));
  std::sort(lines.begin(), lines.end());
  return lines;
}

TEST(ProcessSupervisorTest, SendsEachChildItsStopSignal) {
  EXPECT_EQ(StopAPlainChildAndAnEvaluator(),
            (std::vector<std::string>{"evaluator: INT", "plain: TERM"}));
}

// A launcher started with `&` from a script ignores SIGINT (and a child
// inherits what its parent ignores, which a shell then cannot trap): the
// children still get their stop signals.
TEST(ProcessSupervisorTest, StopsChildrenWithSignalsTheSupervisorIgnores) {
  struct sigaction ignore = {};
  ignore.sa_handler = SIG_IGN;
  struct sigaction before_int = {};
  struct sigaction before_term = {};
  ASSERT_EQ(sigaction(SIGINT, &ignore, &before_int), 0);
  ASSERT_EQ(sigaction(SIGTERM, &ignore, &before_term), 0);
  const std::vector<std::string> lines = StopAPlainChildAndAnEvaluator();
  sigaction(SIGINT, &before_int, nullptr);
  sigaction(SIGTERM, &before_term, nullptr);
  EXPECT_EQ(lines, (std::vector<std::string>{"evaluator: INT", "plain: TERM"}));
}

}  // namespace
}  // namespace monsoon::tools
