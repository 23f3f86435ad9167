// sparse_bench: a shard's sparse table (server/sparse_table.h) pulling and
// applying a push of a batch's distinct ids, in a table already holding
// --rows rows, against a reference in the same run: a gather of one float
// per id from an array as large as the table's slab (a memory latency
// bound: one cache miss an id, where the table pays for the id's index
// entry, its slot and its row). Prints ns per row, medians of --repeats.
//
//   bazel-bin/tools/bench/sparse_bench [--rows=800000] [--ids=1672]
//       [--optimizer=SPARSE_ROWWISE_ADAGRAD] [--dim=1] [--repeats=300]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/sparse_table.pb.h"
#include "server/sparse_table.h"
#include "tools/bench/bench_util.h"

ABSL_FLAG(int64_t, rows, 800000,
          "Rows the table holds before timing (its ids drawn at random).");
ABSL_FLAG(int, ids, 1672,
          "Distinct ids a push and a pull carry (sparse_lr's mean on one "
          "range of two, batch 256 of click data).");
ABSL_FLAG(std::string, optimizer, "SPARSE_ROWWISE_ADAGRAD",
          "SPARSE_SGD, SPARSE_ADAGRAD or SPARSE_ROWWISE_ADAGRAD.");
ABSL_FLAG(int, dim, 1, "Values a row.");
ABSL_FLAG(int, repeats, 300, "Timed pushes and pulls (medians).");

namespace monsoon::tools {
namespace {

int Run() {
  const int64_t rows = absl::GetFlag(FLAGS_rows);
  const int n = absl::GetFlag(FLAGS_ids);
  const int dim = absl::GetFlag(FLAGS_dim);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  SparseTableConfig::Optimizer optimizer;
  if (rows < n || n < 1 || dim < 1 || repeats < 1 ||
      !SparseTableConfig::Optimizer_Parse(absl::GetFlag(FLAGS_optimizer),
                                          &optimizer)) {
    std::fprintf(stderr,
                 "sparse_bench: --rows >= --ids >= 1, --dim and --repeats "
                 "at least 1, and a known --optimizer\n");
    return 2;
  }
  SparseTableConfig config;
  config.set_name("bench");
  config.set_dim(dim);
  config.set_optimizer(optimizer);
  config.set_max_rows(rows + int64_t{n} * (repeats + 1));
  absl::StatusOr<std::unique_ptr<server::SparseTable>> made =
      server::SparseTable::Create(config, 1);
  if (!made.ok()) {
    std::fprintf(stderr, "sparse_bench: %s\n", made.status().ToString().c_str());
    return 1;
  }
  server::SparseTable& table = **made;
  std::mt19937_64 random(7);
  std::vector<uint64_t> held(rows);
  for (uint64_t& id : held) id = random();
  std::vector<float> grads(static_cast<size_t>(n) * dim, 0.01f);
  // Filled a push at a time (as training makes rows).
  for (int64_t begin = 0; begin < rows; begin += n) {
    const int64_t end = std::min<int64_t>(rows, begin + n);
    std::vector<uint64_t> ids(held.begin() + begin, held.begin() + end);
    grads.resize(ids.size() * dim, 0.01f);
    if (!table.Push(ids, grads, 0.1f, 0).ok()) {
      std::fprintf(stderr, "sparse_bench: filling the table failed\n");
      return 1;
    }
  }
  grads.assign(static_cast<size_t>(n) * dim, 0.01f);
  // The reference: one float per id from an array of the slab's size.
  const size_t stride = static_cast<size_t>(
      dim + (optimizer == SparseTableConfig::SPARSE_SGD                ? 0
             : optimizer == SparseTableConfig::SPARSE_ROWWISE_ADAGRAD ? 1
                                                                       : dim));
  std::vector<float> slab(static_cast<size_t>(rows) * stride, 1.0f);
  std::vector<double> push_ns, pull_ns, gather_ns;
  std::vector<float> out(static_cast<size_t>(n) * dim);
  std::vector<size_t> at(n);
  double sink = 0;
  for (int r = 0; r < repeats; ++r) {
    // Distinct ids held by the table, in random order: one set for the
    // pull and another for the push, so that neither finds the other's
    // rows in the cache.
    std::vector<uint64_t> ids(n), pushed(n);
    std::sample(held.begin(), held.end(), ids.begin(), n, random);
    std::shuffle(ids.begin(), ids.end(), random);
    std::sample(held.begin(), held.end(), pushed.begin(), n, random);
    std::shuffle(pushed.begin(), pushed.end(), random);
    for (int i = 0; i < n; ++i) {
      at[i] = static_cast<size_t>(random() % rows) * stride;
    }
    absl::Time start = absl::Now();
    float sum = 0;
    for (int i = 0; i < n; ++i) sum += slab[at[i]];
    gather_ns.push_back(absl::ToDoubleNanoseconds(absl::Now() - start) / n);
    sink += sum;
    start = absl::Now();
    if (!table.Pull(ids, absl::MakeSpan(out)).ok()) return 1;
    pull_ns.push_back(absl::ToDoubleNanoseconds(absl::Now() - start) / n);
    start = absl::Now();
    if (!table.Push(pushed, grads, 0.1f, r + 1).ok()) return 1;
    push_ns.push_back(absl::ToDoubleNanoseconds(absl::Now() - start) / n);
  }
  const Summary push = Summarize(push_ns), pull = Summarize(pull_ns),
                gather = Summarize(gather_ns);
  std::printf(
      "sparse_bench: %lld rows, %d ids a call, %s dim %d, medians of %d "
      "(ns a row)\n",
      static_cast<long long>(rows), n, absl::GetFlag(FLAGS_optimizer).c_str(),
      dim, repeats);
  std::printf("| case | ns a row, p50 (p10-p90) | ratio to the gather |\n");
  std::printf("|---|---|---|\n");
  auto line = [&](const char* name, const Summary& s) {
    std::printf("| %s | %.0f (%.0f-%.0f) | %.2f |\n", name, s.p50, s.p10,
                s.p90, s.p50 / gather.p50);
  };
  line("reference: gather, one float an id", gather);
  line("pull", pull);
  line("push (apply)", push);
  if (sink == 0.5) std::printf("\n");  // keeps the gather
  return 0;
}

}  // namespace
}  // namespace monsoon::tools

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "A sparse table's pull and push of a batch's ids, ns a row, against a "
      "random gather from memory of the table's size in the same run.");
  absl::ParseCommandLine(argc, argv);
  return monsoon::tools::Run();
}
