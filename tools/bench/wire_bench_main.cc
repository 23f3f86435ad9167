// wire_bench: Monsoon's push and pull between one client and one shard over
// loopback gRPC, against a raw gRPC stream of the same bytes (raw_grpc.h:
// a minimal service in this binary, no Monsoon code on its path), measured
// in the same run, interleaved repetition by repetition.
//
// Cases, for each size (the tensor's float32 bytes):
//   push_float32_<N>MiB    one push of the tensor (the shard decodes,
//                          validates and applies it)
//   push_onebit_<N>MiB     the same tensor 1-bit quantized with error
//                          feedback on the client; the reference moves the
//                          same (1/32-size) bytes
//   pull_float32_<N>MiB    one pull of the shard's weights
//   pushpull_float32_<N>MiB  a push and the pull of the version it makes
//                          (a sync step's exchange)
//   sparse_push_d<D>_b<B>  the row gradients of B ids drawn at random from
//                          a table of --sparse_rows rows of D values
//                          (PsClient.SparsePush; rows made on first push)
//   sparse_pull_d<D>_b<B>  the rows of B such ids (PsClient.SparsePull)
// A sparse case's reference moves the same serialized bytes; each row also
// says how many times fewer bytes it moves than a dense push of the whole
// table (rows x D float32 values). A dense case's "update us" is the mean
// time per repetition the shard spent writing the update into its weights
// (the rule's pass; none for a pull): in a push-pull nothing overlaps it.
//
//   bazel build //tools/bench:wire_bench
//   bazel-bin/tools/bench/wire_bench                 # table
//   bazel-bin/tools/bench/wire_bench --json          # one object per case
//
// Exit codes: 0 after a report, 2 for a bad flag, 1 for any other failure.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/process_tuning.h"
#include "common/temp_dir.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/monsoon_wire.h"
#include "tools/bench/raw_grpc.h"

ABSL_FLAG(std::string, sizes_mib, "1,4,16",
          "Tensor sizes in MiB of float32 values, comma-separated.");
ABSL_FLAG(int, repeats, 30, "Timed repetitions of each case (medians).");
ABSL_FLAG(int, warmup, 3, "Untimed repetitions before them.");
ABSL_FLAG(std::string, mode, "sync",
          "The shard's update mode (sync with one worker applies each push "
          "at once with SGD and momentum).");
ABSL_FLAG(int, chunk_kib, 1024,
          "Message size of both streams, in KiB (the config's chunk_bytes).");
ABSL_FLAG(std::string, cases, "",
          "Run only the cases whose names start with one of these "
          "comma-separated prefixes (e.g. push_float32,pull); empty: all.");
ABSL_FLAG(bool, json, false, "Print one JSON object per case.");
ABSL_FLAG(int64_t, sparse_rows, 10000000,
          "Rows of the sparse cases' table (0: no sparse cases).");
ABSL_FLAG(int, sparse_batch, 512, "Ids per sparse push or pull.");
ABSL_FLAG(bool, unix_sockets, false,
          "The shard and the raw gRPC server both listen on Unix domain "
          "sockets (in a fresh folder under TMPDIR) rather than on loopback "
          "TCP: the dense cases on the transport of workers on the shard's "
          "machine (ps_server --listen=unix:PATH).");

