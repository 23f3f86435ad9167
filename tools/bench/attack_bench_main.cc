// attack_bench: what one client holding the run's token can make a shard
// hold, and whether the shard still serves. Starts a ps_server of the
// default model (one shard) and attacks it the ways a careless or hostile
// client would: push streams held open after a valid header, pulls never
// read, idle connections, and one oversized message. For each it samples
// the shard's resident memory (peak over the attack) and times an honest
// pull afterwards against the same pull before any attack (the reference,
// medians). Prints one line per attack (or one JSON object with --json).

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/model_layout.h"
#include "common/process_tuning.h"
#include "common/temp_dir.h"
#include "proto/service.grpc.pb.h"
#include "tools/bench/bench_util.h"

ABSL_FLAG(std::string, bin_dir, "bazel-bin",
          "Folder holding server/ps_server.");
ABSL_FLAG(int, num_workers, 8,
          "Ranks the attacker pushes and pulls as (and the evaluator's); the "
          "shard has one more, the honest client's.");
ABSL_FLAG(int, push_streams, 2000, "Push streams held open after a header.");
ABSL_FLAG(int, unread_pulls, 1000, "Pulls started and never read.");
ABSL_FLAG(int, idle_connections, 1100, "Connections opened and left idle.");
ABSL_FLAG(int, big_message_mb, 500, "Size of the one oversized message.");
ABSL_FLAG(int, grpc_memory_mb, 1024, "The shard's --grpc_memory_mb.");
ABSL_FLAG(bool, json, false, "Print one JSON object per attack.");
// Internal: the honest client's process (see HonestPullMs).
ABSL_FLAG(std::string, honest_pull, "", "(internal) pull from this address");
ABSL_FLAG(int, honest_rank, 0, "(internal) as this rank");
ABSL_FLAG(std::string, honest_token, "", "(internal) with this token");

namespace monsoon::tools {
namespace {

using ::monsoon::ParameterService;

// The shard's --max_wait_s: short, so that pulls waiting for a version that
// never comes end within the run.
constexpr int kMaxWaitS = 3;

// The shard under attack: a child process, stopped on destruction.
class Shard {
 public:
  ~Shard() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  bool Start(const std::string& bin_dir, int num_workers, int memory_mb,
             const std::string& token_file, const std::string& port_file) {
    std::vector<std::string> args = {
        bin_dir + "/server/ps_server",
        "--listen=127.0.0.1:0",
        absl::StrCat("--port_file=", port_file),
        absl::StrCat("--num_workers=", num_workers),
        absl::StrCat("--grpc_memory_mb=", memory_mb),
        absl::StrCat("--auth_token_file=", token_file),
        absl::StrCat("--max_wait_s=", kMaxWaitS),
        "--log_every_s=0"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) !=
        0) {
      pid_ = -1;
      return false;
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      std::ifstream in(port_file);
      int port = 0;
      if (in >> port && port > 0) {
        address_ = absl::StrCat("127.0.0.1:", port);
        return true;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  // Resident memory in MiB (VmRSS), 0 if unreadable.
  double RssMb() const {
    std::ifstream in(absl::StrCat("/proc/", pid_, "/status"));
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmRSS:", 0) == 0) {
        std::istringstream fields(line.substr(6));
        double kb = 0;
        fields >> kb;
        return kb / 1024.0;
      }
    }
    return 0;
  }

  bool alive() const { return pid_ > 0 && kill(pid_, 0) == 0; }
  const std::string& address() const { return address_; }

 private:
  pid_t pid_ = -1;
  std::string address_;
};

// Samples the shard's resident memory every 10 ms while it lives.
class PeakSampler {
 public:
  explicit PeakSampler(const Shard& shard)
      : shard_(shard), thread_([this] {
          while (!stop_.load()) {
            const double rss = shard_.RssMb();
            double seen = peak_.load();
            while (rss > seen && !peak_.compare_exchange_weak(seen, rss)) {
            }
            absl::SleepFor(absl::Milliseconds(10));
          }
        }) {}
  ~PeakSampler() { Stop(); }
  double Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    return peak_.load();
  }

 private:
  const Shard& shard_;
  std::atomic<bool> stop_{false};
  std::atomic<double> peak_{0};
  std::thread thread_;
};

// A channel of its own (its own connection: the unique argument keeps gRPC
// from sharing one).
std::shared_ptr<grpc::Channel> NewChannel(const std::string& address, int id) {
  grpc::ChannelArguments args;
  args.SetInt("monsoon.attack_channel", id);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   args);
}

