#include "server/sparse_table.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "common/machine_memory.h"
#include "common/sparse_ids.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "server/shard_sparse_tables.h"
#include "tests/status_matchers.h"

namespace monsoon::server {
namespace {

using ::monsoon::testutil::IsOk;
using ::monsoon::testutil::IsOkAndHolds;
using ::monsoon::testutil::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

SparseTableConfig Config(const std::string& text) {
  SparseTableConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &config))
      << text;
  return config;
}

std::unique_ptr<SparseTable> Make(const std::string& text, uint64_t seed = 1) {
  absl::StatusOr<std::unique_ptr<SparseTable>> table =
      SparseTable::Create(Config(text), seed);
  EXPECT_THAT(table, IsOk()) << text;
  return table.ok() ? *std::move(table) : nullptr;
}

std::vector<float> Row(const SparseTable& table, uint64_t id) {
  std::vector<float> out(table.dim());
  EXPECT_THAT(table.Pull({id}, absl::MakeSpan(out)), IsOk());
  return out;
}

TEST(SparseTableTest, ConfigsOutOfRangeAreRefusedNamingTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"dim: 4 max_rows: 10", "sparse table name ''"},
      {"name: 'Ads' dim: 4 max_rows: 10", "name 'Ads'"},
      {"name: 'ads' dim: 0 max_rows: 10", "dim 0 is outside [1, 4096]"},
      {"name: 'ads' dim: 4", "give max_rows"},
      {"name: 'ads' dim: 4 max_rows: 0", "max_rows 0 is outside"},
      {"name: 'ads' dim: 4 max_rows: 10 admit_probability: 0",
       "admit_probability 0 is outside (0, 1]"},
      {"name: 'ads' dim: 4 max_rows: 10 admit_min_count: 0",
       "admit_min_count 0 is outside"},
      {"name: 'ads' dim: 4 max_rows: 10 adagrad_initial_accumulator: 0",
       "adagrad_initial_accumulator 0 must be finite and above 0"},
      {"name: 'ads' dim: 4 max_rows: 10 init_scale: -1",
       "init_scale -1 is outside [0, 1000]"},
      {"name: 'ads' dim: 4 max_rows: 10 evict_unseen_steps: -1",
       "evict_unseen_steps -1 is negative"},
      {"name: 'ads' dim: 4 max_rows: 10 learning_rate: 0",
       "learning_rate 0 is outside (0, 1000]"},
  };
  for (const auto& [text, message] : cases) {
    EXPECT_THAT(SparseTable::Create(Config(text), 1),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(message)))
        << text;
  }
}

TEST(SparseTableTest, TheMemoryOfAFullTableCountsRowsStateSlotsAndIndex) {
  // Per row: the values and state (4 bytes each), the slot (16) and the
  // free list's entry (4) twice (vectors grow by doubling), the index's
  // entry (39: 17 bytes a bucket at 7/16 full), and with admission the
  // pending counts' (39).
  EXPECT_EQ(
      SparseTable::BytesAtMaxRows(Config("name: 'e' dim: 16 max_rows: 1000 "
                                         "optimizer: SPARSE_ROWWISE_ADAGRAD")),
      1000u * (4 * 17 + 40 + 39));
  EXPECT_EQ(SparseTable::BytesAtMaxRows(
                Config("name: 'e' dim: 4 max_rows: 10 optimizer: SPARSE_SGD "
                       "admit_min_count: 2")),
            10u * (4 * 4 + 40 + 39 + 39));
  EXPECT_EQ(SparseTable::BytesAtMaxRows(Config(
                "name: 'e' dim: 4 max_rows: 10 optimizer: SPARSE_ADAGRAD")),
            10u * (4 * 8 + 40 + 39));
}

