#include "worker/sparse_lr.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/auc.h"
#include "common/libsvm_reader.h"
#include "common/log.h"
#include "common/model_config.h"
#include "worker/dataset.h"

namespace monsoon::worker {
namespace {

constexpr uint64_t kDenseIds = common::kSparseLrDenseValues - 1;

void Clear(SparseExamples* batch) {
  batch->ids.clear();
  batch->values.clear();
  batch->starts.assign(1, 0);
  batch->dense_index.clear();
  batch->dense_values.clear();
  batch->dense_starts.assign(1, 0);
  batch->labels.clear();
}

void Add(const common::SparseExample& e, SparseExamples* batch) {
  for (size_t f = 0; f < e.ids.size(); ++f) {
    if (e.ids[f] < kDenseIds) {
      batch->dense_index.push_back(1 + static_cast<int32_t>(e.ids[f]));
      batch->dense_values.push_back(e.values[f]);
    } else {
      batch->ids.push_back(e.ids[f]);
      batch->values.push_back(e.values[f]);
    }
  }
  batch->starts.push_back(batch->ids.size());
  batch->dense_starts.push_back(batch->dense_index.size());
  batch->labels.push_back(e.label > 0.5f ? 1.0f : 0.0f);
}

// Examples [first, last) of `set`: their rows from the shards into `rows`,
// and their click probabilities with `dense` into `p`.
absl::Status PullAndPredict(PsClient* client, const SparseExamples& set,
                            size_t first, size_t last,
                            absl::Span<const float> dense,
                            absl::Duration timeout, std::vector<float>* rows,
                            std::vector<float>* p,
                            const PsClient::RideOut& ride_out = nullptr) {
  const size_t begin = set.starts[first], end = set.starts[last];
  rows->resize(end - begin);
  if (absl::Status s = client->SparsePull(
          common::kSparseLrTable,
          absl::MakeConstSpan(set.ids).subspan(begin, end - begin),
          absl::MakeSpan(*rows), timeout, ride_out);
      !s.ok()) {
    return s;
  }
  p->resize(last - first);
  for (size_t e = first; e < last; ++e) {
    double logit = dense[0];
    for (size_t f = set.dense_starts[e]; f < set.dense_starts[e + 1]; ++f) {
      logit += static_cast<double>(set.dense_values[f]) * dense[set.dense_index[f]];
    }
    for (size_t f = set.starts[e]; f < set.starts[e + 1]; ++f) {
      logit += static_cast<double>(set.values[f]) * (*rows)[f - begin];
    }
    (*p)[e - first] = static_cast<float>(1.0 / (1.0 + std::exp(-logit)));
  }
  return absl::OkStatus();
}

// A rank's batches over a streamed file: every W-th example, skipped
// without parsing, `steps` whole batches an epoch.
class BatchReader {
 public:
  BatchReader(std::string path, int rank, int num_workers, int batch_size)
      : path_(std::move(path)),
        rank_(rank),
        num_workers_(num_workers),
        batch_size_(batch_size) {}

  absl::Status StartEpoch() {
    absl::StatusOr<std::unique_ptr<common::LibsvmReader>> reader =
        common::LibsvmReader::Open(path_);
    if (!reader.ok()) return reader.status();
    reader_ = *std::move(reader);
    next_ = 0;
    return absl::OkStatus();
  }

  // The next batch into *batch; FAILED_PRECONDITION if the file ends
  // first (it changed since it was counted).
  absl::Status Next(SparseExamples* batch) {
    Clear(batch);
    while (batch->size() < static_cast<size_t>(batch_size_)) {
      absl::StatusOr<bool> more = next_++ % num_workers_ == rank_
                                      ? reader_->Next(&example_)
                                      : reader_->Skip();
      if (!more.ok()) return more.status();
      if (!*more) {
        return absl::FailedPreconditionError(absl::StrCat(
            path_, " ended after ", next_ - 1,
            " examples, fewer than when it was counted: was it rewritten "
            "during the run?"));
      }
      if ((next_ - 1) % num_workers_ == rank_) Add(example_, batch);
    }
    return absl::OkStatus();
  }

