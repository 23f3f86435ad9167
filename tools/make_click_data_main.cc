// make_click_data: writes a Criteo-shaped synthetic click data set with a
// planted model (tools/click_data.h): DIR/train.libsvm, DIR/test.libsvm and
// DIR/planted.json, the planted model's test AUC and log loss, and its AUC
// knowing only the ids the training set drew (once, and 10 times): what a
// model trained on it can hope for.
//
//   bazel run //tools:make_click_data -- --out=/tmp/click --examples=1000000
//
// Exit codes: 0 when written, 2 for a bad flag, 1 for any other failure.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "tools/click_data.h"

ABSL_FLAG(std::string, out, "", "Folder to write into (made if missing).");
ABSL_FLAG(int64_t, examples, 100000, "Training examples.");
ABSL_FLAG(int64_t, test_examples, 0, "Test examples (0: a fifth of --examples).");
ABSL_FLAG(uint64_t, seed, 1, "Seeds the planted model and the draws.");
ABSL_FLAG(double, id_scale, 1.0,
          "Multiplies Criteo's cardinalities (up to 10.1M ids a field), in "
          "(0, 1]: smaller tables.");

ABSL_FLAG(int64_t, signal_ranks, 0,
          "0: every categorical id has a planted weight, so much of the "
          "signal lies in ids drawn a handful of times or never, and the "
          "planted AUC is a bound no trained model approaches. H > 0: only "
          "each field's H most frequent ids have a weight (the ids drawn "
          "are the same, the labels differ), so the planted AUC is a target "
          "a trained model can come near.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Writes a Criteo-shaped synthetic click data set (13 dense and 26 "
      "categorical fields, power-law ids, labels from a planted logistic "
      "model) as libsvm files, with the planted model's test AUC.\n\n"
      "  make_click_data --out=DIR [--examples=N] [--seed=S]");
  absl::ParseCommandLine(argc, argv);
  const std::string out = absl::GetFlag(FLAGS_out);
  monsoon::tools::ClickDataOptions options;
  options.train_examples = absl::GetFlag(FLAGS_examples);
  options.test_examples = absl::GetFlag(FLAGS_test_examples) > 0
                              ? absl::GetFlag(FLAGS_test_examples)
                              : options.train_examples / 5;
  options.seed = absl::GetFlag(FLAGS_seed);
  options.id_scale = absl::GetFlag(FLAGS_id_scale);
  options.signal_ranks = absl::GetFlag(FLAGS_signal_ranks);
  if (out.empty()) {
    std::fprintf(stderr, "make_click_data: give --out=DIR\n");
    return 2;
  }
  if (mkdir(out.c_str(), 0755) != 0 && errno != EEXIST) {
    std::fprintf(stderr, "make_click_data: cannot make %s\n", out.c_str());
    return 1;
  }
  absl::StatusOr<monsoon::tools::PlantedResult> result =
      monsoon::tools::WriteClickData(options, out);
  if (!result.ok()) {
    std::fprintf(stderr, "make_click_data: %s\n",
                 result.status().ToString().c_str());
    return result.status().code() == absl::StatusCode::kInvalidArgument ? 2
                                                                         : 1;
  }
  std::printf(
      "make_click_data: %lld train and %lld test examples in %s (clicks: "
      "%.3f and %.3f); the planted model's test AUC %.4f, log loss %.4f; "
      "%lld categorical ids drawn for training; its AUC knowing only their "
      "weights %.4f, only those of ids drawn 10 times %.4f\n",
      static_cast<long long>(options.train_examples),
      static_cast<long long>(options.test_examples), out.c_str(),
      result->train_ctr, result->test_ctr, result->test_auc,
      result->test_logloss, static_cast<long long>(result->train_ids),
      result->test_auc_known_ids, result->test_auc_ids_seen_10);
  return 0;
}