TEST(SparseTableTest,
     TablesThatWouldOutgrowTheShardsMemoryAreRefusedAtTheStart) {
  TrainingConfig config;
  *config.add_sparse_tables() = Config(
      "name: 'emb' dim: 16 max_rows: 10000 optimizer: SPARSE_ROWWISE_ADAGRAD");
  *config.add_sparse_tables() =
      Config("name: 'ads' dim: 1 max_rows: 100 optimizer: SPARSE_SGD");
  config.set_sparse_buckets(64);
  // 1,470,000 + 8,300 bytes: over 1 MiB, within 2.
  EXPECT_THAT(
      ShardSparseTables::Create(config, 0, 1, /*memory_bytes=*/1 << 20),
      StatusIs(absl::StatusCode::kResourceExhausted,
               AllOf(HasSubstr("up to 1 MiB on this shard once full ('emb' 1 "
                               "MiB for max_rows 10000 of dim 16, 'ads' 0 "
                               "MiB for max_rows 100 of dim 1)"),
                     HasSubstr("more than the 1 MiB of memory"),
                     HasSubstr("Lower max_rows"))));
  EXPECT_THAT(ShardSparseTables::Create(config, 0, 1, /*memory_bytes=*/2 << 20),
              IsOk());

  // By default the bound is this process's memory, which no machine has
  // enough of for 2^31 - 1 rows of 4,096 values (35 TB).
  EXPECT_GT(common::MemoryLimitBytes(), uint64_t{1} << 20);
  EXPECT_THAT(ShardSparseTables::Create(config, 0, 1), IsOk());
  *config.add_sparse_tables() = Config(
      "name: 'huge' dim: 4096 max_rows: 2147483647 optimizer: SPARSE_SGD");
  EXPECT_THAT(ShardSparseTables::Create(config, 0, 1),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("'huge' 33716223 MiB for max_rows")));
}

TEST(SparseTableTest, UnseenRowsReadTheirIdSeededInitialValuesWithoutARow) {
  auto a = Make("name: 'emb' dim: 16 max_rows: 100");
  auto b = Make("name: 'emb' dim: 16 max_rows: 100");
  auto other_name = Make("name: 'emb2' dim: 16 max_rows: 100");
  auto other_seed = Make("name: 'emb' dim: 16 max_rows: 100", /*seed=*/2);
  const std::vector<float> row = Row(*a, 42);
  EXPECT_EQ(row, Row(*b, 42));  // whoever reads it, on any shard
  EXPECT_NE(row, Row(*a, 43));
  EXPECT_NE(row, Row(*other_name, 42));
  EXPECT_NE(row, Row(*other_seed, 42));
  for (float v : row) {  // uniform in [-1/sqrt(16), 1/sqrt(16))
    EXPECT_GE(v, -0.25f);
    EXPECT_LT(v, 0.25f);
  }
  EXPECT_FALSE(a->Contains(42));  // a pull creates nothing
  EXPECT_EQ(a->stats().rows, 0);
}

TEST(SparseTableTest, SgdStepsTheRowFromItsInitialValues) {
  auto table = Make("name: 't' dim: 2 max_rows: 10 optimizer: SPARSE_SGD");
  const std::vector<float> start = Row(*table, 5);
  absl::StatusOr<SparsePushResult> result =
      table->Push({5}, {1.0f, -2.0f}, /*learning_rate=*/0.5f, /*step=*/1);
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->created, 1);
  EXPECT_EQ(result->updated, 1);
  EXPECT_EQ(Row(*table, 5),
            (std::vector<float>{start[0] - 0.5f, start[1] + 1.0f}));
}

TEST(SparseTableTest, ATablesOwnRateWinsOverTheRunsRate) {
  auto table = Make(
      "name: 't' dim: 1 max_rows: 10 optimizer: SPARSE_SGD init_scale: 0 "
      "learning_rate: 0.25");
  ASSERT_THAT(table->Push({5}, {2.0f}, /*run_learning_rate=*/8.0f, 1), IsOk());
  EXPECT_EQ(Row(*table, 5), (std::vector<float>{-0.5f}));
}

