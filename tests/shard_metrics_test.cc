#include "server/shard_metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/metrics_exporter.h"
#include "common/model_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard_sparse_tables.h"
#include "server/shard_state.h"
#include "tests/status_matchers.h"

namespace monsoon::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const common::ModelLayout& Layout() {
  static const common::ModelLayout* layout = new common::ModelLayout({6, 5, 3});
  return *layout;
}

const prometheus::MetricFamily* Find(
    const std::vector<prometheus::MetricFamily>& families,
    const std::string& name) {
  for (const auto& family : families) {
    if (family.name == name) return &family;
  }
  return nullptr;
}

// What a shard has counted, family by family.
TEST(ShardMetricsTest, EachFamilyHoldsWhatTheShardCounted) {
  ShardState state(Layout(), 1, 0, 1);
  state.RecordPush(/*staleness=*/0, /*samples=*/8, /*bytes=*/100);
  state.RecordPush(2, 8, 100);
  state.RecordPush(0, 4, 50);
  state.RecordAppliedSamples(0, 12);
  state.RecordAppliedSamples(3, 8);
  state.RecordRejectedPush(absl::StatusCode::kResourceExhausted);
  state.RecordRefusedUpdate();
  state.RecordPulledBytes(70);
  state.AdvanceVersion(3);
  const std::vector<prometheus::MetricFamily> families =
      ShardMetrics(&state).Collect();

  auto gauge = [&](const std::string& name) {
    const prometheus::MetricFamily* family = Find(families, name);
    EXPECT_NE(family, nullptr) << name;
    if (family == nullptr) return -1.0;
    EXPECT_EQ(family->type, prometheus::MetricType::Gauge) << name;
    return family->metric.at(0).gauge.value;
  };
  auto counter = [&](const std::string& name) {
    const prometheus::MetricFamily* family = Find(families, name);
    EXPECT_NE(family, nullptr) << name;
    if (family == nullptr) return -1.0;
    EXPECT_EQ(family->type, prometheus::MetricType::Counter) << name;
    return family->metric.at(0).counter.value;
  };
  EXPECT_EQ(gauge("monsoon_shard_version"), 3);
  EXPECT_EQ(counter("monsoon_shard_pushes_total"), 3);
  EXPECT_EQ(counter("monsoon_shard_rejected_pushes_total"), 1);
  EXPECT_EQ(Find(families, "monsoon_shard_rejected_pushes_total")
                ->metric.at(0)
                .label.at(0)
                .value,
            "RESOURCE_EXHAUSTED");
  EXPECT_EQ(counter("monsoon_shard_refused_updates_total"), 1);
  EXPECT_EQ(counter("monsoon_shard_pushed_bytes_total"), 250);
  EXPECT_EQ(counter("monsoon_shard_pulled_bytes_total"), 70);
  EXPECT_EQ(counter("monsoon_shard_samples_total"), 20);
  EXPECT_EQ(gauge("monsoon_shard_waiting_calls"), 0);

  const prometheus::MetricFamily* applied =
      Find(families, "monsoon_shard_samples_applied_total");
  ASSERT_NE(applied, nullptr);
  std::map<std::string, double> by_rank;
  for (const auto& metric : applied->metric) {
    ASSERT_EQ(metric.label.size(), 1u);
    EXPECT_EQ(metric.label[0].name, "rank");
    by_rank[metric.label[0].value] = metric.counter.value;
  }
  EXPECT_EQ(by_rank, (std::map<std::string, double>{{"0", 12}, {"3", 8}}));

  // Staleness 0, 2, 0: cumulative buckets le 0: 2, le 1: 2, le 2: 3.
  const prometheus::MetricFamily* staleness =
      Find(families, "monsoon_shard_push_staleness");
  ASSERT_NE(staleness, nullptr);
  EXPECT_EQ(staleness->type, prometheus::MetricType::Histogram);
  const auto& histogram = staleness->metric.at(0).histogram;
  EXPECT_EQ(histogram.sample_count, 3u);
  EXPECT_EQ(histogram.sample_sum, 2);
  std::vector<std::pair<double, uint64_t>> buckets;
  for (const auto& bucket : histogram.bucket) {
    buckets.emplace_back(bucket.upper_bound, bucket.cumulative_count);
  }
  EXPECT_THAT(buckets,
              ElementsAre(std::make_pair(0.0, 2u), std::make_pair(1.0, 2u),
                          std::make_pair(2.0, 3u)));
}

