// Sparse logistic regression (model SPARSE_LR) on libsvm data: each feature
// id from 63 up has a one-value row in the run's table "weights"; the
// bias and the weights of ids 0 to 62 (click data's dense features) are the
// run's 64 dense parameters (common/model_config.h). An example's click
// probability is sigmoid(bias + sum of value * weight). A step pulls the
// batch's distinct rows, computes the gradient of the batch's mean log
// loss, pushes the rows' gradients (the shards' table applies its
// optimizer, row-wise Adagrad by default, at the run's learning rate, as
// they arrive) and then hands the dense gradient to a ScriptWorker, which
// does with it what the run's mode does with any dense gradient. So the
// mode decides the step's fence: in sync the dense push waits at the
// barrier, which every worker reaches only after its rows were applied, so
// the next step's rows hold every worker's last step (a barrier over the
// rows, no stale row; each worker's row gradients divided by the worker
// count, as the barrier averages the dense ones); in the asynchronous modes nothing waits and a row
// can be as stale as the other workers' pushes in between. Sync with
// sparse_rows_async (the hybrid) sends the rows on a thread of their own
// while the dense push waits at the barrier: dense synchronous, rows
// asynchronous.
//
// Rank r of W trains examples r, r + W, r + 2W, ... of the training file,
// streamed (a file larger than memory trains), in file order; every rank
// takes the same number of whole batches an epoch (the smallest share's),
// as the sync barrier needs. One thread per call.
#ifndef MONSOON_WORKER_SPARSE_LR_H_
#define MONSOON_WORKER_SPARSE_LR_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "proto/config.pb.h"
#include "worker/evaluator.h"
#include "worker/ps_client.h"
#include "worker/script_worker.h"
#include "worker/training_loop.h"

namespace monsoon::worker {

struct SparseLrOptions {
  int rank = 0;
  int num_workers = 1;
  // Progress lines every this often (0: none).
  absl::Duration log_interval = absl::Seconds(5);
  // Notified to stop between steps (Train then returns CANCELLED).
  const absl::Notification* stop = nullptr;
};

// Examples of a libsvm file in memory (a batch, or a test set evaluated
// again and again), their features split into rows (ids from 63 up) and
// dense parameters (the index into the dense part: 1 + id).
struct SparseExamples {
  std::vector<uint64_t> ids;
  std::vector<float> values;
  std::vector<size_t> starts;  // per example, then the end
  std::vector<int32_t> dense_index;
  std::vector<float> dense_values;
  std::vector<size_t> dense_starts;  // per example, then the end
  std::vector<float> labels;  // 1 for a click (label > 0.5), else 0
  size_t size() const { return labels.size(); }
};

// Every example of `path`; the reader's errors (file and line).
absl::StatusOr<SparseExamples> LoadSparseExamples(const std::string& path);

struct ClickMetrics {
  int64_t examples = 0;
  double auc = 0;
  double logloss = 0;
  double accuracy = 0;  // probability on the label's side of 0.5
};

// Trains config.epochs passes over this rank's share of `train_path` with
// config.batch_size examples a step; `dense` (made for `config`, the
// resolved SPARSE_LR config `client` connected with) takes the bias's
// gradients. `progress` (not null) is kept up to date after every step,
// and `counters` (not null) get the compute phase and the rows' pull
// and push. The reader's errors and the client's.
absl::StatusOr<WorkerResult> TrainSparseLr(PsClient* client,
                                           ScriptWorker* dense,
                                           const TrainingConfig& config,
                                           const std::string& train_path,
                                           const SparseLrOptions& options,
                                           WorkerResult* progress,
                                           WorkerCounters* counters);

// AUC, log loss and accuracy on `test` with the shards' rows and `dense`
// (kSparseLrDenseValues values), `batch_size` examples a pull.
absl::StatusOr<ClickMetrics> EvaluateSparseLr(PsClient* client,
                                              const SparseExamples& test,
                                              absl::Span<const float> dense,
                                              int batch_size,
                                              absl::Duration timeout);

// The curve's points of a SPARSE_LR run: the dense part and the test set's rows
// pulled, test_auc, test_loss (log loss) and test_accuracy.
class SparseLrEvaluator : public CurveEvaluator {
 public:
  // `client` (registered as -1) must outlive the evaluator.
  SparseLrEvaluator(PsClient* client, SparseExamples test, absl::Time start)
      : client_(client), test_(std::move(test)), start_(start) {}
  absl::StatusOr<EvalPoint> EvaluateNow() override;

 private:
  PsClient* const client_;
  const SparseExamples test_;
  const absl::Time start_;
};

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_SPARSE_LR_H_