TEST(SparseTableTest, AdagradKeepsAnAccumulatorPerValue) {
  // a = 7 + g^2: 16 and 7; w -= 1 * g / sqrt(a): -3/4 and 0.
  auto table = Make(
      "name: 't' dim: 2 max_rows: 10 optimizer: SPARSE_ADAGRAD "
      "adagrad_initial_accumulator: 7 init_scale: 0");
  ASSERT_THAT(table->Push({9}, {3.0f, 0.0f}, 1.0f, 1), IsOk());
  EXPECT_EQ(Row(*table, 9), (std::vector<float>{-0.75f, 0.0f}));
  // a = 16 + 9 + ... : second step 3 / sqrt(25) = 0.6.
  ASSERT_THAT(table->Push({9}, {3.0f, 0.0f}, 1.0f, 2), IsOk());
  EXPECT_EQ(Row(*table, 9), (std::vector<float>{-0.75f - 0.6f, 0.0f}));
}

TEST(SparseTableTest, RowWiseAdagradKeepsOneAccumulatorPerRow) {
  // a = 6 + mean(4, 16) = 16; w -= 2 * g / 4.
  auto table = Make(
      "name: 't' dim: 2 max_rows: 10 optimizer: SPARSE_ROWWISE_ADAGRAD "
      "adagrad_initial_accumulator: 6 init_scale: 0");
  ASSERT_THAT(table->Push({1}, {2.0f, 4.0f}, 2.0f, 1), IsOk());
  EXPECT_EQ(Row(*table, 1), (std::vector<float>{-1.0f, -2.0f}));
  // a = 16 + mean(9, 9) = 25: w -= 2.5 * 3 / 5 each.
  ASSERT_THAT(table->Push({1}, {3.0f, 3.0f}, 2.5f, 2), IsOk());
  EXPECT_EQ(Row(*table, 1), (std::vector<float>{-2.5f, -3.5f}));
}

