#include "tools/click_data.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "common/auc.h"
#include "common/libsvm_reader.h"
#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace monsoon::tools {
namespace {

using ::monsoon::testutil::IsOk;
using ::monsoon::testutil::StatusIs;

std::string Dir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/" + name;
  mkdir(dir.c_str(), 0755);
  return dir;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

ClickDataOptions Small(uint64_t seed) {
  ClickDataOptions options;
  options.train_examples = 3000;
  options.test_examples = 2000;
  options.seed = seed;
  options.id_scale = 1e-3;
  return options;
}

TEST(ClickDataTest, LinesHaveEveryFieldInOrderWithIdsInRange) {
  const std::string dir = Dir("shape");
  absl::StatusOr<PlantedResult> planted = WriteClickData(Small(1), dir);
  ASSERT_THAT(planted, IsOk());
  const std::vector<int64_t> cardinalities = ClickCardinalities(1e-3);
  EXPECT_EQ(planted->cardinalities, cardinalities);
  EXPECT_EQ(cardinalities[2], 10131);  // C3: 10,131,227 ids at full scale
  EXPECT_EQ(cardinalities[8], 2);      // C9: 3, at least 2
  auto reader = common::LibsvmReader::Open(dir + "/train.libsvm");
  ASSERT_THAT(reader, IsOk());
  common::SparseExample e;
  int64_t lines = 0;
  std::set<uint64_t> ids;
  while (true) {
    absl::StatusOr<bool> next = (*reader)->Next(&e);
    ASSERT_THAT(next, IsOk());
    if (!*next) break;
    ++lines;
    ASSERT_TRUE(e.label == 0.0f || e.label == 1.0f);
    ASSERT_EQ(e.ids.size(), size_t{kClickDenseFields + kClickCategoricalFields});
    for (int i = 0; i < kClickDenseFields + kClickCategoricalFields; ++i) {
      ASSERT_EQ(e.fields[i], i);
      if (i < kClickDenseFields) {
        ASSERT_EQ(e.ids[i], static_cast<uint64_t>(i));
        ASSERT_GE(e.values[i], 0.0f);
      } else {
        const int f = i - kClickDenseFields;
        ASSERT_EQ(e.ids[i] >> 48, static_cast<uint64_t>(f + 1));
        ASSERT_LT(static_cast<int64_t>(e.ids[i] & ((1ull << 48) - 1)),
                  cardinalities[f]);
        ASSERT_EQ(e.values[i], 1.0f);
        ids.insert(e.ids[i]);
      }
    }
  }
  EXPECT_EQ(lines, 3000);
  // A power law: far fewer distinct ids than draws in the large fields.
  EXPECT_LT(ids.size(), size_t{3000 * 26 / 2});
}

TEST(ClickDataTest, PlantedJsonHoldsTheAucThePlantedModelReachesOnTest) {
  const std::string dir = Dir("planted");
  absl::StatusOr<PlantedResult> planted = WriteClickData(Small(3), dir);
  ASSERT_THAT(planted, IsOk());
  // The AUC recomputed from the test file with the planted logits.
  auto reader = common::LibsvmReader::Open(dir + "/test.libsvm");
  ASSERT_THAT(reader, IsOk());
  common::SparseExample e;
  std::vector<float> scores, labels;
  while (*(*reader)->Next(&e)) {
    scores.push_back(static_cast<float>(
        1.0 / (1.0 + std::exp(-PlantedLogit(3, e)))));
    labels.push_back(e.label);
  }
  ASSERT_EQ(scores.size(), 2000u);
  absl::StatusOr<double> auc = common::Auc(scores, labels);
  ASSERT_THAT(auc, IsOk());
  EXPECT_DOUBLE_EQ(*auc, planted->test_auc);
  EXPECT_GT(planted->test_auc, 0.7);  // the labels follow the model
  EXPECT_LT(planted->test_auc, 0.99);  // ... with noise
  EXPECT_GT(planted->test_ctr, 0.1);
  EXPECT_LT(planted->test_ctr, 0.5);
  const std::string json = Slurp(dir + "/planted.json");
  EXPECT_NE(json.find("\"test_examples\": 2000"), std::string::npos) << json;
  EXPECT_NE(json.find("\"test_auc\": "), std::string::npos) << json;

  // The planted model restricted to the ids the training set drew (and to
  // those drawn 10 times): recomputed from both files.
  absl::flat_hash_map<uint64_t, int> counts;
  auto train = common::LibsvmReader::Open(dir + "/train.libsvm");
  ASSERT_THAT(train, IsOk());
  while (*(*train)->Next(&e)) {
    for (size_t i = 0; i < e.ids.size(); ++i) {
      if (e.fields[i] >= kClickDenseFields) ++counts[e.ids[i]];
    }
  }
  EXPECT_EQ(planted->train_ids, static_cast<int64_t>(counts.size()));
  for (int min_count : {1, 10}) {
    reader = common::LibsvmReader::Open(dir + "/test.libsvm");
    ASSERT_THAT(reader, IsOk());
    std::vector<float> known;
    while (*(*reader)->Next(&e)) {
      for (size_t i = 0; i < e.ids.size(); ++i) {
        if (e.fields[i] < kClickDenseFields) continue;
        const auto it = counts.find(e.ids[i]);
        if (it == counts.end() || it->second < min_count) e.values[i] = 0;
      }
      known.push_back(static_cast<float>(
          1.0 / (1.0 + std::exp(-PlantedLogit(3, e)))));
    }
    absl::StatusOr<double> known_auc = common::Auc(known, labels);
    ASSERT_THAT(known_auc, IsOk());
    EXPECT_DOUBLE_EQ(*known_auc, min_count == 1
                                     ? planted->test_auc_known_ids
                                     : planted->test_auc_ids_seen_10);
  }
  // Knowing fewer weights can only cost AUC here (most ids repeat at this
  // small id scale, so the difference is small but there).
  EXPECT_LE(planted->test_auc_known_ids, planted->test_auc);
  EXPECT_LT(planted->test_auc_ids_seen_10, planted->test_auc_known_ids);
  EXPECT_NE(json.find("\"test_auc_known_ids\": "), std::string::npos) << json;
}

// One categorical id of field 3 and rank `rank`, and no other feature
// (the dense fields' values at 1 add nothing to the planted logit).
common::SparseExample OneId(uint64_t rank) {
  common::SparseExample e;
  for (int j = 0; j < kClickDenseFields; ++j) {
    e.ids.push_back(static_cast<uint64_t>(j));
    e.values.push_back(1.0f);
    e.fields.push_back(j);
  }
  e.ids.push_back((uint64_t{3} << 48) | rank);
  e.values.push_back(1.0f);
  e.fields.push_back(kClickDenseFields + 2);
  return e;
}

TEST(ClickDataTest, SignalRanksLeaveAWeightOnlyToEachFieldsMostFrequentIds) {
  // With H = 100 the ids of rank 0 to 99 weigh what they weigh with every
  // id alike, the others nothing.
  const double bias = PlantedLogit(5, common::SparseExample{}, 0);
  ASSERT_DOUBLE_EQ(bias, -1.3);
  for (auto [rank, factor] : {std::pair<uint64_t, double>{0, 1.0},
                              {99, 1.0},
                              {100, 0.0},
                              {9999, 0.0}}) {
    const double alike = PlantedLogit(5, OneId(rank), 0) - bias;
    const double scaled = PlantedLogit(5, OneId(rank), 100) - bias;
    ASSERT_NE(alike, 0.0) << rank;
    EXPECT_EQ(scaled, factor * alike) << rank;
  }

  // The file's labels follow that model: its planted AUC is what the test
  // file gives with signal_ranks, and every id with a weight was drawn for
  // training, so knowing the weights of those ids is knowing the model.
  const std::string dir = Dir("signal_ranks");
  ClickDataOptions options = Small(3);
  options.id_scale = 0.01;
  options.signal_ranks = 10;
  absl::StatusOr<PlantedResult> planted = WriteClickData(options, dir);
  ASSERT_THAT(planted, IsOk());
  auto reader = common::LibsvmReader::Open(dir + "/test.libsvm");
  ASSERT_THAT(reader, IsOk());
  common::SparseExample e;
  std::vector<float> scaled, alike, labels;
  while (*(*reader)->Next(&e)) {
    scaled.push_back(
        static_cast<float>(1.0 / (1.0 + std::exp(-PlantedLogit(3, e, 10)))));
    alike.push_back(
        static_cast<float>(1.0 / (1.0 + std::exp(-PlantedLogit(3, e, 0)))));
    labels.push_back(e.label);
  }
  EXPECT_DOUBLE_EQ(*common::Auc(scaled, labels), planted->test_auc);
  EXPECT_NE(*common::Auc(alike, labels), planted->test_auc);
  EXPECT_NE(Slurp(dir + "/planted.json").find("\"signal_ranks\": 10"),
            std::string::npos);
  options.id_scale = 0.01;
  options.signal_ranks = 0;
  absl::StatusOr<PlantedResult> every_id_alike =
      WriteClickData(options, Dir("signal_ranks_0"));
  ASSERT_THAT(every_id_alike, IsOk());
  EXPECT_DOUBLE_EQ(planted->test_auc_known_ids, planted->test_auc);
  EXPECT_LT(every_id_alike->test_auc_known_ids, every_id_alike->test_auc);
  EXPECT_EQ(every_id_alike->train_ids, planted->train_ids);  // same draws
}

TEST(ClickDataTest, TheSameSeedWritesTheSameBytes) {
  const std::string a = Dir("seed_a"), b = Dir("seed_b"), c = Dir("seed_c");
  ASSERT_THAT(WriteClickData(Small(7), a), IsOk());
  ASSERT_THAT(WriteClickData(Small(7), b), IsOk());
  ASSERT_THAT(WriteClickData(Small(8), c), IsOk());
  EXPECT_EQ(Slurp(a + "/train.libsvm"), Slurp(b + "/train.libsvm"));
  EXPECT_EQ(Slurp(a + "/planted.json"), Slurp(b + "/planted.json"));
  EXPECT_NE(Slurp(a + "/train.libsvm"), Slurp(c + "/train.libsvm"));
}

TEST(ClickDataTest, BadOptionsAreRefused) {
  ClickDataOptions options = Small(1);
  options.id_scale = 2;
  EXPECT_THAT(WriteClickData(options, Dir("bad")),
              StatusIs(absl::StatusCode::kInvalidArgument));
  options = Small(1);
  options.test_examples = 0;
  EXPECT_THAT(WriteClickData(options, Dir("bad")),
              StatusIs(absl::StatusCode::kInvalidArgument));
  options = Small(1);
  options.signal_ranks = -1;
  EXPECT_THAT(WriteClickData(options, Dir("bad")),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(WriteClickData(Small(1), "/nonexistent/dir"),
              StatusIs(absl::StatusCode::kUnavailable));
}

}  // namespace
}  // namespace monsoon::tools
