// apply_bench: how fast each mode's update rule applies one push on the
// shard (server/*_rule.cc, out of the gRPC path), in values per second,
// against a SAXPY (OpenBLAS cblas_saxpy, one thread) over the same amount
// of memory, measured in the same run and interleaved.
//
// A SAXPY reads two vectors and writes one: the least any rule can do with
// a push (read it, read the weights, write new weights). Plain SGD does
// exactly that; momentum and Adagrad also read and write their state; sync
// keeps a step's first push as its sum and adds the last as it applies the
// sum (sync_2_workers times a step of two pushes, per push); hogwild writes
// in place with relaxed atomics, one value at a time. Each push comes in a
// pooled buffer, as the shard's decoder hands it over. Each row also gives
// the arrays the rule moves and its bandwidth against SAXPY's ("bw ratio":
// the ratio times arrays / 3). Further rows time the worker's 1-bit
// encoder (quantization with error feedback) and sync's push digest on a
// push of the same size.
//
// The sparse rows (server/sparse_table.h): a push of --sparse_batch
// distinct ids drawn at random from a table of --sparse_rows rows (row-wise
// Adagrad, d = 16 and 64), in rows per second, against a SAXPY streaming
// over the whole table's memory in the same run, as rows per second: what
// memory bandwidth allows when nothing is looked up.
//
//   bazel build //tools/bench:apply_bench
//   bazel-bin/tools/bench/apply_bench            # table
//   bazel-bin/tools/bench/apply_bench --json     # one object per rule
//
// Exit codes: 0 after a report, 2 for a bad flag, 1 for any other failure.
#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/model_layout.h"
#include "common/onebit.h"
#include "common/process_tuning.h"
#include "proto/sparse_table.pb.h"
#include "common/wire.h"
#include "server/shard_state.h"
#include "server/sparse_table.h"
#include "server/update_rule.h"
#include "tools/bench/bench_util.h"

ABSL_FLAG(int, values, 1 << 20, "Values per push (a shard's size).");
ABSL_FLAG(int, repeats, 50, "Timed pushes per rule (medians).");
ABSL_FLAG(int, warmup, 5, "Untimed pushes before them.");
ABSL_FLAG(bool, json, false, "Print one JSON object per rule.");
ABSL_FLAG(int, sparse_rows, 1 << 20,
          "Rows of the sparse cases' tables (0: no sparse cases).");
ABSL_FLAG(int, sparse_batch, 512, "Distinct ids per sparse push.");