// An elastic run's shard 0: its members and its data queue.
TEST(ShardMetricsTest, AnElasticShardServesItsMembersAndDataQueue) {
  ShardState state(Layout(), 1, 0, 1);
  state.SetNumWorkers(4);
  state.SetElastic(state.MakeDataQueue(/*epochs=*/1, /*batch_size=*/4,
                                       /*shard_batches=*/2));
  ASSERT_TRUE(state.OpenSession(0, 11).ok());
  ASSERT_TRUE(state.OpenSession(1, 12).ok());
  ASSERT_TRUE(state.data_queue()->Take(1, std::nullopt, 0, 40).ok());
  state.EndSession(1, 12);
  ASSERT_TRUE(state.ReleaseData(1));
  const std::vector<prometheus::MetricFamily> families =
      ShardMetrics(&state).Collect();
  auto value = [&](const std::string& name) {
    const prometheus::MetricFamily* family = Find(families, name);
    EXPECT_NE(family, nullptr) << name;
    if (family == nullptr) return -1.0;
    const auto& metric = family->metric.at(0);
    return family->type == prometheus::MetricType::Gauge ? metric.gauge.value
                                                         : metric.counter.value;
  };
  EXPECT_EQ(value("monsoon_shard_membership_epoch"), 3);
  EXPECT_EQ(value("monsoon_shard_joins_total"), 2);
  EXPECT_EQ(value("monsoon_shard_leaves_total"), 1);
  EXPECT_EQ(value("monsoon_shard_live_ranks"), 1);
  EXPECT_EQ(value("monsoon_data_shards_done_total"), 0);
  EXPECT_EQ(value("monsoon_data_shards_requeued_total"), 1);
  EXPECT_EQ(value("monsoon_examples_trained_twice_total"), 0);
  // A shard that is not elastic serves none of them.
  ShardState fixed(Layout(), 1, 0, 1);
  EXPECT_EQ(Find(ShardMetrics(&fixed).Collect(), "monsoon_shard_joins_total"),
            nullptr);
}

// The shard's timings, workers and checkpoints, family by family.
TEST(ShardMetricsTest, TimingsWorkersAndCheckpointsAreServed) {
  ShardState state(Layout(), 1, 0, 1);
  state.EndApply(state.BeginApply());
  state.EndApply(state.BeginApply());
  state.barrier_wait_seconds().Observe(0.003);
  ASSERT_OK(state.OpenSession(1, 77));
  ASSERT_OK(state.OpenSession(4, 78));
  state.EndSession(4, 78);  // left: no longer listed or registered
  state.Touch(2);           // calls without registering
  const absl::Time written = absl::FromUnixSeconds(1795000000);
  state.RecordCheckpoint(written, absl::Milliseconds(20), /*ok=*/true);
  state.RecordCheckpoint(written + absl::Seconds(60), absl::Milliseconds(5),
                         /*ok=*/false);
  const std::vector<prometheus::MetricFamily> families =
      ShardMetrics(&state).Collect();

  auto histogram = [&](const std::string& name) {
    const prometheus::MetricFamily* family = Find(families, name);
    EXPECT_NE(family, nullptr) << name;
    if (family == nullptr) return prometheus::ClientMetric::Histogram{};
    EXPECT_EQ(family->type, prometheus::MetricType::Histogram) << name;
    return family->metric.at(0).histogram;
  };
  EXPECT_EQ(histogram("monsoon_shard_apply_seconds").sample_count, 2u);
  const auto barrier = histogram("monsoon_shard_barrier_wait_seconds");
  EXPECT_EQ(barrier.sample_count, 1u);
  EXPECT_EQ(barrier.sample_sum, 0.003);
  // 0.003 s: first in the bucket up to 5 ms.
  for (const auto& bucket : barrier.bucket) {
    EXPECT_EQ(bucket.cumulative_count, bucket.upper_bound >= 0.005 ? 1u : 0u)
        << bucket.upper_bound;
  }
  const auto checkpoint = histogram("monsoon_shard_checkpoint_seconds");
  EXPECT_EQ(checkpoint.sample_count, 2u);
  EXPECT_DOUBLE_EQ(checkpoint.sample_sum, 0.025);

  const prometheus::MetricFamily* registered =
      Find(families, "monsoon_shard_registered_workers");
  ASSERT_NE(registered, nullptr);
  EXPECT_EQ(registered->metric.at(0).gauge.value, 1);
  const prometheus::MetricFamily* last_written =
      Find(families, "monsoon_shard_last_checkpoint_timestamp_seconds");
  ASSERT_NE(last_written, nullptr);
  EXPECT_EQ(last_written->metric.at(0).gauge.value, 1795000000);
  const prometheus::MetricFamily* failures =
      Find(families, "monsoon_shard_checkpoint_failures_total");
  ASSERT_NE(failures, nullptr);
  EXPECT_EQ(failures->metric.at(0).counter.value, 1);

  const prometheus::MetricFamily* contacts =
      Find(families, "monsoon_shard_worker_last_contact_timestamp_seconds");
  ASSERT_NE(contacts, nullptr);
  std::vector<std::string> ranks;
  const double now = absl::ToUnixSeconds(absl::Now());
  for (const auto& metric : contacts->metric) {
    ASSERT_EQ(metric.label.size(), 1u);
    ranks.push_back(metric.label[0].value);
    // Just now, give or take a loaded machine.
    EXPECT_NEAR(metric.gauge.value, now, 60) << metric.label[0].value;
  }
  EXPECT_THAT(ranks, ElementsAre("1", "2"));
}

