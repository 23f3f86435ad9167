// Synthetic click data shaped like Criteo's: 13 dense fields and 26
// categorical ones whose ids follow a power law (an id of rank r is drawn
// with probability about 1 / (r + 1)) over Criteo's own cardinalities, up
// to ten million ids a field, and labels drawn from a planted logistic
// model, whose test AUC and log loss planted.json gives: with signal_ranks
// (only each field's most frequent ids weighted) a target a trained model
// can come near, without it a bound (see ClickDataOptions::signal_ranks).
//
// A line of train.libsvm / test.libsvm (common/libsvm_reader.h):
//   LABEL 0:0:x0 ... 12:12:x12 13:ID:1 ... 38:ID:1
// dense field j holds id j with its value; categorical field 13 + f holds
// the id ((f + 1) << 48) | rank. Everything is a function of the seed.
#ifndef MONSOON_TOOLS_CLICK_DATA_H_
#define MONSOON_TOOLS_CLICK_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/libsvm_reader.h"

namespace monsoon::tools {

inline constexpr int kClickDenseFields = 13;
inline constexpr int kClickCategoricalFields = 26;

struct ClickDataOptions {
  int64_t train_examples = 100000;
  int64_t test_examples = 20000;
  uint64_t seed = 1;
  // Multiplies every field's cardinality (at least 2 ids a field): small
  // data sets for tests.
  double id_scale = 1.0;
  // 0: every categorical id has a planted weight (scale 0.25), however
  // rarely it is drawn, so much of the signal lies in ids a training set
  // draws a handful of times or never, and the planted AUC is a bound that
  // no trained model approaches. H > 0: only the ids of rank 0 to H - 1 of
  // each field (the most frequent) have a weight, the others weigh 0. The
  // features drawn are the same (only the labels change), so the tables
  // grow as large, but the signal lies in ids drawn often enough to learn
  // and the planted AUC is a target a trained model can come near.
  int64_t signal_ranks = 0;
};

// What the planted model reaches, and the data's shape.
struct PlantedResult {
  double test_auc = 0;
  double test_logloss = 0;
  // Distinct categorical ids drawn for the training set (the rows a model
  // with a row per id makes).
  int64_t train_ids = 0;
  // The planted model's test AUC with the weights of the categorical ids
  // drawn for training never (known_ids) or fewer than 10 times
  // (ids_seen_10) set to 0: no model trained on this set can know the
  // weights of ids it never saw, nor learn much from a handful of
  // examples, so these bound what training can reach far more tightly
  // than test_auc once a field's ids outnumber the examples.
  double test_auc_known_ids = 0;
  double test_auc_ids_seen_10 = 0;
  double train_ctr = 0;
  double test_ctr = 0;
  std::vector<int64_t> cardinalities;  // per categorical field
};

// Criteo's cardinalities (the Kaggle set's 26 categorical fields) times
// `id_scale`.
std::vector<int64_t> ClickCardinalities(double id_scale);

// The planted model's logit for an example as LibsvmReader reads it
// (`signal_ranks` as in ClickDataOptions).
double PlantedLogit(uint64_t seed, const common::SparseExample& example,
                    int64_t signal_ranks = 0);

// Writes DIR/train.libsvm, DIR/test.libsvm and DIR/planted.json (DIR must
// exist; the PlantedResult's fields); each file is written beside and
// renamed into place.
absl::StatusOr<PlantedResult> WriteClickData(const ClickDataOptions& options,
                                             const std::string& dir);

}  // namespace monsoon::tools

#endif  // MONSOON_TOOLS_CLICK_DATA_H_