TEST(SparseTableTest, BadPushesAreRefusedWholeWithNothingWritten) {
  auto table = Make("name: 't' dim: 2 max_rows: 10 optimizer: SPARSE_SGD");
  ASSERT_THAT(table->Push({1}, {1.0f, 1.0f}, 1.0f, 1), IsOk());
  const std::vector<float> before = Row(*table, 1);
  EXPECT_THAT(table->Push({1, 2}, {1.0f, 1.0f, 1.0f}, 1.0f, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a push of 2 rows of 2 values has 3 values")));
  EXPECT_THAT(table->Push({1, 2, 1}, std::vector<float>(6, 1.0f), 1.0f, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("id 1 appears twice in one push")));
  EXPECT_THAT(table->Push({1, 2}, {1.0f, 1.0f, 1.0f, NAN}, 1.0f, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the gradient of id 2 holds nan (value 1)")));
  EXPECT_THAT(table->Push({1}, {1.0f, 1.0f}, INFINITY, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("learning rate inf")));
  EXPECT_EQ(Row(*table, 1), before);
  EXPECT_FALSE(table->Contains(2));
  EXPECT_EQ(table->stats().refused_pushes, 4);
  EXPECT_EQ(table->stats().row_updates, 1);
}

TEST(SparseTableTest, AFullTableRefusesNewRowsAndKeepsServingItsOwn) {
  auto table = Make("name: 'ads' dim: 1 max_rows: 2 optimizer: SPARSE_SGD");
  ASSERT_THAT(table->Push({1, 2}, {1.0f, 1.0f}, 1.0f, 1), IsOk());
  const std::vector<float> one = Row(*table, 1);
  EXPECT_THAT(
      table->Push({1, 3}, {1.0f, 1.0f}, 1.0f, 2),
      StatusIs(absl::StatusCode::kResourceExhausted,
               HasSubstr("'ads' holds 2 rows of its max_rows 2 on this shard, "
                         "and this push would create 1 more; nothing was "
                         "applied")));
  EXPECT_EQ(Row(*table, 1), one);
  EXPECT_FALSE(table->Contains(3));
  EXPECT_THAT(table->Push({1, 2}, {1.0f, 1.0f}, 1.0f, 3), IsOk());
  EXPECT_THAT(table->Push({4, 5, 6}, {1.0f, 1.0f, 1.0f}, 1.0f, 4),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("one push of 3 rows cannot fit in max_rows 2")));
}

TEST(SparseTableTest, AtTheCapTheLeastRecentlyPushedRowsMakeRoom) {
  auto table = Make(
      "name: 't' dim: 1 max_rows: 3 optimizer: SPARSE_SGD "
      "at_max_rows: EVICT_LEAST_RECENT init_scale: 0");
  for (uint64_t id = 1; id <= 3; ++id) {
    ASSERT_THAT(table->Push({id}, {1.0f}, 1.0f, static_cast<int64_t>(id)),
                IsOk());
  }
  absl::StatusOr<SparsePushResult> result = table->Push({4}, {1.0f}, 1.0f, 4);
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->evicted, 1);
  EXPECT_FALSE(table->Contains(1));
  // Row 2 is older than 3 and 4, but in the push: 3 goes.
  ASSERT_THAT(table->Push({2, 5}, {1.0f, 1.0f}, 1.0f, 5), IsOk());
  EXPECT_TRUE(table->Contains(2));
  EXPECT_FALSE(table->Contains(3));
  EXPECT_TRUE(table->Contains(4));
  EXPECT_EQ(Row(*table, 2), std::vector<float>{-2.0f});
  EXPECT_EQ(Row(*table, 1), std::vector<float>{0.0f});  // evicted: initial
  const SparseTableStats stats = table->stats();
  EXPECT_EQ(stats.rows, 3);
  EXPECT_EQ(stats.created, 5);
  EXPECT_EQ(stats.evicted, 2);
}

TEST(SparseTableTest, RowsUnseenForTooLongAreEvicted) {
  auto table = Make(
      "name: 't' dim: 1 max_rows: 10 optimizer: SPARSE_SGD "
      "evict_unseen_steps: 2");
  ASSERT_THAT(table->Push({1}, {1.0f}, 1.0f, 1), IsOk());
  ASSERT_THAT(table->Push({2}, {1.0f}, 1.0f, 3), IsOk());
  EXPECT_EQ(table->EvictUnseen(4), 1);  // row 1: pushed before step 2
  EXPECT_FALSE(table->Contains(1));
  EXPECT_TRUE(table->Contains(2));
  EXPECT_EQ(table->EvictUnseen(5), 0);  // row 2 at 3: not before 3
  EXPECT_EQ(table->EvictUnseen(6), 1);
}

TEST(SparseTableTest, PushesSweepOutRowsUnseenForTooLongEveryTenthOfIt) {
  auto table = Make(
      "name: 't' dim: 1 max_rows: 10 optimizer: SPARSE_SGD "
      "evict_unseen_steps: 20");
  EXPECT_EQ(table->SweepEvery(), 2);
  auto push = [&](uint64_t id, int64_t step) {
    absl::StatusOr<SparsePushResult> result =
        table->Push({id}, {1.0f}, 1.0f, step);
    EXPECT_THAT(result, IsOk());
    return result.ok() ? result->evicted : -1;
  };
  EXPECT_EQ(push(1, 1), 0);   // no sweep: 1 step since 0
  EXPECT_EQ(push(2, 5), 0);   // a sweep at 5: nothing before -15
  EXPECT_EQ(push(3, 22), 1);  // a sweep at 22: row 1 (1 < 2)
  EXPECT_FALSE(table->Contains(1));
  EXPECT_EQ(push(4, 23), 0);  // no sweep: row 2 (5 < 3) is not seen yet
  EXPECT_TRUE(table->Contains(2));
  EXPECT_EQ(push(2, 24), 0);  // a sweep at 24; row 2 pushed again stays
  EXPECT_TRUE(table->Contains(2));
  EXPECT_EQ(push(4, 50), 2);  // a sweep at 50: rows 2 (24) and 3 (22)
  EXPECT_FALSE(table->Contains(2));
  EXPECT_FALSE(table->Contains(3));
  EXPECT_TRUE(table->Contains(4));
  EXPECT_EQ(table->stats().evicted, 3);
  EXPECT_EQ(table->stats().rows, 1);
}

TEST(SparseTableTest, ACopyRestoredFromASnapshotSweepsWhenTheOriginalDoes) {
  const std::string config =
      "name: 't' dim: 1 max_rows: 10 optimizer: SPARSE_SGD "
      "evict_unseen_steps: 20";
  auto original = Make(config);
  ASSERT_THAT(original->Push({1}, {1.0f}, 1.0f, 2), IsOk());
  ASSERT_THAT(original->Push({2}, {1.0f}, 1.0f, 22), IsOk());  // swept at 22
  auto copy = Make(config);
  ASSERT_THAT(copy->Restore(original->Snapshot(16), 0, 16, 16), IsOk());
  // 23 is 1 step after the original's sweep: no sweep, and row 1 (2 < 3)
  // stays in both. A copy that swept would drop it.
  for (SparseTable* table : {original.get(), copy.get()}) {
    absl::StatusOr<SparsePushResult> result =
        table->Push({3}, {1.0f}, 1.0f, 23);
    ASSERT_THAT(result, IsOk());
    EXPECT_EQ(result->evicted, 0);
    EXPECT_TRUE(table->Contains(1));
  }
  EXPECT_EQ(copy->Snapshot(16).SerializeAsString(),
            original->Snapshot(16).SerializeAsString());
  for (SparseTable* table : {original.get(), copy.get()}) {
    absl::StatusOr<SparsePushResult> result =
        table->Push({3}, {1.0f}, 1.0f, 24);
    ASSERT_THAT(result, IsOk());
    EXPECT_EQ(result->evicted, 1);
    EXPECT_FALSE(table->Contains(1));
  }
}

TEST(SparseTableTest, AnIdGetsARowOnItsMinCountthPush) {
  auto table = Make(
      "name: 't' dim: 1 max_rows: 10 optimizer: SPARSE_SGD "
      "admit_min_count: 3");
  const std::vector<float> start = Row(*table, 7);
  for (int64_t step = 1; step <= 2; ++step) {
    absl::StatusOr<SparsePushResult> result =
        table->Push({7}, {1.0f}, 1.0f, step);
    ASSERT_THAT(result, IsOk());
    EXPECT_EQ(result->not_admitted, 1);
    EXPECT_FALSE(table->Contains(7));
    EXPECT_EQ(Row(*table, 7), start);  // dropped
  }
  absl::StatusOr<SparsePushResult> third = table->Push({7}, {1.0f}, 1.0f, 3);
  ASSERT_THAT(third, IsOk());
  EXPECT_EQ(third->created, 1);
  EXPECT_EQ(Row(*table, 7), std::vector<float>{start[0] - 1.0f});
  EXPECT_EQ(table->stats().not_admitted, 2);
}

TEST(SparseTableTest, AdmissionByChanceIsReproducible) {
  const std::string text =
      "name: 't' dim: 1 max_rows: 2000 optimizer: SPARSE_SGD "
      "admit_probability: 0.25";
  auto a = Make(text);
  auto b = Make(text);
  std::vector<uint64_t> ids;
  for (uint64_t id = 0; id < 1000; ++id) ids.push_back(id);
  const std::vector<float> ones(ids.size(), 1.0f);
  absl::StatusOr<SparsePushResult> ra = a->Push(ids, ones, 1.0f, 1);
  std::vector<uint64_t> reversed(ids.rbegin(), ids.rend());
  absl::StatusOr<SparsePushResult> rb = b->Push(reversed, ones, 1.0f, 1);
  ASSERT_THAT(ra, IsOk());
  ASSERT_THAT(rb, IsOk());
  EXPECT_GT(ra->created, 200);  // a quarter of 1,000, give or take
  EXPECT_LT(ra->created, 300);
  EXPECT_EQ(ra->created, rb->created);
  for (uint64_t id : ids) EXPECT_EQ(a->Contains(id), b->Contains(id)) << id;
}

TEST(SparseTableTest, ConcurrentPushesAndPullsLoseNoUpdate) {
  // Four writers, each on its own ids; a reader pulls all along.
  auto table = Make(
      "name: 't' dim: 4 max_rows: 64 optimizer: SPARSE_SGD init_scale: 0");
  constexpr int kWriters = 4, kPushes = 250, kIds = 8;
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      std::vector<uint64_t> ids;
      for (int i = 0; i < kIds; ++i) ids.push_back(w * 100 + i);
      const std::vector<float> grads(kIds * 4, 1.0f);
      for (int p = 0; p < kPushes; ++p) {
        ASSERT_THAT(table->Push(ids, grads, 1.0f, p), IsOk());
      }
    });
  }
  threads.emplace_back([&] {
    std::vector<uint64_t> ids = {0, 100, 200, 300};
    std::vector<float> out(16);
    for (int p = 0; p < kPushes; ++p) {
      ASSERT_THAT(table->Pull(ids, absl::MakeSpan(out)), IsOk());
    }
  });
  for (std::thread& t : threads) t.join();
  for (int w = 0; w < kWriters; ++w) {
    for (int i = 0; i < kIds; ++i) {
      EXPECT_EQ(Row(*table, w * 100 + i),
                std::vector<float>(4, -static_cast<float>(kPushes)));
    }
  }
  EXPECT_EQ(table->stats().row_updates, kWriters * kPushes * kIds);
}

