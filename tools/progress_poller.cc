#include "tools/progress_poller.h"

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/idx_reader.h"
#include "worker/dataset.h"

namespace monsoon::tools {

int64_t ExamplesPerEpoch(const TrainingConfig& config, int workers) {
  const int64_t batch = std::max(1, config.batch_size());
  if (config.model() == SPARSE_LR) {
    absl::StatusOr<std::string> file =
        worker::LibsvmFile(config.data_dir(), "train");
    if (!file.ok()) return 0;
    absl::StatusOr<int64_t> examples = worker::CountLibsvmExamples(*file);
    if (!examples.ok()) return 0;
    return workers * (worker::SmallestPartition(*examples, workers) / batch) *
           batch;
  }
  for (const char* name :
       {"/train-labels-idx1-ubyte.gz", "/train-labels-idx1-ubyte"}) {
    absl::StatusOr<common::IdxArray> labels =
        common::ReadIdxFile(config.data_dir() + name);
    if (!labels.ok() || labels->dims.empty()) continue;
    return workers *
           (worker::SmallestPartition(labels->dims[0], workers) / batch) *
           batch;
  }
  return 0;
}

ProgressPoller::ProgressPoller(worker::PsClientOptions client_options,
                               std::string curve_path, absl::Time start,
                               int64_t examples_per_epoch, int epochs)
    : client_options_(std::move(client_options)),
      curve_path_(std::move(curve_path)),
      start_(start),
      examples_per_epoch_(examples_per_epoch),
      epochs_(epochs),
      thread_([this] { Loop(); }) {}

ProgressPoller::~ProgressPoller() {
  stop_.Notify();
  thread_.join();
}

std::optional<RunProgressSample> ProgressPoller::Take() {
  absl::MutexLock lock(&mu_);
  std::optional<RunProgressSample> sample = std::move(latest_);
  latest_.reset();
  return sample;
}

void ProgressPoller::Loop() {
  worker::PsClientOptions client_options = client_options_;
  client_options.stop = &stop_;  // the destructor ends a Connect's wait
  std::unique_ptr<worker::PsClient> client;
  RunProgressSample sample;
  sample.epochs = epochs_;
  if (examples_per_epoch_ > 0) sample.epoch = 1;
  absl::Time last_stats;  // when `sample.samples` was read
  bool have_stats = false;
  int curve_points = 0;  // in the last curve read whole
  while (!stop_.HasBeenNotified()) {
    if (client == nullptr) {
      // A shard may be down (a fault at the start): retried next time.
      absl::StatusOr<std::unique_ptr<worker::PsClient>> connected =
          worker::PsClient::Connect(client_options);
      if (connected.ok()) client = *std::move(connected);
    }
    if (client != nullptr) {
      ReadStats(client.get(), &sample, &last_stats, &have_stats);
    }
    ReadCurve(&sample, &curve_points);
    sample.time_s = absl::ToDoubleSeconds(absl::Now() - start_);
    {
      absl::MutexLock lock(&mu_);
      latest_ = sample;
    }
    stop_.WaitForNotificationWithTimeout(absl::Seconds(1));
  }
}

void ProgressPoller::ReadStats(worker::PsClient* client,
                               RunProgressSample* sample,
                               absl::Time* last_stats, bool* have_stats) const {
  absl::StatusOr<std::vector<StatsResponse>> stats =
      client->Stats(absl::Seconds(1));
  const absl::Time now = absl::Now();
  if (!stats.ok() || stats->empty()) {
    // A shard that does not answer in a second (stopped, restarting)
    // holds up the workers too. The next answer's rate spans the gap.
    sample->samples_per_s = 0;
    return;
  }
  const StatsResponse& shard0 = (*stats)[0];
  // A shard restarted from a checkpoint may count fewer examples than
  // before: no rate across that.
  if (*have_stats && now > *last_stats && shard0.samples() >= sample->samples) {
    sample->samples_per_s = (shard0.samples() - sample->samples) /
                            absl::ToDoubleSeconds(now - *last_stats);
  }
  *have_stats = true;
  *last_stats = now;
  sample->samples = shard0.samples();
  sample->version = shard0.version();
  if (examples_per_epoch_ > 0) {
    sample->epoch = static_cast<int>(
        std::min<int64_t>(epochs_, sample->samples / examples_per_epoch_ + 1));
  }
}

void ProgressPoller::ReadCurve(RunProgressSample* sample,
                               int* curve_points) const {
  // The evaluator rewrites the file after every point, so it may be
  // missing or caught half written. A truncated point leaves a brace
  // open and does not parse; a file cut between points parses with
  // fewer points than already seen: both are skipped.
  std::ifstream in(curve_path_);
  if (!in) return;
  std::stringstream text;
  text << in.rdbuf();
  EvalCurve curve;
  if (!google::protobuf::TextFormat::ParseFromString(text.str(), &curve) ||
      curve.points_size() == 0 || curve.points_size() < *curve_points) {
    return;
  }
  *curve_points = curve.points_size();
  const EvalPoint& last = curve.points(curve.points_size() - 1);
  sample->evaluated = true;
  sample->test_accuracy = last.test_accuracy();
  sample->test_auc = last.test_auc();
  sample->eval_time_s = last.time_s();
}

}  // namespace monsoon::tools
