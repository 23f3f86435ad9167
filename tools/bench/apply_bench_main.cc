// apply_bench: how fast each mode's update rule applies one push on the
// shard (server/*_rule.cc, out of the gRPC path), in values per second,
// against a SAXPY (OpenBLAS cblas_saxpy, one thread) over the same amount
// of memory, measured in the same run and interleaved.
//
// A SAXPY reads two vectors and writes one: the least any rule can do with
// a push (read it, read the weights, write new weights). Plain SGD does
// exactly that; momentum and Adagrad also read and write their state; sync
// also sums the push into the step's gradient; hogwild writes in place with
// relaxed atomics, one value at a time. A last row times the worker's 1-bit
// encoder (quantization with error feedback) on a push of the same size.
//
//   bazel build //tools/bench:apply_bench
//   bazel-bin/tools/bench/apply_bench            # table
//   bazel-bin/tools/bench/apply_bench --json     # one object per rule
//
// Exit codes: 0 after a report, 2 for a bad flag, 1 for any other failure.
#include <cblas.h>

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
#include "common/wire.h"
#include "server/shard_state.h"
#include "server/update_rule.h"
#include "tools/bench/bench_util.h"

ABSL_FLAG(int, values, 1 << 20, "Values per push (a shard's size).");
ABSL_FLAG(int, repeats, 50, "Timed pushes per rule (medians).");
ABSL_FLAG(int, warmup, 5, "Untimed pushes before them.");
ABSL_FLAG(bool, json, false, "Print one JSON object per rule.");

namespace monsoon::tools {
namespace {

constexpr int kUsageError = 2;

struct RuleCase {
  std::string name;
  std::string config;  // text-format TrainingConfig, layer sizes added
};

// One row: `name`'s median against the same run's SAXPY.
void Print(const std::string& name, int values, int repeats, const Summary& r,
           const Summary& s, bool json) {
  const double rate = values / (r.p50 * 1e-6);
  const double saxpy_rate = values / (s.p50 * 1e-6);
  if (json) {
    JsonLine line;
    line.Add("rule", name)
        .Add("values", values)
        .Add("repeats", repeats)
        .Add("p50_us", r.p50)
        .Add("values_per_s", rate)
        .Add("saxpy_p50_us", s.p50)
        .Add("saxpy_values_per_s", saxpy_rate)
        .Add("ratio", rate / saxpy_rate);
    std::printf("%s\n", line.str().c_str());
  } else {
    std::printf("%-18s %10.0f %12.3g %10.0f %12.3g %6.2f\n", name.c_str(),
                r.p50, rate, s.p50, saxpy_rate, rate / saxpy_rate);
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
  const std::vector<RuleCase> cases = {
      {"sgd", "mode: DOWNPOUR optimizer: SGD momentum: 0"},
      {"sgd_momentum", "mode: DOWNPOUR optimizer: SGD momentum: 0.9"},
      {"adagrad", "mode: DOWNPOUR optimizer: ADAGRAD"},
      {"sync_sgd_momentum", "mode: SYNC"},
      {"easgd", "mode: EASGD"},
      {"hogwild", "mode: HOGWILD"},
  };
  // Small values: thousands of updates stay finite.
  const std::vector<float> push_values =
      common::UniformValues(values, /*seed=*/11, 1e-4f);
  std::vector<float> x = common::UniformValues(values, 12, 1.0f);
  std::vector<float> y = common::UniformValues(values, 13, 1.0f);
  openblas_set_num_threads(1);

  if (!json) {
    std::printf("%d values per push, medians of %d\n", values, repeats);
    std::printf("%-18s %10s %12s %10s %12s %6s\n", "rule", "p50 us", "values/s",
                "saxpy us", "saxpy v/s", "ratio");
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
        server::MakeUpdateRule(*config, /*num_workers=*/1, &state);
    server::PushData push;
    push.worker_rank = 0;
    push.samples = 1;
    push.values = push_values;
    // As PushDecoder finds it while checking the values: the rules' bounds
    // then spare them the pass that checks an update cannot overflow.
    push.max_abs = static_cast<float>(server::MaxAbs(push_values));
    std::vector<double> rule_us, saxpy_us;
    for (int i = 0; i < warmup + repeats; ++i) {
      push.base_version = state.version();
      // Each push carries the next example: a repeat would be acknowledged
      // as a duplicate without being applied, and timed as nothing.
      push.sample_offset = i;
      absl::StatusOr<server::PushResult> result;
      const double a = TimeUs([&] { result = rule->Apply(push); });
      if (!result.ok() || result->duplicate) {
        std::fprintf(stderr, "apply_bench: %s: %s\n", c.name.c_str(),
                     result.ok() ? "a push was taken for a repeat"
                                 : result.status().ToString().c_str());
        return 1;
      }
      const double b =
          TimeUs([&] { cblas_saxpy(values, 1e-3f, x.data(), 1, y.data(), 1); });
      if (i >= warmup) {
        rule_us.push_back(a);
        saxpy_us.push_back(b);
      }
    }
    Print(c.name, values, repeats, Summarize(rule_us), Summarize(saxpy_us),
          json);
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
    Print("onebit_encode", values, repeats, Summarize(encode_us),
          Summarize(saxpy_us), json);
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
          Summarize(saxpy_us), json);
  }
  return 0;
}

}  // namespace
}  // namespace monsoon::tools

int main(int argc, char** argv) {
  monsoon::common::TuneProcess();
  absl::SetProgramUsageMessage(
      "Times each update rule's apply of one push on the shard against a "
      "SAXPY over the same memory, measured in the same run (medians).\n\n"
      "  apply_bench\n  apply_bench --values=262144 --json");
  absl::ParseCommandLine(argc, argv);
  return monsoon::tools::Main();
}