namespace monsoon::tools {
namespace {

constexpr int kUsageError = 2;

struct RuleCase {
  std::string name;
  std::string config;  // text-format TrainingConfig, layer sizes added
  // float32 arrays of the push's length each push reads or writes (an
  // array read and written counts twice), the push's own values included:
  // SAXPY's are 3 (x read, y read and written).
  double arrays;
  int workers = 1;  // sync: pushes in a step, timed together
};

// One row: `name`'s median against the same run's SAXPY.
// `arrays` (see RuleCase) gives its bytes against SAXPY's: how near memory
// speed it runs, where the ratio alone also counts the memory it must move.
void Print(const std::string& name, int values, int repeats, const Summary& r,
           const Summary& s, double arrays, bool json) {
  const double rate = values / (r.p50 * 1e-6);
  const double saxpy_rate = values / (s.p50 * 1e-6);
  const double bandwidth = rate / saxpy_rate * arrays / 3.0;
  if (json) {
    JsonLine line;
    line.Add("rule", name)
        .Add("values", values)
        .Add("repeats", repeats)
        .Add("p50_us", r.p50)
        .Add("values_per_s", rate)
        .Add("saxpy_p50_us", s.p50)
        .Add("saxpy_values_per_s", saxpy_rate)
        .Add("ratio", rate / saxpy_rate)
        .Add("arrays", arrays)
        .Add("bandwidth_ratio", bandwidth);
    std::printf("%s\n", line.str().c_str());
  } else {
    std::printf("%-18s %10.0f %12.3g %10.0f %12.3g %6.2f %6.2g %8.2f\n",
                name.c_str(), r.p50, rate, s.p50, saxpy_rate,
                rate / saxpy_rate, arrays, bandwidth);
  }
  std::fflush(stdout);
}

// Microseconds that `run` takes, once.
template <typename F>
double TimeUs(F&& run) {
  const absl::Time start = absl::Now();
  run();
  return absl::ToDoubleMicroseconds(absl::Now() - start);
}

// Row-wise Adagrad on a table of `rows` rows of `dim`, pushes of `batch`
// distinct ids; 0 after its row, 1 on failure.
int SparseCase(int dim, int rows, int batch, int repeats, int warmup,
               bool json) {
  SparseTableConfig config;
  config.set_name(absl::StrCat("bench_d", dim));
  config.set_dim(dim);
  config.set_optimizer(SparseTableConfig::SPARSE_ROWWISE_ADAGRAD);
  config.set_max_rows(rows);
  absl::StatusOr<std::unique_ptr<server::SparseTable>> table =
      server::SparseTable::Create(config, /*seed=*/1);
  if (!table.ok()) {
    std::fprintf(stderr, "apply_bench: %s\n", table.status().ToString().c_str());
    return 1;
  }
  // Every row made first (creating is not what is timed), then pushes of
  // ids in a random order: each push `batch` distinct rows anywhere.
  std::vector<uint64_t> order(rows);
  for (int i = 0; i < rows; ++i) order[i] = static_cast<uint64_t>(i);
  const std::vector<float> grads =
      common::UniformValues(static_cast<size_t>(batch) * dim, 21, 1e-2f);
  int64_t step = 0;
  for (int i = 0; i + batch <= rows; i += batch) {
    absl::StatusOr<server::SparsePushResult> r = (*table)->Push(
        absl::MakeConstSpan(order).subspan(i, batch), grads, 0.01f, ++step);
    if (!r.ok()) {
      std::fprintf(stderr, "apply_bench: %s\n", r.status().ToString().c_str());
      return 1;
    }
  }
  for (int i = rows - 1; i > 0; --i) {  // Fisher-Yates from SplitMix64
    std::swap(order[i], order[common::SplitMix64(i) % (i + 1)]);
  }
  // The reference streams the table's memory: (dim + 1) floats a row.
  const size_t stream = static_cast<size_t>(rows) * (dim + 1);
  std::vector<float> x(stream, 1.0f), y(stream, 0.0f);
  std::vector<double> push_us, saxpy_us;
  const int windows = rows / batch;
  for (int i = 0; i < warmup + repeats; ++i) {
    const auto ids =
        absl::MakeConstSpan(order).subspan((i % windows) * batch, batch);
    absl::StatusOr<server::SparsePushResult> r;
    const double a =
        TimeUs([&] { r = (*table)->Push(ids, grads, 0.01f, ++step); });
    if (!r.ok() || r->updated != batch) {
      std::fprintf(stderr, "apply_bench: sparse push: %s\n",
                   r.ok() ? "not every row updated"
                          : r.status().ToString().c_str());
      return 1;
    }
    const double b = TimeUs(
        [&] { cblas_saxpy(stream, 1e-3f, x.data(), 1, y.data(), 1); });
    if (i >= warmup) {
      push_us.push_back(a);
      saxpy_us.push_back(b);
    }
  }
  const double rows_per_s = batch / (Summarize(push_us).p50 * 1e-6);
  const double stream_rows_per_s = rows / (Summarize(saxpy_us).p50 * 1e-6);
  const std::string name = absl::StrCat("sparse_rowwise_adagrad_d", dim);
  if (json) {
    JsonLine line;
    line.Add("rule", name)
        .Add("dim", dim)
        .Add("table_rows", rows)
        .Add("ids_per_push", batch)
        .Add("repeats", repeats)
        .Add("p50_us", Summarize(push_us).p50)
        .Add("rows_per_s", rows_per_s)
        .Add("saxpy_stream_p50_us", Summarize(saxpy_us).p50)
        .Add("saxpy_stream_rows_per_s", stream_rows_per_s)
        .Add("ratio", rows_per_s / stream_rows_per_s);
    std::printf("%s\n", line.str().c_str());
  } else {
    std::printf("%-28s %10.1f %12.3g %12.0f %14.3g %6.3f\n", name.c_str(),
                Summarize(push_us).p50, rows_per_s, Summarize(saxpy_us).p50,
                stream_rows_per_s, rows_per_s / stream_rows_per_s);
  }
  std::fflush(stdout);
  return 0;
}

int Main() {
  const int values = absl::GetFlag(FLAGS_values);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  if (values < 4 || values % 2 != 0 || values / 2 - 1 > (1 << 20) ||
      repeats < 1 || warmup < 0) {
    std::fprintf(stderr,
                 "apply_bench: --values: an even count from 4 to 2097152; "
                 "--repeats >= 1; --warmup >= 0\n");
    return kUsageError;
  }
  const bool json = absl::GetFlag(FLAGS_json);
  // One layer of (values / 2 - 1) inputs and two outputs: `values` weights.
  const std::string layers =
      absl::StrCat("layer_sizes: [", values / 2 - 1, ", 2] ");
  // Sync's arrays: a step's first push becomes its sum (the decoder's
  // buffer taken over, not copied); the last is added as the momentum step
  // reads the sum: push, sum, weights and velocity read, weights and
  // velocity written, once a step (per push: 6 / workers; with one worker
  // the push is the sum: 5).
  const std::vector<RuleCase> cases = {
      {"sgd", "mode: DOWNPOUR optimizer: SGD momentum: 0", 3},
      {"sgd_momentum", "mode: DOWNPOUR optimizer: SGD momentum: 0.9", 5},
      {"adagrad", "mode: DOWNPOUR optimizer: ADAGRAD", 5},
      {"sync_sgd_momentum", "mode: SYNC", 5},
      {"sync_2_workers", "mode: SYNC", 3, 2},
      {"easgd", "mode: EASGD", 3},
      {"hogwild", "mode: HOGWILD", 3},
  };
  // Small values: thousands of updates stay finite.
  const std::vector<float> push_values =
      common::UniformValues(values, /*seed=*/11, 1e-4f);
  std::vector<float> x = common::UniformValues(values, 12, 1.0f);
  std::vector<float> y = common::UniformValues(values, 13, 1.0f);
  openblas_set_num_threads(1);

  if (!json) {
    std::printf("%d values per push, medians of %d\n", values, repeats);
    std::printf("%-18s %10s %12s %10s %12s %6s %6s %8s\n", "rule", "p50 us",
                "values/s", "saxpy us", "saxpy v/s", "ratio", "arrays",
                "bw ratio");
  }
  for (const RuleCase& c : cases) {
    absl::StatusOr<TrainingConfig> config =
        common::ParseConfigText(layers + c.config);
    if (config.ok()) config = common::ResolveConfigWithData(*config);
    if (!config.ok()) {
      std::fprintf(stderr, "apply_bench: %s: %s\n", c.name.c_str(),
                   config.status().ToString().c_str());
      return 1;
    }
    server::ShardState state(common::ModelLayout::FromConfig(*config),
                             config->seed(), 0, 1);
    std::unique_ptr<server::UpdateRule> rule =
        server::MakeUpdateRule(*config, c.workers, &state);
    server::PushData push;
    push.samples = 1;
    // As PushDecoder finds it while checking the values: the rules' bounds
    // then spare them the pass that checks an update cannot overflow.
    push.max_abs = static_cast<float>(server::MaxAbs(push_values));
    std::vector<double> rule_us, saxpy_us;
    for (int i = 0; i < warmup + repeats; ++i) {
      // A step: one push from each worker, timed together.
      double a = 0;
      for (int rank = 0; rank < c.workers; ++rank) {
        // As PushDecoder hands a push over: its values in a pooled buffer
        // (filled as it decoded them, so untimed) that a rule may keep.
        server::FloatBufferPool::Buffer buffer = state.buffers().Take();
        std::copy(push_values.begin(), push_values.end(), buffer.get());
        push.values = absl::MakeConstSpan(buffer.get(), values);
        push.buffer = &buffer;
        push.worker_rank = rank;
        push.base_version = state.version();
        // Each push carries the next example: a repeat would be
        // acknowledged as a duplicate without being applied, and timed as
        // nothing.
        push.sample_offset = i;
        absl::StatusOr<server::PushResult> result;
        a += TimeUs([&] { result = rule->Apply(push); });
        if (!result.ok() || result->duplicate) {
          std::fprintf(stderr, "apply_bench: %s: %s\n", c.name.c_str(),
                       result.ok() ? "a push was taken for a repeat"
                                   : result.status().ToString().c_str());
          return 1;
        }
      }
      if (state.version() != i + 1) {
        std::fprintf(stderr, "apply_bench: %s: step %d left version %lld\n",
                     c.name.c_str(), i,
                     static_cast<long long>(state.version()));
        return 1;
      }
      const double b =
          TimeUs([&] { cblas_saxpy(values, 1e-3f, x.data(), 1, y.data(), 1); });
      if (i >= warmup) {
        rule_us.push_back(a / c.workers);
        saxpy_us.push_back(b);
      }
    }
    Print(c.name, values, repeats, Summarize(rule_us), Summarize(saxpy_us),
          c.arrays, json);
  }
  // The worker's side of a 1-bit push: quantizing the gradient with error
  // feedback (common/onebit.h, buckets of 512), against the same SAXPY.
  {
    std::vector<float> residual(values, 0.0f);
    std::vector<uint8_t> bits(common::OneBitBitsBytes(values, 512));
    std::vector<float> scales(2 * common::OneBitBuckets(values, 512));
    std::vector<double> encode_us, saxpy_us;
    for (int i = 0; i < warmup + repeats; ++i) {
      const double a = TimeUs([&] {
        common::OneBitEncode(push_values.data(), residual.data(), values, 512,
                             bits.data(), scales.data());
      });
      const double b =
          TimeUs([&] { cblas_saxpy(values, 1e-3f, x.data(), 1, y.data(), 1); });
      if (i >= warmup) {
        encode_us.push_back(a);
        saxpy_us.push_back(b);
      }
    }
    // The gradient read, the residual read and written (the bits and
    // scales are a 32nd of that).
    Print("onebit_encode", values, repeats, Summarize(encode_us),
          Summarize(saxpy_us), 3, json);
  }
  // What a sync shard adds to each push: the digest that tells a push sent
  // again from a different one (common::ValuesDigest).
  {
    std::vector<double> digest_us, saxpy_us;
    uint64_t sink = 0;
    for (int i = 0; i < warmup + repeats; ++i) {
      const double a = TimeUs(
          [&] { sink ^= common::ValuesDigest(push_values.data(), values); });
      const double b =
          TimeUs([&] { cblas_saxpy(values, 1e-3f, x.data(), 1, y.data(), 1); });
      if (i >= warmup) {
        digest_us.push_back(a);
        saxpy_us.push_back(b);
      }
    }
    if (sink == 42) std::printf(" ");  // keeps the digests computed
    Print("sync_push_digest", values, repeats, Summarize(digest_us),
          Summarize(saxpy_us), 1, json);
  }
  const int sparse_rows = absl::GetFlag(FLAGS_sparse_rows);
  const int sparse_batch = absl::GetFlag(FLAGS_sparse_batch);
  if (sparse_rows > 0) {
    if (sparse_batch < 1 || sparse_batch > sparse_rows) {
      std::fprintf(stderr,
                   "apply_bench: --sparse_batch: from 1 to --sparse_rows\n");
      return kUsageError;
    }
    if (!json) {
      std::printf(
          "\nsparse rows: pushes of %d distinct ids at random in a table of "
          "%d rows; the reference streams the table's memory (SAXPY)\n",
          sparse_batch, sparse_rows);
      std::printf("%-28s %10s %12s %12s %14s %6s\n", "rule", "p50 us",
                  "rows/s", "stream us", "stream rows/s", "ratio");
    }
    for (int dim : {16, 64}) {
      if (int code = SparseCase(dim, sparse_rows, sparse_batch, repeats,
                                warmup, json)) {
        return code;
      }
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
      "Times each update rule's apply of one push on the shard against a "
      "SAXPY over the same memory, measured in the same run (medians).\n\n"
      "  apply_bench\n  apply_bench --values=262144 --json");
  absl::ParseCommandLine(argc, argv);
  return monsoon::tools::Main();
}