void Authorize(grpc::ClientContext* context, const std::string& token) {
  context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
}

// The rank of the honest client: one the attacker does not use (the shard
// has one worker more than the attacker's ranks).
int honest_rank = 0;

// An honest pull of the whole shard, from this process: its time in ms,
// or -1 when it fails.
double PullHereMs(const std::string& address, const std::string& token) {
  auto stub = ParameterService::NewStub(NewChannel(address, -1));
  PullRequest request;
  request.set_worker_rank(honest_rank);
  grpc::ClientContext context;
  Authorize(&context, token);
  const absl::Time start = absl::Now();
  auto reader = stub->Pull(&context, request);
  PullChunk chunk;
  while (reader->Read(&chunk)) {
  }
  if (!reader->Finish().ok()) return -1;
  return absl::ToDoubleMilliseconds(absl::Now() - start);
}

// The shard's counters, or an empty message when the call fails.
StatsResponse ShardStats(const std::string& address, const std::string& token) {
  auto stub = ParameterService::NewStub(NewChannel(address, -3));
  grpc::ClientContext context;
  Authorize(&context, token);
  StatsResponse stats;
  if (!stub->Stats(&context, StatsRequest(), &stats).ok()) return {};
  return stats;
}

// The median of 5 honest pulls, each from a new connection, or -1 if one
// fails.
double MedianPullHereMs(const std::string& address, const std::string& token,
                        int rank) {
  honest_rank = rank;
  std::vector<double> times;
  for (int i = 0; i < 5; ++i) {
    const double ms = PullHereMs(address, token);
    if (ms < 0) return -1;
    times.push_back(ms);
  }
  return Summarize(times).p50;
}

// MedianPullHereMs from a process of its own (this binary again): the
// attacker's thousands of calls share this one's gRPC machinery, which
// would slow an honest pull made here whatever the shard does.
double HonestPullMs(const std::string& address, const std::string& token) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return -1;
  self[n] = '\0';
  const std::string command = absl::StrCat(
      "'", self, "' --honest_pull=", address, " --honest_rank=", honest_rank,
      " --honest_token=", token, " 2>/dev/null");
  FILE* child = popen(command.c_str(), "r");
  if (child == nullptr) return -1;
  double ms = -1;
  if (std::fscanf(child, "%lf", &ms) != 1) ms = -1;
  pclose(child);
  return ms;
}

struct Outcome {
  std::string attack;
  int attempts = 0;
  int refused = 0;  // answered with an error while held
  double rss_before_mb = 0;
  double rss_peak_mb = 0;
  double rss_after_mb = 0;
  double pull_ms = 0;  // honest pulls during the attack (median of 5)
};

// Opens `n` push streams, each with a valid header and a first chunk, as
// ranks 0..workers-1 in turn, holds them, then ends them.
Outcome OpenPushes(const Shard& shard, const std::string& token, int n,
                   int workers, uint64_t shard_size) {
  Outcome out{"push streams held open"};
  out.attempts = n;
  const int64_t rejected_before =
      ShardStats(shard.address(), token).rejected_pushes();
  out.rss_before_mb = shard.RssMb();
  PeakSampler sampler(shard);
  struct Held {
    std::unique_ptr<ParameterService::Stub> stub;
    grpc::ClientContext context;
    PushResponse response;
    std::unique_ptr<grpc::ClientWriter<PushChunk>> writer;
  };
  std::vector<std::unique_ptr<Held>> held;
  std::shared_ptr<grpc::Channel> channel;
  for (int i = 0; i < n; ++i) {
    if (i % 16 == 0) channel = NewChannel(shard.address(), i);
    auto h = std::make_unique<Held>();
    h->stub = ParameterService::NewStub(channel);
    Authorize(&h->context, token);
    h->writer = h->stub->Push(&h->context, &h->response);
    PushChunk chunk;
    PushHeader* header = chunk.mutable_header();
    header->set_worker_rank(i % workers);
    header->set_length(shard_size);
    header->set_samples(1);
    // All of the push but its last 1,024 values: the shard has filled (and
    // so made resident) the push's buffer and waits for the rest.
    chunk.set_data(std::string((shard_size - 1024) * sizeof(float), '\0'));
    h->writer->Write(chunk);
    held.push_back(std::move(h));
  }
  absl::SleepFor(absl::Seconds(1));  // let the shard take them in
  out.pull_ms = HonestPullMs(shard.address(), token);
  // The shard counts the pushes it refused (the client sees their status
  // only once it ends its side).
  out.refused = static_cast<int>(
      ShardStats(shard.address(), token).rejected_pushes() - rejected_before);
  for (auto& h : held) h->context.TryCancel();
  for (auto& h : held) h->writer->Finish();
  out.rss_peak_mb = sampler.Stop();
  out.rss_after_mb = shard.RssMb();
  return out;
}