 private:
  const std::string path_;
  const int rank_, num_workers_, batch_size_;
  std::unique_ptr<common::LibsvmReader> reader_;
  int64_t next_ = 0;  // examples read or skipped this epoch
  common::SparseExample example_;
};

// A step's row push sent on its own thread (sparse_rows_async), at most one
// in flight: the next waits for it. A push that lost a shard is ridden out
// on the caller's thread (one thread reconnects) and sent again, with the
// same number, where it failed. A ride-out of the dense part's first ends
// the push in flight (Settle): a reconnection may move a range's
// connection to its backup, which the push's thread reads.
class RowPushInFlight {
 public:
  // While it lives, `dense`'s ride-outs settle the push in flight first.
  RowPushInFlight(PsClient* client, ScriptWorker* dense, absl::Duration timeout,
                  PsClient::RideOut ride_out)
      : client_(client),
        dense_(dense),
        timeout_(timeout),
        ride_out_(std::move(ride_out)) {
    dense_->SetBeforeRideOut([this] { Settle(); });
  }
  ~RowPushInFlight() {
    Settle();
    dense_->SetBeforeRideOut(nullptr);
  }

  // Waits for the push in flight to end; its outcome is Wait's.
  void Settle() {
    if (thread_.joinable()) thread_.join();
  }

  // The push in flight's outcome (OK when there is none), sent again where
  // it lost a shard.
  absl::Status Wait() {
    if (!started_) return absl::OkStatus();
    Settle();
    started_ = false;
    if (status_.ok()) return status_;
    if (absl::Status back = ride_out_(status_); !back.ok()) return back;
    return client_->SparsePush(common::kSparseLrTable, ids_, grads_, timeout_,
                               nullptr, ride_out_, seq_);
  }

  // Waits for the push in flight (its error ends here), then sends this
  // one.
  absl::Status Start(std::vector<uint64_t> ids, std::vector<float> grads) {
    if (absl::Status s = Wait(); !s.ok()) return s;
    ids_ = std::move(ids);
    grads_ = std::move(grads);
    seq_ = client_->NextRowPushSeq();
    started_ = true;
    thread_ = std::thread([this] {
      status_ = client_->SparsePush(common::kSparseLrTable, ids_, grads_,
                                    timeout_, nullptr, nullptr, seq_);
    });
    return absl::OkStatus();
  }

