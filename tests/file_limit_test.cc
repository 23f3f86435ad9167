// A ps_server process whose limit on open files is 1,024 (a container's
// usual --ulimit nofile=1024:1024) is reached by more idle connections than
// that, which then close: it must serve again at once. gRPC 1.51's own
// listener stopped accepting for good at the first EMFILE
// (common/accept_guard.h).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/service.grpc.pb.h"
#include "tests/test_util.h"
#include "worker/ps_client.h"

namespace monsoon {
namespace {

using ::monsoon::testutil::FreePort;
using ::testing::HasSubstr;

constexpr int kFileLimit = 1024;
constexpr int kConnections = 1100;

std::string Runfile(const std::string& path) {
  const char* dir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(dir != nullptr ? dir : ".", "/monsoon/", path);
}

// A connected TCP socket to 127.0.0.1:port, or -1.
int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
      0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

int64_t OpenFilesOf(pid_t pid) {
  std::error_code error;
  int64_t count = 0;
  for (auto it = std::filesystem::directory_iterator(
           absl::StrCat("/proc/", pid, "/fd"), error);
       !error && it != std::filesystem::directory_iterator();
       it.increment(error)) {
    ++count;
  }
  return count;
}

// GET /metrics from 127.0.0.1:port; empty on failure.
std::string Scrape(int port) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  const std::string request =
      "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::write(fd, request.data(), request.size()) !=
      static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return "";
  }
  std::string response;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof(buffer))) > 0)
    response.append(buffer, n);
  ::close(fd);
  return response;
}

class FileLimitTest : public testing::Test {
 protected:
  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    for (int fd : held_) ::close(fd);
  }

  // Starts ps_server with a hard limit of kFileLimit open files; returns
  // its port, or 0 (with a failure) if it did not come up.
  int StartServer(int metrics_port) {
    const std::string dir = testutil::FreshDir("file_limit");
    const std::string config = dir + "/config.txtpb";
    std::ofstream(config) << "layer_sizes: [6, 5, 3] mode: DOWNPOUR";
    port_file_ = dir + "/port";
    log_ = dir + "/ps_server.log";
    const std::vector<std::string> args = {
        Runfile("server/ps_server"),
        "--config=" + config,
        "--listen=127.0.0.1:0",
        "--port_file=" + port_file_,
        absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port),
        "--num_workers=1",
        "--checkpoint_interval_s=0"};
    pid_ = ::fork();
    if (pid_ == 0) {
      rlimit files = {kFileLimit, kFileLimit};
      ::setrlimit(RLIMIT_NOFILE, &files);
      const int out = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(out, 1);
      ::dup2(out, 2);
      std::vector<char*> argv;
      for (const std::string& arg : args)
        argv.push_back(const_cast<char*>(arg.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      std::ifstream in(port_file_);
      int port = 0;
      if (in >> port && port > 0) return port;
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        ADD_FAILURE() << "ps_server exited at start: " << Log();
        return 0;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    ADD_FAILURE() << "ps_server did not write its port in 60 s: " << Log();
    return 0;
  }

  std::string Log() const {
    std::ifstream in(log_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  pid_t pid_ = -1;
  std::string port_file_;
  std::string log_;
  std::vector<int> held_;
};

TEST_F(FileLimitTest, AShardServesAgainOnceConnectionsBeyondItsLimitClose) {
  // This process holds the connections: it needs more than the server.
  rlimit own;
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &own), 0);
  ASSERT_GE(own.rlim_max, static_cast<rlim_t>(kConnections + 200))
      << "this test needs a hard limit above " << kConnections + 200;
  own.rlim_cur = own.rlim_max;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &own), 0);

  const int metrics_port = FreePort();
  const int port = StartServer(metrics_port);
  ASSERT_GT(port, 0);
  for (int i = 0; i < kConnections; ++i) {
    const int fd = Connect(port);
    if (fd >= 0) held_.push_back(fd);
  }
  // The kernel completes every handshake; the server accepts as far as its
  // limit lets it, and sheds the rest. Wait until it has taken what it can.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (OpenFilesOf(pid_) < kFileLimit - 100 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GE(OpenFilesOf(pid_), kFileLimit - 100);
  EXPECT_LE(OpenFilesOf(pid_), kFileLimit);
  for (int fd : held_) ::close(fd);
  held_.clear();

  // Served again within seconds.
  TrainingConfig config;
  auto stub = ParameterService::NewStub(
      worker::MakeChannel(absl::StrCat("127.0.0.1:", port)));
  grpc::Status status;
  StatsResponse stats;
  const absl::Time start = absl::Now();
  do {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    context.set_wait_for_ready(true);
    status = stub->Stats(&context, StatsRequest(), &stats);
  } while (!status.ok() && absl::Now() - start < absl::Seconds(10));
  ASSERT_TRUE(status.ok()) << status.error_message() << "\n" << Log();
  EXPECT_EQ(stats.shard(), 0);

  // Its metrics show the limit, and that connections were shed.
  const std::string metrics = Scrape(metrics_port);
  EXPECT_THAT(metrics, HasSubstr(absl::StrCat("process_max_fds ", kFileLimit)));
  EXPECT_THAT(metrics, HasSubstr("process_open_fds "));
  EXPECT_THAT(metrics, HasSubstr("monsoon_connections_shed_total "));
  EXPECT_THAT(metrics,
              ::testing::Not(HasSubstr("monsoon_connections_shed_total 0\n")));
  EXPECT_THAT(Log(), ::testing::Not(HasSubstr("Failed accept4")));
}

}  // namespace
}  // namespace monsoon
