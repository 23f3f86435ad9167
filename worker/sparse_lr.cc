#include "worker/sparse_lr.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/auc.h"
#include "common/libsvm_reader.h"
#include "worker/sparse_rows.h"

namespace monsoon::worker {
namespace {

// A batch's examples: each feature's id and value, one after the other,
// with where each example's features start; every example also reads the
// bias row.
struct Batch {
  std::vector<uint64_t> ids;
  std::vector<float> values;
  std::vector<size_t> starts;  // per example, then the end
  std::vector<float> labels;
  void Clear() {
    ids.clear();
    values.clear();
    starts.assign(1, 0);
    labels.clear();
  }
  void Add(const common::SparseExample& e) {
    ids.insert(ids.end(), e.ids.begin(), e.ids.end());
    values.insert(values.end(), e.values.begin(), e.values.end());
    ids.push_back(kSparseLrBiasId);
    values.push_back(1.0f);
    starts.push_back(ids.size());
    labels.push_back(e.label > 0.5f ? 1.0f : 0.0f);
  }
  size_t size() const { return labels.size(); }
};

// The batch's click probabilities from its rows (one per feature).
std::vector<float> Probabilities(const Batch& batch,
                                 const std::vector<float>& rows) {
  std::vector<float> p(batch.size());
  for (size_t e = 0; e < batch.size(); ++e) {
    double logit = 0;
    for (size_t f = batch.starts[e]; f < batch.starts[e + 1]; ++f) {
      logit += static_cast<double>(batch.values[f]) * rows[f];
    }
    p[e] = static_cast<float>(1.0 / (1.0 + std::exp(-logit)));
  }
  return p;
}

// The batch's rows from the shards, and its click probabilities.
absl::Status PullAndPredict(PsClient* client, const SparseLrOptions& options,
                            const Batch& batch, std::vector<float>* p) {
  std::vector<float> rows(batch.ids.size());
  if (absl::Status s = client->SparsePull(options.table, batch.ids,
                                          absl::MakeSpan(rows),
                                          options.call_timeout);
      !s.ok()) {
    return s;
  }
  *p = Probabilities(batch, rows);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SparseLrProgress> TrainSparseLr(PsClient* client,
                                               const std::string& train_path,
                                               const SparseLrOptions& options) {
  if (options.batch_size < 1 || options.epochs < 1 || options.num_workers < 1 ||
      options.rank < 0 || options.rank >= options.num_workers) {
    return absl::InvalidArgumentError(
        "sparse_lr: batch_size and epochs at least 1, rank in [0, workers)");
  }
  SparseLrProgress progress;
  Batch batch;
  common::SparseExample example;
  for (int epoch = 0; epoch < options.epochs; ++epoch) {
    absl::StatusOr<std::unique_ptr<common::LibsvmReader>> reader =
        common::LibsvmReader::Open(train_path);
    if (!reader.ok()) return reader.status();
    double loss_sum = 0;
    int64_t loss_examples = 0;
    int64_t line = 0;
    batch.Clear();
    while (true) {
      absl::StatusOr<bool> more = (*reader)->Next(&example);
      if (!more.ok()) return more.status();
      if (*more) {
        if (line++ % options.num_workers != options.rank) continue;
        batch.Add(example);
        if (batch.size() < static_cast<size_t>(options.batch_size)) continue;
      }
      if (batch.size() > 0) {
        // A step: the batch's rows, the gradient of its mean log loss.
        std::vector<float> p;
        if (absl::Status s = PullAndPredict(client, options, batch, &p);
            !s.ok()) {
          return s;
        }
        std::vector<float> grads(batch.ids.size());
        const float scale = 1.0f / static_cast<float>(batch.size());
        for (size_t e = 0; e < batch.size(); ++e) {
          const float y = batch.labels[e];
          const double q =
              std::clamp(static_cast<double>(p[e]), 1e-7, 1 - 1e-7);
          loss_sum -= y > 0.5f ? std::log(q) : std::log(1 - q);
          for (size_t f = batch.starts[e]; f < batch.starts[e + 1]; ++f) {
            grads[f] = (p[e] - y) * batch.values[f] * scale;
          }
        }
        loss_examples += static_cast<int64_t>(batch.size());
        // The client sums the gradients of repeated ids.
        if (absl::Status s = client->SparsePush(options.table, batch.ids,
                                                grads, options.call_timeout);
            !s.ok()) {
          return s;
        }
        ++progress.steps;
        progress.examples += static_cast<int64_t>(batch.size());
        batch.Clear();
      }
      if (!*more) break;
    }
    progress.mean_loss =
        loss_examples > 0 ? loss_sum / static_cast<double>(loss_examples) : 0;
  }
  return progress;
}

absl::StatusOr<ClickMetrics> EvaluateSparseLr(PsClient* client,
                                              const std::string& test_path,
                                              const SparseLrOptions& options) {
  absl::StatusOr<std::unique_ptr<common::LibsvmReader>> reader =
      common::LibsvmReader::Open(test_path);
  if (!reader.ok()) return reader.status();
  std::vector<float> scores, labels;
  Batch batch;
  batch.Clear();
  common::SparseExample example;
  while (true) {
    absl::StatusOr<bool> more = (*reader)->Next(&example);
    if (!more.ok()) return more.status();
    if (*more) batch.Add(example);
    if (batch.size() > 0 &&
        (!*more || batch.size() == static_cast<size_t>(options.batch_size))) {
      std::vector<float> p;
      if (absl::Status s = PullAndPredict(client, options, batch, &p);
          !s.ok()) {
        return s;
      }
      scores.insert(scores.end(), p.begin(), p.end());
      labels.insert(labels.end(), batch.labels.begin(), batch.labels.end());
      batch.Clear();
    }
    if (!*more) break;
  }
  absl::StatusOr<double> auc = common::Auc(scores, labels);
  if (!auc.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(test_path, ": ", auc.status().message()));
  }
  absl::StatusOr<double> logloss = common::LogLoss(scores, labels);
  if (!logloss.ok()) return logloss.status();
  return ClickMetrics{static_cast<int64_t>(scores.size()), *auc, *logloss};
}

}  // namespace monsoon::worker
