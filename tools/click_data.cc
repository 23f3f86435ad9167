#include "tools/click_data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/auc.h"
#include "common/model_layout.h"

namespace monsoon::tools {
namespace {

// Criteo Kaggle's categorical fields C1..C26: distinct values each.
constexpr int64_t kCriteoCardinalities[kClickCategoricalFields] = {
    1460,  583,    10131227, 2202608, 305,     24,   12517,   633,    3,
    93145, 5683,   8351593,  3194,    27,      14992, 5461306, 10,    5652,
    2173,  4,      7046547,  18,      15,      286181, 105,   142572};

// The planted model's scale: about a quarter of the examples are clicks,
// and its AUC about 0.8, as the best models reach on Criteo.
constexpr double kBias = -1.3;
constexpr double kDenseWeightScale = 0.2;
constexpr double kIdWeightScale = 0.25;

// A categorical id: its field (from 1) above bit 48, its rank below.
constexpr int kRankBits = 48;
uint64_t IdOf(int field, int64_t rank) {
  return (static_cast<uint64_t>(field + 1) << kRankBits) |
         static_cast<uint64_t>(rank);
}
uint64_t RankOf(uint64_t id) { return id & ((uint64_t{1} << kRankBits) - 1); }

double UniformOf(uint64_t bits) {  // [0, 1)
  return static_cast<double>(bits >> 11) / static_cast<double>(1ull << 53);
}

// A standard normal value that is a function of `key` alone.
double NormalOf(uint64_t key) {
  const double u1 = 1.0 - UniformOf(common::SplitMix64(key));
  const double u2 = UniformOf(common::SplitMix64(key ^ 0x5851f42d4c957f2dull));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(common::SplitMix64(seed)) {}
  double Uniform() { return UniformOf(common::SplitMix64(state_++)); }

 private:
  uint64_t state_;
};

// One example's line, its features as a reader will see them, and the
// planted click probability.
std::string MakeLine(Rng& rng, uint64_t seed, int64_t signal_ranks,
                     const std::vector<int64_t>& cardinalities,
                     common::SparseExample* example, double* probability) {
  example->ids.clear();
  example->values.clear();
  example->fields.clear();
  std::string line;
  char value[32];
  for (int j = 0; j < kClickDenseFields; ++j) {
    // Counts, as Criteo's, after log(1 + x): about 0 to 4.
    const double x = std::log1p(-4.0 * std::log(1.0 - rng.Uniform()));
    std::snprintf(value, sizeof(value), "%.4g", x);
    absl::StrAppend(&line, " ", j, ":", j, ":", value);
    example->ids.push_back(static_cast<uint64_t>(j));
    example->values.push_back(std::strtof(value, nullptr));
    example->fields.push_back(j);
  }
  for (int f = 0; f < kClickCategoricalFields; ++f) {
    const double c = static_cast<double>(cardinalities[f]);
    const int64_t rank = std::min<int64_t>(
        cardinalities[f] - 1,
        static_cast<int64_t>(std::floor(std::pow(c, rng.Uniform()))) - 1);
    const uint64_t id = IdOf(f, rank);
    absl::StrAppend(&line, " ", kClickDenseFields + f, ":", id, ":1");
    example->ids.push_back(id);
    example->values.push_back(1.0f);
    example->fields.push_back(kClickDenseFields + f);
  }
  *probability =
      1.0 / (1.0 + std::exp(-PlantedLogit(seed, *example, signal_ranks)));
  example->label = rng.Uniform() < *probability ? 1.0f : 0.0f;
  return absl::StrCat(example->label > 0 ? "1" : "0", line, "\n");
}

// How often each categorical id was drawn for the training set.
using IdCounts = absl::flat_hash_map<uint64_t, int32_t>;

// The planted model's logit with the weights of the categorical ids drawn
// fewer than `min_count` times for training set to 0: what a model that
// knew every weight it saw often enough, exactly, would predict.
double KnownLogit(uint64_t seed, int64_t signal_ranks,
                  const common::SparseExample& example, const IdCounts& counts,
                  int32_t min_count) {
  common::SparseExample known = example;
  for (size_t i = 0; i < known.ids.size(); ++i) {
    if (known.fields[i] < kClickDenseFields) continue;
    const auto it = counts.find(known.ids[i]);
    if (it == counts.end() || it->second < min_count) known.values[i] = 0;
  }
  return PlantedLogit(seed, known, signal_ranks);
}

struct Split {
  double ctr = 0;
  std::vector<float> probabilities, labels;
  // The test split's: KnownLogit's probabilities with min_count 1 and 10.
  std::vector<float> known_once, known_10;
};

// Writes one split. The training split counts its ids into `counts`; the
// test split (`counts` given, `train` false) also predicts with KnownLogit.
absl::StatusOr<Split> WriteSplit(const std::string& path, int64_t examples,
                                 uint64_t stream, uint64_t seed,
                                 int64_t signal_ranks,
                                 const std::vector<int64_t>& cardinalities,
                                 IdCounts* counts, bool train) {
  const std::string partial = path + ".partial";
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(
      std::fopen(partial.c_str(), "w"), &std::fclose);
  if (file == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot write ", partial));
  }
  Rng rng(seed * 0x9e3779b97f4a7c15ull + stream);
  common::SparseExample example;
  Split split;
  double clicks = 0;
  for (int64_t i = 0; i < examples; ++i) {
    double probability = 0;
    const std::string line = MakeLine(rng, seed, signal_ranks, cardinalities,
                                      &example, &probability);
    if (std::fwrite(line.data(), 1, line.size(), file.get()) != line.size()) {
      return absl::UnavailableError(absl::StrCat("cannot write ", partial));
    }
    clicks += example.label;
    split.labels.push_back(example.label);
    split.probabilities.push_back(static_cast<float>(probability));
    if (train) {
      for (size_t f = 0; f < example.ids.size(); ++f) {
        if (example.fields[f] >= kClickDenseFields) ++(*counts)[example.ids[f]];
      }
    } else {
      for (auto [min_count, out] :
           {std::pair{1, &split.known_once}, std::pair{10, &split.known_10}}) {
        out->push_back(static_cast<float>(
            1.0 / (1.0 + std::exp(-KnownLogit(seed, signal_ranks, example,
                                              *counts, min_count)))));
      }
    }
  }
  if (std::fflush(file.get()) != 0 || std::fclose(file.release()) != 0 ||
      std::rename(partial.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot write ", path));
  }
  split.ctr = examples > 0 ? clicks / static_cast<double>(examples) : 0;
  return split;
}

}  // namespace

std::vector<int64_t> ClickCardinalities(double id_scale) {
  std::vector<int64_t> out;
  for (int64_t c : kCriteoCardinalities) {
    out.push_back(std::max<int64_t>(
        2, static_cast<int64_t>(std::llround(static_cast<double>(c) * id_scale))));
  }
  return out;
}

double PlantedLogit(uint64_t seed, const common::SparseExample& example,
                    int64_t signal_ranks) {
  const uint64_t key = common::SplitMix64(seed);
  double logit = kBias;
  for (size_t i = 0; i < example.ids.size(); ++i) {
    if (example.fields[i] < kClickDenseFields) {
      logit += kDenseWeightScale * NormalOf(key ^ example.ids[i]) *
               (example.values[i] - 1.0);
    } else {
      // With signal_ranks, ids past the first signal_ranks of their field
      // weigh nothing.
      const double scale =
          signal_ranks > 0 &&
                  RankOf(example.ids[i]) >= static_cast<uint64_t>(signal_ranks)
              ? 0.0
              : kIdWeightScale;
      logit += scale * NormalOf(key ^ common::SplitMix64(example.ids[i])) *
               example.values[i];
    }
  }
  return logit;
}

absl::StatusOr<PlantedResult> WriteClickData(const ClickDataOptions& options,
                                             const std::string& dir) {
  if (options.train_examples < 1 || options.test_examples < 1 ||
      !(options.id_scale > 0 && options.id_scale <= 1) ||
      options.signal_ranks < 0) {
    return absl::InvalidArgumentError(
        "give at least one train and one test example, an id scale in "
        "(0, 1] and signal ranks of at least 0");
  }
  PlantedResult result;
  result.cardinalities = ClickCardinalities(options.id_scale);
  IdCounts counts;
  absl::StatusOr<Split> train = WriteSplit(
      dir + "/train.libsvm", options.train_examples, 1, options.seed,
      options.signal_ranks, result.cardinalities, &counts, /*train=*/true);
  if (!train.ok()) return train.status();
  absl::StatusOr<Split> test =
      WriteSplit(dir + "/test.libsvm", options.test_examples, 2, options.seed,
                 options.signal_ranks, result.cardinalities, &counts,
                 /*train=*/false);
  if (!test.ok()) return test.status();
  result.train_ids = static_cast<int64_t>(counts.size());
  absl::StatusOr<double> auc = common::Auc(test->probabilities, test->labels);
  absl::StatusOr<double> logloss =
      common::LogLoss(test->probabilities, test->labels);
  if (!auc.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the test set is too small to have both clicks and non-clicks: ",
        auc.status().message(), "; give more --test_examples"));
  }
  if (!logloss.ok()) return logloss.status();
  result.test_auc = *auc;
  result.test_logloss = *logloss;
  // Both splits have clicks and non-clicks here, so these AUCs exist.
  result.test_auc_known_ids = *common::Auc(test->known_once, test->labels);
  result.test_auc_ids_seen_10 = *common::Auc(test->known_10, test->labels);
  result.train_ctr = train->ctr;
  result.test_ctr = test->ctr;