// Starts `n` pulls as ranks -1..workers-1 in turn and never reads them.
Outcome UnreadPulls(const Shard& shard, const std::string& token, int n,
                    int workers, int64_t min_version) {
  Outcome out{min_version == 0 ? "pulls never read" : "pulls waiting forever"};
  out.attempts = n;
  out.rss_before_mb = shard.RssMb();
  PeakSampler sampler(shard);
  struct Held {
    std::unique_ptr<ParameterService::Stub> stub;
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<PullChunk>> reader;
  };
  std::vector<std::unique_ptr<Held>> held;
  std::shared_ptr<grpc::Channel> channel;
  for (int i = 0; i < n; ++i) {
    if (i % 16 == 0) channel = NewChannel(shard.address(), 100000 + i);
    auto h = std::make_unique<Held>();
    h->stub = ParameterService::NewStub(channel);
    Authorize(&h->context, token);
    PullRequest request;
    request.set_worker_rank(i % (workers + 1) - 1);
    request.set_min_version(min_version);
    h->reader = h->stub->Pull(&h->context, request);
    held.push_back(std::move(h));
  }
  absl::SleepFor(absl::Seconds(1));
  out.pull_ms = HonestPullMs(shard.address(), token);
  // A refused pull has ended at once. A held one has its first chunk
  // waiting, or, waiting for its version, ends when the shard's --max_wait_s
  // (set short here) runs out, answered DEADLINE_EXCEEDED.
  for (auto& h : held) {
    PullChunk chunk;
    if (h->reader->Read(&chunk)) continue;
    if (h->reader->Finish().error_code() ==
        grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++out.refused;
    }
    h.reset();
  }
  for (auto& h : held) {
    if (h != nullptr) h->context.TryCancel();
  }
  for (auto& h : held) {
    if (h != nullptr) h->reader->Finish();
  }
  out.rss_peak_mb = sampler.Stop();
  out.rss_after_mb = shard.RssMb();
  return out;
}

// Opens `n` connections that make no call, then an honest pull.
Outcome IdleConnections(const Shard& shard, const std::string& token, int n) {
  Outcome out{"idle connections"};
  out.attempts = n;
  out.rss_before_mb = shard.RssMb();
  PeakSampler sampler(shard);
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < n; ++i) {
    channels.push_back(NewChannel(shard.address(), 200000 + i));
    if (!channels.back()->WaitForConnected(
            absl::ToChronoTime(absl::Now() + absl::Seconds(5)))) {
      ++out.refused;
    }
  }
  out.pull_ms = HonestPullMs(shard.address(), token);
  channels.clear();
  out.rss_peak_mb = sampler.Stop();
  out.rss_after_mb = shard.RssMb();
  return out;
}

// Sends one push message of `mb` MiB.
Outcome BigMessage(const Shard& shard, const std::string& token, int mb) {
  Outcome out{absl::StrCat("one ", mb, " MiB message")};
  out.attempts = 1;
  out.rss_before_mb = shard.RssMb();
  PeakSampler sampler(shard);
  {
    auto stub = ParameterService::NewStub(NewChannel(shard.address(), -2));
    grpc::ClientContext context;
    Authorize(&context, token);
    PushResponse response;
    auto writer = stub->Push(&context, &response);
    PushChunk chunk;
    chunk.mutable_header()->set_samples(1);
    chunk.set_data(std::string(static_cast<size_t>(mb) << 20, '\0'));
    writer->Write(chunk);
    writer->WritesDone();
    if (!writer->Finish().ok()) ++out.refused;
  }
  out.pull_ms = HonestPullMs(shard.address(), token);
  out.rss_peak_mb = sampler.Stop();
  out.rss_after_mb = shard.RssMb();
  return out;
}