// Each id's row bytes (values and state) in a snapshot.
std::map<uint64_t, std::string> RowsOf(const SparseTableSnapshot& snapshot) {
  std::map<uint64_t, std::string> rows;
  const size_t bytes = snapshot.rows().size() / std::max(1, snapshot.ids_size());
  for (int i = 0; i < snapshot.ids_size(); ++i) {
    rows[snapshot.ids(i)] = snapshot.rows().substr(i * bytes, bytes);
  }
  return rows;
}

constexpr char kReshard[] =
    "name: 'emb' dim: 3 max_rows: 1000 optimizer: SPARSE_ROWWISE_ADAGRAD "
    "admit_min_count: 2";

TEST(SparseTableTest, SnapshotsRestoreBitForBitOnAnotherShardCount) {
  constexpr uint32_t kBuckets = 64;
  std::vector<std::unique_ptr<SparseTable>> two;
  for (int s = 0; s < 2; ++s) two.push_back(Make(kReshard));
  // 200 ids pushed twice (admitted on the second push, then stepped), 20
  // pushed once (pending), each on its shard of 2.
  for (int round = 0; round < 2; ++round) {
    for (uint64_t id = 0; id < 220; ++id) {
      if (id >= 200 && round == 1) continue;
      const float g = 0.1f * static_cast<float>(id % 7) - 0.3f;
      ASSERT_THAT(two[common::ShardOfId(id, kBuckets, 2)]->Push(
                      {id}, {g, 2 * g, -g}, 0.05f, round + 1),
                  IsOk());
    }
  }
  std::map<uint64_t, std::string> before;
  std::vector<SparseTableSnapshot> snapshots;
  for (const auto& table : two) {
    snapshots.push_back(table->Snapshot(kBuckets));
    for (const auto& row : RowsOf(snapshots.back())) before.insert(row);
  }
  ASSERT_EQ(before.size(), 200u);

  std::vector<std::unique_ptr<SparseTable>> three;
  int64_t restored = 0;
  for (int s = 0; s < 3; ++s) {
    three.push_back(Make(kReshard));
    const common::BucketRange range = common::BucketsOfShard(s, kBuckets, 3);
    for (const SparseTableSnapshot& snapshot : snapshots) {
      absl::StatusOr<int64_t> added =
          three[s]->Restore(snapshot, range.first, range.last, kBuckets);
      ASSERT_THAT(added, IsOk());
      restored += *added;
    }
  }
  EXPECT_EQ(restored, 200);
  std::map<uint64_t, std::string> after;
  for (int s = 0; s < 3; ++s) {
    for (const auto& [id, bytes] : RowsOf(three[s]->Snapshot(kBuckets))) {
      EXPECT_EQ(common::ShardOfId(id, kBuckets, 3), s) << id;
      after[id] = bytes;
    }
  }
  EXPECT_EQ(after, before);  // values and accumulators, bit for bit
  // The pending ids kept their count: one more push admits them.
  for (uint64_t id = 200; id < 220; ++id) {
    SparseTable& table = *three[common::ShardOfId(id, kBuckets, 3)];
    absl::StatusOr<SparsePushResult> r = table.Push({id}, {1, 1, 1}, 0.05f, 3);
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(r->created, 1) << id;
  }
}