  const std::string json = absl::StrCat(
      "{\"seed\": ", options.seed,
      ", \"train_examples\": ", options.train_examples,
      ", \"test_examples\": ", options.test_examples,
      ", \"signal_ranks\": ", options.signal_ranks,
      ", \"dense_fields\": ", kClickDenseFields,
      ", \"categorical_fields\": ", kClickCategoricalFields,
      ", \"cardinalities\": [", absl::StrJoin(result.cardinalities, ", "),
      "], \"train_ctr\": ", result.train_ctr,
      ", \"test_ctr\": ", result.test_ctr, ", \"test_auc\": ", result.test_auc,
      ", \"test_logloss\": ", result.test_logloss,
      ", \"train_ids\": ", result.train_ids,
      ", \"test_auc_known_ids\": ", result.test_auc_known_ids,
      ", \"test_auc_ids_seen_10\": ", result.test_auc_ids_seen_10, "}\n");
  const std::string path = dir + "/planted.json";
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(
      std::fopen((path + ".partial").c_str(), "w"), &std::fclose);
  if (file == nullptr ||
      std::fwrite(json.data(), 1, json.size(), file.get()) != json.size() ||
      std::fclose(file.release()) != 0 ||
      std::rename((path + ".partial").c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot write ", path));
  }
  return result;
}

}  // namespace monsoon::tools