namespace monsoon::tools {
namespace {

constexpr int kUsageError = 2;

struct Case {
  std::string name;
  uint64_t bytes = 0;      // the tensor's float32 bytes
  uint64_t raw_bytes = 0;  // what the reference moves each way
  // One repetition of each side.
  std::function<absl::Status()> monsoon;
  std::function<absl::Status()> raw;
  // The shard's time in updates so far, in seconds (MonsoonWire).
  std::function<double()> update_seconds;
};

// Whether --cases selects the case.
bool Selected(const std::string& name) {
  const std::string cases = absl::GetFlag(FLAGS_cases);
  if (cases.empty()) return true;
  for (absl::string_view prefix : absl::StrSplit(cases, ',')) {
    if (absl::StartsWith(name, prefix)) return true;
  }
  return false;
}

// Times `run` once, in microseconds.
absl::StatusOr<double> Time(const std::function<absl::Status()>& run) {
  const absl::Time start = absl::Now();
  absl::Status status = run();
  if (!status.ok()) return status;
  return absl::ToDoubleMicroseconds(absl::Now() - start);
}

absl::Status RunCase(const Case& c, int warmup, int repeats, bool json) {
  std::vector<double> ours, raw;
  double updates_before = 0;
  for (int i = 0; i < warmup + repeats; ++i) {
    if (i == warmup) updates_before = c.update_seconds();
    absl::StatusOr<double> a = Time(c.monsoon);
    if (!a.ok()) return a.status();
    absl::StatusOr<double> b = Time(c.raw);
    if (!b.ok()) return b.status();
    if (i >= warmup) {
      ours.push_back(*a);
      raw.push_back(*b);
    }
  }
  const Summary s = Summarize(ours);
  const Summary r = Summarize(raw);
  // The shard's update, a mean over the timed repetitions: the part of
  // Monsoon's time that nothing overlaps in a push-pull (a push's chunks
  // are copied and checked while the next is on its way; the update runs
  // once the last is in, before the answer leaves).
  const double update_us =
      (c.update_seconds() - updates_before) * 1e6 / repeats;
  // Gbit/s of the tensor's float32 bytes: what a push or pull delivers.
  const double moved =
      c.name.rfind("pushpull", 0) == 0 ? 2.0 * c.bytes : 1.0 * c.bytes;
  const double gbps = moved * 8 / (s.p50 * 1e3);
  const double raw_gbps = moved * 8 / (r.p50 * 1e3);
  if (json) {
    JsonLine line;
    line.Add("case", c.name)
        .Add("bytes", static_cast<long long>(c.bytes))
        .Add("wire_bytes", static_cast<long long>(c.raw_bytes))
        .Add("repeats", repeats)
        .Add("p50_us", s.p50)
        .Add("p10_us", s.p10)
        .Add("p90_us", s.p90)
        .Add("gbps", gbps)
        .Add("raw_grpc_p50_us", r.p50)
        .Add("raw_grpc_gbps", raw_gbps)
        .Add("ratio", r.p50 / s.p50)
        .Add("shard_update_mean_us", update_us);
    std::printf("%s\n", line.str().c_str());
  } else {
    std::printf("%-26s %9.0f %9.0f %8.2f %9.0f %8.2f %6.2f %9.0f\n",
                c.name.c_str(), s.p50, s.p90, gbps, r.p50, raw_gbps,
                r.p50 / s.p50, update_us);
  }
  std::fflush(stdout);
  return absl::OkStatus();
}

// The sparse cases (see the file comment): rows per second, against the raw
// stream of the same bytes, and the bytes against a dense push of the table.
absl::Status SparseCases(RawGrpcClient& raw, int warmup, int repeats,
                         bool json) {
  const int64_t rows = absl::GetFlag(FLAGS_sparse_rows);
  const int batch = absl::GetFlag(FLAGS_sparse_batch);
  for (int dim : {16, 64}) {
    absl::StatusOr<std::unique_ptr<SparseWire>> wire =
        SparseWire::Start(dim, rows, batch);
    if (!wire.ok()) return wire.status();
    SparseWire* w = wire->get();
    for (bool push : {true, false}) {
      const std::string name = absl::StrCat(push ? "sparse_push" : "sparse_pull",
                                            "_d", dim, "_b", batch);
      if (!Selected(name)) continue;
      std::vector<double> ours, reference;
      uint64_t bytes = 0;
      for (int i = 0; i < warmup + repeats; ++i) {
        absl::StatusOr<double> a =
            Time([w, push] { return push ? w->Push() : w->Pull(); });
        if (!a.ok()) return a.status();
        bytes = push ? w->push_bytes() : w->pull_bytes();
        absl::StatusOr<double> b = Time([&raw, bytes, push] {
          return push ? raw.Push(bytes, bytes) : raw.Pull(bytes, bytes);
        });
        if (!b.ok()) return b.status();
        if (i >= warmup) {
          ours.push_back(*a);
          reference.push_back(*b);
        }
      }
      const Summary s = Summarize(ours);
      const Summary r = Summarize(reference);
      const double rows_per_s = batch / (s.p50 * 1e-6);
      const double dense_bytes = static_cast<double>(rows) * dim * sizeof(float);
      if (json) {
        JsonLine line;
        line.Add("case", name)
            .Add("dim", dim)
            .Add("ids", batch)
            .Add("table_rows", static_cast<long long>(rows))
            .Add("wire_bytes", static_cast<long long>(bytes))
            .Add("dense_push_bytes", dense_bytes)
            .Add("times_fewer_bytes_than_dense", dense_bytes / bytes)
            .Add("repeats", repeats)
            .Add("p50_us", s.p50)
            .Add("rows_per_s", rows_per_s)
            .Add("raw_grpc_p50_us", r.p50)
            .Add("ratio", r.p50 / s.p50);
        std::printf("%s\n", line.str().c_str());
      } else {
        std::printf("%-26s %9.0f %9.0f %10.3g %9.0f %9llu %6.2f %12.0f\n",
                    name.c_str(), s.p50, s.p90, rows_per_s, r.p50,
                    static_cast<unsigned long long>(bytes), r.p50 / s.p50,
                    dense_bytes / bytes);
      }
      std::fflush(stdout);
    }
  }
  return absl::OkStatus();
}

int Main() {
  std::vector<int> sizes;
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_sizes_mib), ',')) {
    int mib = 0;
    if (!absl::SimpleAtoi(part, &mib) || mib < 1 || mib > 64) {
      std::fprintf(stderr,
                   "wire_bench: --sizes_mib takes sizes from 1 to 64, e.g. "
                   "1,4,16\n");
      return kUsageError;
    }
    sizes.push_back(mib);
  }
  const int repeats = absl::GetFlag(FLAGS_repeats);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const uint64_t chunk = static_cast<uint64_t>(absl::GetFlag(FLAGS_chunk_kib))
                         << 10;
  absl::StatusOr<Mode> mode = common::ParseMode(absl::GetFlag(FLAGS_mode));
  if (repeats < 1 || warmup < 0 || chunk < (256 << 10) || chunk > (4 << 20) ||
      !mode.ok()) {
    std::fprintf(stderr,
                 "wire_bench: --repeats >= 1, --warmup >= 0, --chunk_kib in "
                 "[256, 4096] and a known --mode, please\n");
    return kUsageError;
  }
  const bool json = absl::GetFlag(FLAGS_json);
  if (!json) {
    std::printf("%-26s %9s %9s %8s %9s %8s %6s %9s\n", "case", "p50 us",
                "p90 us", "Gbit/s", "raw p50", "raw Gb/s", "ratio",
                "update us");
  }
  const uint64_t max_bytes = static_cast<uint64_t>(sizes.back()) << 20;
  uint64_t largest = 0;
  for (int mib : sizes) largest = std::max<uint64_t>(largest, mib);
  // Where the raw server and the shard listen.
  std::string raw_listen = "127.0.0.1:0";
  std::string shard_listen = "127.0.0.1:0";
  std::string socket_dir;
  if (absl::GetFlag(FLAGS_unix_sockets)) {
    absl::StatusOr<std::string> dir = common::MakeTempDir("monsoon-wire");
    if (!dir.ok()) {
      std::fprintf(stderr, "wire_bench: %s\n", dir.status().ToString().c_str());
      return 1;
    }
    socket_dir = *std::move(dir);
    raw_listen = absl::StrCat("unix:", socket_dir, "/raw.sock");
    shard_listen = absl::StrCat("unix:", socket_dir, "/shard.sock");
  }
  // The sockets' folder goes with the servers, whatever the way out.
  struct RemoveAtExit {
    std::string dir;
    ~RemoveAtExit() {
      std::error_code ignored;
      if (!dir.empty()) std::filesystem::remove_all(dir, ignored);
    }
  } remove_at_exit{socket_dir};
  absl::StatusOr<std::unique_ptr<RawGrpcServer>> raw_server =
      RawGrpcServer::Start(largest << 20, raw_listen);
  if (!raw_server.ok()) {
    std::fprintf(stderr, "wire_bench: %s\n",
                 raw_server.status().ToString().c_str());
    return 1;
  }
  (void)max_bytes;
  RawGrpcClient raw((*raw_server)->address(), largest << 20);

  for (int mib : sizes) {
    const uint64_t bytes = static_cast<uint64_t>(mib) << 20;
    // 1-bit pushes where the mode takes them (common/config.cc).
    const bool onebit_allowed =
        *mode == SYNC || *mode == DOWNPOUR || *mode == ONEBIT;
    for (bool onebit : {false, true}) {
      if (onebit && !onebit_allowed) continue;
      absl::StatusOr<std::unique_ptr<MonsoonWire>> monsoon = MonsoonWire::Start(
          bytes / sizeof(float), *mode, onebit, chunk, shard_listen);
      if (!monsoon.ok()) {
        std::fprintf(stderr, "wire_bench: %s\n",
                     monsoon.status().ToString().c_str());
        return 1;
      }
      MonsoonWire* m = monsoon->get();
      std::vector<Case> cases;
      const std::string suffix = absl::StrCat(mib, "MiB");
      const std::function<double()> updates = [m] {
        return m->update_seconds();
      };
      if (onebit) {
        const uint64_t wire = m->push_wire_bytes();
        cases.push_back(
            {"push_onebit_" + suffix, bytes, wire, [m] { return m->Push(); },
             [&raw, wire, chunk] { return raw.Push(wire, chunk); }, updates});
      } else {
        cases.push_back(
            {"push_float32_" + suffix, bytes, bytes, [m] { return m->Push(); },
             [&raw, bytes, chunk] { return raw.Push(bytes, chunk); }, updates});
        cases.push_back(
            {"pull_float32_" + suffix, bytes, bytes, [m] { return m->Pull(); },
             [&raw, bytes, chunk] { return raw.Pull(bytes, chunk); }, updates});
        cases.push_back(
            {"pushpull_float32_" + suffix, bytes, bytes,
             [m] { return m->PushPull(); },
             [&raw, bytes, chunk] { return raw.PushPull(bytes, chunk); },
             updates});
      }
      for (const Case& c : cases) {
        if (!Selected(c.name)) continue;
        absl::Status status = RunCase(c, warmup, repeats, json);
        if (!status.ok()) {
          std::fprintf(stderr, "wire_bench: %s: %s\n", c.name.c_str(),
                       status.ToString().c_str());
          return 1;
        }
      }
    }
  }
  if (absl::GetFlag(FLAGS_sparse_rows) > 0) {
    if (absl::GetFlag(FLAGS_sparse_batch) < 1) {
      std::fprintf(stderr, "wire_bench: --sparse_batch >= 1\n");
      return kUsageError;
    }
    if (!json) {
      std::printf("\nsparse: one shard, a table of %lld rows\n",
                  static_cast<long long>(absl::GetFlag(FLAGS_sparse_rows)));
      std::printf("%-26s %9s %9s %10s %9s %9s %6s %12s\n", "case", "p50 us",
                  "p90 us", "rows/s", "raw p50", "bytes", "ratio",
                  "x < dense");
    }
    if (absl::Status s = SparseCases(raw, warmup, repeats, json); !s.ok()) {
      std::fprintf(stderr, "wire_bench: sparse: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace monsoon::tools

int main(int argc, char** argv) {
  monsoon::tools::ExecWithOneOpenBlasThread(argv);
  monsoon::common::TuneProcess();
  absl::SetProgramUsageMessage(
      "Times Monsoon's push and pull between one client and one shard on "
      "loopback against a raw gRPC stream of the same bytes, measured in "
      "the same run (medians).\n\n  wire_bench\n  wire_bench --sizes_mib=4 "
      "--json");
  absl::ParseCommandLine(argc, argv);
  return monsoon::tools::Main();
}