TEST(ShardMetricsTest, SparseTablesAreServedByTable) {
  ShardState state(Layout(), 1, 0, 1);
  TrainingConfig config;
  SparseTableConfig* emb = config.add_sparse_tables();
  emb->set_name("emb");
  emb->set_dim(2);
  emb->set_max_rows(3);
  emb->set_optimizer(SparseTableConfig::SPARSE_SGD);
  emb->set_admit_min_count(2);
  SparseTableConfig* ads = config.add_sparse_tables();
  ads->set_name("ads");
  ads->set_dim(4);
  ads->set_max_rows(10);
  absl::StatusOr<std::unique_ptr<ShardSparseTables>> sparse =
      ShardSparseTables::Create(config, 0, 1);
  ASSERT_TRUE(sparse.ok()) << sparse.status();
  SparseTable& table = *(*sparse)->tables()[0];
  // Ids are admitted on their second push: 1, 2 and 3 make the table full,
  // and 4's second push, which would make a fourth row, is refused.
  const std::vector<float> g(6, 1.0f);
  ASSERT_TRUE(table.Push({1, 2, 3}, g, 1, 1).ok());
  ASSERT_TRUE(table.Push({1, 2}, {g.data(), 4}, 1, 2).ok());
  ASSERT_TRUE(table.Push({3}, {g.data(), 2}, 1, 3).ok());
  ASSERT_TRUE(table.Push({4}, {g.data(), 2}, 1, 4).ok());
  ASSERT_FALSE(table.Push({4}, {g.data(), 2}, 1, 5).ok());
  const std::vector<prometheus::MetricFamily> families =
      ShardMetrics(&state, sparse->get()).Collect();
  auto value = [&](const std::string& name, const std::string& which) {
    const prometheus::MetricFamily* family = Find(families, name);
    EXPECT_NE(family, nullptr) << name;
    if (family == nullptr) return -1.0;
    for (const auto& metric : family->metric) {
      if (metric.label.size() == 1 && metric.label[0].name == "table" &&
          metric.label[0].value == which) {
        return family->type == prometheus::MetricType::Gauge
                   ? metric.gauge.value
                   : metric.counter.value;
      }
    }
    ADD_FAILURE() << name << " has no table " << which;
    return -1.0;
  };
  EXPECT_EQ(value("monsoon_shard_sparse_rows", "emb"), 3);
  EXPECT_EQ(value("monsoon_shard_sparse_rows", "ads"), 0);
  EXPECT_EQ(value("monsoon_shard_sparse_rows_created_total", "emb"), 3);
  EXPECT_EQ(value("monsoon_shard_sparse_row_updates_total", "emb"), 3);
  EXPECT_EQ(value("monsoon_shard_sparse_not_admitted_total", "emb"), 4);
  EXPECT_EQ(value("monsoon_shard_sparse_refused_pushes_total", "emb"), 1);
  EXPECT_EQ(value("monsoon_shard_sparse_rows_evicted_total", "emb"), 0);
  EXPECT_GT(value("monsoon_shard_sparse_bytes", "emb"), 0);
  // A shard without tables serves none of these.
  const std::vector<prometheus::MetricFamily> plain =
      ShardMetrics(&state).Collect();
  EXPECT_EQ(Find(plain, "monsoon_shard_sparse_rows"), nullptr);
}