TEST(SparseTableTest, DamagedOrForeignSnapshotsAreRefusedWithNothingAdded) {
  auto source = Make(kReshard);
  ASSERT_THAT(source->Push({1, 2}, std::vector<float>(6, 1.0f), 0.1f, 1), IsOk());
  ASSERT_THAT(source->Push({1, 2}, std::vector<float>(6, 1.0f), 0.1f, 2), IsOk());
  const SparseTableSnapshot good = source->Snapshot(16);
  ASSERT_EQ(good.ids_size(), 2);
  auto restore = [](const SparseTableSnapshot& snapshot,
                    const std::string& config = kReshard, uint32_t buckets = 16) {
    auto table = Make(config);
    absl::StatusOr<int64_t> result =
        table->Restore(snapshot, 0, buckets, buckets);
    EXPECT_EQ(table->stats().rows, result.ok() ? *result : 0);
    return result;
  };
  SparseTableSnapshot nan = good;
  float bad = NAN;
  nan.mutable_rows()->replace(4, 4, reinterpret_cast<const char*>(&bad), 4);
  EXPECT_THAT(restore(nan), StatusIs(absl::StatusCode::kDataLoss,
                                     HasSubstr("holds nan (value 1)")));
  SparseTableSnapshot zero_accumulator = good;
  float zero = 0;
  zero_accumulator.mutable_rows()->replace(12, 4,
                                           reinterpret_cast<const char*>(&zero), 4);
  EXPECT_THAT(restore(zero_accumulator),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("holds 0 as an accumulator")));
  SparseTableSnapshot cut = good;
  cut.mutable_rows()->resize(20);
  EXPECT_THAT(restore(cut), StatusIs(absl::StatusCode::kDataLoss,
                                     HasSubstr("disagree")));
  EXPECT_THAT(restore(good, "name: 'emb' dim: 4 max_rows: 1000"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("the snapshot is of table 'emb' (dim 3")));
  EXPECT_THAT(restore(good, kReshard, 32),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("places rows in 16 buckets, this run in 32")));
  EXPECT_THAT(restore(good, "name: 'emb' dim: 3 max_rows: 1"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("passes max_rows 1")));
  auto twice = Make(kReshard);
  ASSERT_THAT(twice->Restore(good, 0, 16, 16), IsOkAndHolds(2));
  EXPECT_THAT(twice->Restore(good, 0, 16, 16),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("id 1 already has a row here")));
  EXPECT_THAT(restore(good), IsOkAndHolds(2));
}

}  // namespace
}  // namespace monsoon::server