// Starts the shard with its token and port files in `dir` and runs every
// attack on it; the exit status.
int RunAttacks(const std::string& dir) {
  const int workers = absl::GetFlag(FLAGS_num_workers);
  const std::string token = "attack-bench-token-0123456789abcdef";
  const std::string token_file = absl::StrCat(dir, "/token");
  const std::string port_file = absl::StrCat(dir, "/port");
  std::ofstream(token_file) << token;
  Shard shard;
  honest_rank = workers;
  if (!shard.Start(absl::GetFlag(FLAGS_bin_dir), workers + 1,
                   absl::GetFlag(FLAGS_grpc_memory_mb), token_file,
                   port_file)) {
    std::fprintf(stderr,
                 "attack_bench: cannot start %s/server/ps_server (build it "
                 "first, or give --bin_dir)\n",
                 absl::GetFlag(FLAGS_bin_dir).c_str());
    return 1;
  }
  absl::StatusOr<TrainingConfig> config =
      common::ResolveConfigWithData(TrainingConfig());
  if (!config.ok()) return 1;
  const uint64_t shard_size =
      common::ModelLayout::FromConfig(*config).num_params();
  const double reference_ms = HonestPullMs(shard.address(), token);
  const bool json = absl::GetFlag(FLAGS_json);
  if (!json) {
    std::printf(
        "one shard of %llu values (%.1f MiB), %d ranks, --grpc_memory_mb=%d; "
        "honest pull (own process, median of 5) before any attack: %.2f ms\n",
        static_cast<unsigned long long>(shard_size),
        shard_size * 4.0 / (1 << 20), workers,
        absl::GetFlag(FLAGS_grpc_memory_mb), reference_ms);
    std::printf("%-28s %8s %8s %10s %10s %10s %12s %8s\n", "attack", "tries",
                "refused", "rss MiB", "peak MiB", "after MiB", "pull ms",
                "alive");
  }
  const std::vector<std::function<Outcome()>> attacks = {
      [&] {
        return OpenPushes(shard, token, absl::GetFlag(FLAGS_push_streams),
                          workers, shard_size);
      },
      [&] {
        return UnreadPulls(shard, token, absl::GetFlag(FLAGS_unread_pulls),
                           workers, 0);
      },
      [&] {
        return UnreadPulls(shard, token, absl::GetFlag(FLAGS_unread_pulls),
                           workers, int64_t{1} << 40);
      },
      [&] {
        return IdleConnections(shard, token,
                               absl::GetFlag(FLAGS_idle_connections));
      },
      [&] {
        return BigMessage(shard, token, absl::GetFlag(FLAGS_big_message_mb));
      },
  };
  int failures = 0;
  for (const auto& attack : attacks) {
    const Outcome o = attack();
    const bool alive = shard.alive() && o.pull_ms >= 0;
    if (!alive) ++failures;
    if (json) {
      std::printf("%s\n", JsonLine()
                              .Add("attack", o.attack)
                              .Add("attempts", o.attempts)
                              .Add("refused", o.refused)
                              .Add("rss_before_mb", o.rss_before_mb)
                              .Add("rss_peak_mb", o.rss_peak_mb)
                              .Add("rss_after_mb", o.rss_after_mb)
                              .Add("honest_pull_ms", o.pull_ms)
                              .Add("reference_pull_ms", reference_ms)
                              .Add("alive", alive ? 1 : 0)
                              .str()
                              .c_str());
    } else {
      std::printf("%-28s %8d %8d %10.1f %10.1f %10.1f %12.2f %8s\n",
                  o.attack.c_str(), o.attempts, o.refused, o.rss_before_mb,
                  o.rss_peak_mb, o.rss_after_mb, o.pull_ms,
                  alive ? "yes" : "NO");
    }
    std::fflush(stdout);
  }
  return failures == 0 ? 0 : 1;
}

int Main() {
  if (!absl::GetFlag(FLAGS_honest_pull).empty()) {
    std::printf("%f\n", MedianPullHereMs(absl::GetFlag(FLAGS_honest_pull),
                                         absl::GetFlag(FLAGS_honest_token),
                                         absl::GetFlag(FLAGS_honest_rank)));
    return 0;
  }
  absl::StatusOr<std::string> dir = common::MakeTempDir("attack_bench");
  if (!dir.ok()) {
    std::fprintf(stderr, "attack_bench: %s\n",
                 std::string(dir.status().message()).c_str());
    return 1;
  }
  const int status = RunAttacks(*dir);
  std::error_code ignored;
  std::filesystem::remove_all(*dir, ignored);
  return status;
}

}  // namespace
}  // namespace monsoon::tools

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Starts one ps_server (the default model) and attacks it as one client "
      "holding the run's token: push streams held open, pulls never read, "
      "idle connections, one oversized message. Prints, per attack, the "
      "shard's resident memory (before, peak, after) and an honest pull's "
      "time during it against the same pull before any attack.\n\n"
      "  attack_bench --bin_dir=bazel-bin\n"
      "  attack_bench --push_streams=200 --json");
  absl::ParseCommandLine(argc, argv);
  monsoon::common::TuneProcess();
  return monsoon::tools::Main();
}