// With --replicas: each of the process's two ranges, by range label.
TEST(ShardMetricsTest, ReplicasAreServedByRange) {
  ShardState own(Layout(), 1, 0, 2);
  ShardState previous(Layout(), 1, 1, 2);
  own.AdvanceVersion(5);
  ReplicationOptions options;
  options.range = 0;
  options.num_shards = 2;
  options.peer_address = "127.0.0.1:1";  // never called here
  std::unique_ptr<Replication> primary = Replication::Primary(options, 0);
  options.range = 1;
  std::unique_ptr<Replication> backup = Replication::Backup(options, 0);
  const std::vector<prometheus::MetricFamily> families =
      ReplicaMetrics({{&own, primary.get()}, {&previous, backup.get()}})
          .Collect();
  auto by_range = [&](const std::string& name) {
    std::map<std::string, double> values;
    const prometheus::MetricFamily* family = Find(families, name);
    EXPECT_NE(family, nullptr) << name;
    if (family == nullptr) return values;
    for (const prometheus::ClientMetric& metric : family->metric) {
      values[metric.label.at(0).value] =
          family->type == prometheus::MetricType::Counter
              ? metric.counter.value
              : metric.gauge.value;
    }
    return values;
  };
  using Values = std::map<std::string, double>;
  EXPECT_EQ(by_range("monsoon_replica_role"), (Values{{"0", 1}, {"1", 2}}));
  EXPECT_EQ(by_range("monsoon_replica_epoch"), (Values{{"0", 1}, {"1", 1}}));
  // The primary applied 5 updates its backup has not confirmed.
  EXPECT_EQ(by_range("monsoon_replica_lag_updates"),
            (Values{{"0", 5}, {"1", 0}}));
  EXPECT_EQ(by_range("monsoon_replica_updates_total"),
            (Values{{"0", 0}, {"1", 0}}));
  EXPECT_EQ(by_range("monsoon_replica_take_overs_total"),
            (Values{{"0", 0}, {"1", 0}}));
  EXPECT_EQ(by_range("monsoon_replica_repairs_total"),
            (Values{{"0", 0}, {"1", 0}}));
  // Nothing forwarded yet: no call opened.
  EXPECT_EQ(by_range("monsoon_replica_forward_calls_total"),
            (Values{{"0", 0}, {"1", 0}}));
  // Nor any forward timed, by range.
  const prometheus::MetricFamily* forward_seconds =
      Find(families, "monsoon_replica_forward_seconds");
  ASSERT_NE(forward_seconds, nullptr);
  EXPECT_EQ(forward_seconds->type, prometheus::MetricType::Histogram);
  ASSERT_EQ(forward_seconds->metric.size(), 2u);
  for (const prometheus::ClientMetric& metric : forward_seconds->metric) {
    EXPECT_EQ(metric.histogram.sample_count, 0u) << metric.label.at(0).value;
  }
}

TEST(ShardMetricsTest, NoCheckpointYetIsZero) {
  ShardState state(Layout(), 1, 0, 1);
  const std::vector<prometheus::MetricFamily> families =
      ShardMetrics(&state).Collect();
  const prometheus::MetricFamily* last_written =
      Find(families, "monsoon_shard_last_checkpoint_timestamp_seconds");
  ASSERT_NE(last_written, nullptr);
  EXPECT_EQ(last_written->metric.at(0).gauge.value, 0);
}

// GET `path` from 127.0.0.1:`port` over plain HTTP/1.0: the whole answer.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
      0) {
    close(fd);
    return "";
  }
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\n\r\n");
  if (write(fd, request.data(), request.size()) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string answer;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) answer.append(buffer, n);
  close(fd);
  return answer;
}

TEST(MetricsExporterTest, ServesTheFamiliesInPrometheusTextFormat) {
  ShardState state(Layout(), 1, 0, 1);
  state.RecordPush(1, 8, 100);
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<common::MetricsExporter> exporter,
      common::MetricsExporter::Start("127.0.0.1:0",
                                     {{"role", "shard"}, {"mode", "sync"}}));
  exporter->Add(std::make_shared<ShardMetrics>(&state));
  ASSERT_GT(exporter->port(), 0);
  const std::string answer = HttpGet(exporter->port(), "/metrics");
  EXPECT_THAT(answer, HasSubstr("200 OK"));
  EXPECT_THAT(answer, HasSubstr("# TYPE monsoon_shard_pushes_total counter\n"
                                "monsoon_shard_pushes_total 1\n"));
  EXPECT_THAT(
      answer,
      HasSubstr("monsoon_build_info{mode=\"sync\",role=\"shard\"} 1\n"));
  EXPECT_THAT(answer,
              HasSubstr("monsoon_shard_push_staleness_bucket{le=\"1\"} 1\n"));
  EXPECT_THAT(answer,
              HasSubstr("# TYPE process_resident_memory_bytes gauge\n"));
}

TEST(MetricsExporterTest, AnAddressThatCannotServeIsAClearError) {
  EXPECT_THAT(common::MetricsExporter::Start("127.0.0.1:99999", {}),
              testutil::StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("not HOST:PORT")));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<common::MetricsExporter> taken,
                       common::MetricsExporter::Start("127.0.0.1:0", {}));
  EXPECT_THAT(common::MetricsExporter::Start(
                  absl::StrCat("127.0.0.1:", taken->port()), {}),
              testutil::StatusIs(absl::StatusCode::kUnavailable,
                                 HasSubstr("cannot serve metrics")));
}

}  // namespace
}  // namespace monsoon::server