 private:
  PsClient* const client_;
  ScriptWorker* const dense_;
  const absl::Duration timeout_;
  const PsClient::RideOut ride_out_;
  std::thread thread_;
  bool started_ = false;  // a push whose outcome Wait has not taken
  std::vector<uint64_t> ids_;
  std::vector<float> grads_;
  uint64_t seq_ = 0;
  absl::Status status_;  // written by thread_, read after joining it
};

}  // namespace

absl::StatusOr<SparseExamples> LoadSparseExamples(const std::string& path) {
  absl::StatusOr<std::unique_ptr<common::LibsvmReader>> reader =
      common::LibsvmReader::Open(path);
  if (!reader.ok()) return reader.status();
  SparseExamples set;
  Clear(&set);
  common::SparseExample example;
  while (true) {
    absl::StatusOr<bool> more = (*reader)->Next(&example);
    if (!more.ok()) return more.status();
    if (!*more) return set;
    Add(example, &set);
  }
}

absl::StatusOr<WorkerResult> TrainSparseLr(PsClient* client,
                                           ScriptWorker* dense,
                                           const TrainingConfig& config,
                                           const std::string& train_path,
                                           const SparseLrOptions& options,
                                           WorkerResult* progress,
                                           WorkerCounters* counters) {
  if (options.num_workers < 1 || options.rank < 0 ||
      options.rank >= options.num_workers ||
      dense->num_params() != common::kSparseLrDenseValues) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sparse_lr: rank in [0, workers), and a dense part of ",
        common::kSparseLrDenseValues, " values"));
  }
  absl::StatusOr<int64_t> examples = CountLibsvmExamples(train_path);
  if (!examples.ok()) return examples.status();
  const int batch_size = config.batch_size();
  const int64_t steps_per_epoch =
      SmallestPartition(*examples, options.num_workers) / batch_size;
  if (steps_per_epoch < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        train_path, " holds ", *examples, " examples: fewer than one batch of ",
        batch_size, " for each of ", options.num_workers,
        " workers; lower batch_size or give more data"));
  }
  const absl::Duration timeout = absl::Seconds(config.call_timeout_s());
  std::vector<float> params(common::kSparseLrDenseValues);
  std::vector<float> dense_grads(params.size());
  if (absl::Status s = dense->Pull(absl::MakeSpan(params)); !s.ok()) {
    return s;
  }
  *progress = WorkerResult();
  const absl::Time start = absl::Now();
  absl::Time last_log = start;
  BatchReader reader(train_path, options.rank, options.num_workers,
                     batch_size);
  SparseExamples batch;
  std::vector<float> rows, p, grads;
  // A lost shard is waited for as the dense part's steps wait for it.
  const PsClient::RideOut ride_out = [dense](const absl::Status& lost) {
    return dense->RideOut(lost);
  };
  RowPushInFlight rows_in_flight(client, dense, timeout, ride_out);
  for (int epoch = 0; epoch < config.epochs(); ++epoch) {
    if (absl::Status s = reader.StartEpoch(); !s.ok()) return s;
    const float scale = LearningRateScale(config, epoch) /
                        static_cast<float>(batch_size);
    // Sync averages the workers' dense gradients at the barrier; rows take
    // each worker's push as it comes, so each brings its share.
    const float row_scale =
        config.mode() == SYNC ? 1.0f / static_cast<float>(options.num_workers)
                              : 1.0f;
    double loss_sum = 0;
    for (int64_t step = 1; step <= steps_per_epoch; ++step) {
      if (options.stop != nullptr && options.stop->HasBeenNotified()) {
        return absl::CancelledError("stopped between steps");
      }
      const absl::Time step_start = absl::Now();
      if (progress->first_step == absl::InfinitePast()) {
        progress->first_step = step_start;
      }
      PhaseTimer compute(counters, Phase::kCompute);
      if (absl::Status s = reader.Next(&batch); !s.ok()) return s;
      compute.Pause();
      {
        PhaseTimer pull(counters, Phase::kPull);
        if (absl::Status s =
                PullAndPredict(client, batch, 0, batch.size(), params, timeout,
                               &rows, &p, ride_out);
            !s.ok()) {
          return s;
        }
      }
      compute.Resume();
      grads.resize(batch.ids.size());
      std::fill(dense_grads.begin(), dense_grads.end(), 0.0f);
      double batch_loss = 0;
      for (size_t e = 0; e < batch.size(); ++e) {
        const float y = batch.labels[e];
        const double q = std::clamp(static_cast<double>(p[e]), 1e-7, 1 - 1e-7);
        batch_loss -= y > 0.5f ? std::log(q) : std::log(1 - q);
        const float d = (p[e] - y) * scale;
        dense_grads[0] += d;
        for (size_t f = batch.dense_starts[e]; f < batch.dense_starts[e + 1];
             ++f) {
          dense_grads[batch.dense_index[f]] += d * batch.dense_values[f];
        }
        for (size_t f = batch.starts[e]; f < batch.starts[e + 1]; ++f) {
          grads[f] = d * row_scale * batch.values[f];
        }
      }
      compute.Pause();
      {
        // The client sums the gradients of repeated ids. Asynchronous rows
        // go while the dense part's step runs (its time here: the wait for
        // the last step's rows).
        PhaseTimer push(counters, Phase::kPush);
        absl::Status pushed =
            config.sparse_rows_async()
                ? rows_in_flight.Start(batch.ids, std::move(grads))
                : client->SparsePush(common::kSparseLrTable, batch.ids, grads,
                                     timeout, nullptr, ride_out);
        if (!pushed.ok()) return pushed;
      }
      absl::StatusOr<bool> replaced =
          dense->Step(dense_grads, batch_size, absl::MakeSpan(params));
      if (!replaced.ok()) return replaced.status();
      if (!*replaced) {
        // The local step (downpour pushing every n_push steps, easgd).
        for (size_t i = 0; i < params.size(); ++i) {
          params[i] -= config.local_learning_rate() * dense_grads[i];
        }
        if (absl::Status s = dense->AfterLocalStep(absl::MakeSpan(params));
            !s.ok()) {
          return s;
        }
      }
      const absl::Time now = absl::Now();
      batch_loss /= static_cast<double>(batch.size());
      loss_sum += batch_loss;
      if (progress->steps == 0) progress->first_step_end = now;
      progress->max_step_gap =
          std::max(progress->max_step_gap,
                   now - (progress->steps == 0 ? start : progress->last_step));
      ++progress->steps;
      progress->samples += batch_size;
      progress->last_loss = batch_loss;
      progress->last_step = now;
      progress->elapsed = now - start;
      counters->last_loss.store(batch_loss);
      counters->last_step_time.store(absl::ToDoubleSeconds(now - absl::UnixEpoch()));
      if (options.log_interval > absl::ZeroDuration() &&
          now - last_log >= options.log_interval) {
        last_log = now;
        common::Log(
            "worker %d: epoch %d/%d step %d/%d loss %.4f (epoch mean %.4f) "
            "%.0f samples/s, bias %.4f",
            options.rank, epoch + 1, config.epochs(), step, steps_per_epoch,
            batch_loss, loss_sum / static_cast<double>(step),
            static_cast<double>(progress->samples) /
                absl::ToDoubleSeconds(now - start),
            params[0]);
      }
    }
  }
  if (absl::Status s = rows_in_flight.Wait(); !s.ok()) return s;
  if (absl::Status s = dense->Finish(absl::MakeSpan(params)); !s.ok()) {
    return s;
  }
  progress->elapsed = absl::Now() - start;
  common::Log("worker %d: done: %d steps, %d examples in %.1f s, last loss %.4f",
              options.rank, progress->steps, progress->samples,
              absl::ToDoubleSeconds(progress->elapsed), progress->last_loss);
  return *progress;
}

absl::StatusOr<ClickMetrics> EvaluateSparseLr(PsClient* client,
                                              const SparseExamples& test,
                                              absl::Span<const float> dense,
                                              int batch_size,
                                              absl::Duration timeout) {
  if (test.size() == 0 || batch_size < 1 ||
      dense.size() != common::kSparseLrDenseValues) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an evaluation needs examples, a batch of at least 1 and ",
        common::kSparseLrDenseValues, " dense values"));
  }
  std::vector<float> scores, rows, p;
  scores.reserve(test.size());
  for (size_t first = 0; first < test.size(); first += batch_size) {
    const size_t last = std::min(test.size(), first + batch_size);
    if (absl::Status s =
            PullAndPredict(client, test, first, last, dense, timeout, &rows, &p);
        !s.ok()) {
      return s;
    }
    scores.insert(scores.end(), p.begin(), p.end());
  }
  absl::StatusOr<double> auc = common::Auc(scores, test.labels);
  if (!auc.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the test set cannot rank clicks: ", auc.status().message()));
  }
  absl::StatusOr<double> logloss = common::LogLoss(scores, test.labels);
  if (!logloss.ok()) return logloss.status();
  int64_t right = 0;
  for (size_t e = 0; e < scores.size(); ++e) {
    right += (scores[e] > 0.5f) == (test.labels[e] > 0.5f);
  }
  return ClickMetrics{static_cast<int64_t>(scores.size()), *auc, *logloss,
                      static_cast<double>(right) /
                          static_cast<double>(scores.size())};
}

absl::StatusOr<EvalPoint> SparseLrEvaluator::EvaluateNow() {
  std::vector<float> dense(common::kSparseLrDenseValues);
  absl::StatusOr<EvalPoint> point =
      PullSnapshot(client_, absl::MakeSpan(dense), start_);
  if (!point.ok()) return point.status();
  // Batches of 4096: a pull per batch, its repeated ids asked once.
  absl::StatusOr<ClickMetrics> metrics =
      EvaluateSparseLr(client_, test_, dense, 4096, absl::Seconds(30));
  if (!metrics.ok()) return metrics.status();
  point->set_test_accuracy(metrics->accuracy);
  point->set_test_loss(metrics->logloss);
  point->set_test_auc(metrics->auc);
  return point;
}

}  // namespace monsoon::worker
