// Sparse logistic regression on libsvm data through a run's sparse table:
// the first model that trains rows by id. Each feature id has a one-value
// row (a table of dim 1), plus a bias row (kSparseLrBiasId); an example's
// click probability is sigmoid(bias + sum of value * row). A step pulls
// the batch's distinct rows, computes the mean log loss's gradient per row
// and pushes it: the shard's table applies its optimizer (row-wise Adagrad
// by default) at the run's learning rate, in every mode as rows arrive.
//
// Rank r of W trains lines r, r + W, r + 2W, ... of the training file,
// streamed (a file larger than memory trains), in file order.
// One thread per call.
#ifndef MONSOON_WORKER_SPARSE_LR_H_
#define MONSOON_WORKER_SPARSE_LR_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/ps_client.h"

namespace monsoon::worker {

// The bias's row: an id no libsvm file is expected to use.
inline constexpr uint64_t kSparseLrBiasId = ~uint64_t{0};

struct SparseLrOptions {
  std::string table = "weights";  // a table of dim 1
  int batch_size = 256;
  int epochs = 1;
  int rank = 0;
  int num_workers = 1;
  absl::Duration call_timeout = absl::Seconds(30);
};

struct SparseLrProgress {
  int64_t steps = 0;
  int64_t examples = 0;
  double mean_loss = 0;  // over the last epoch's examples, before each step
};

struct ClickMetrics {
  int64_t examples = 0;
  double auc = 0;
  double logloss = 0;
};

// Trains `options.epochs` passes over this rank's lines of `train_path`.
// The errors of the reader (the file and line of a malformed example) and
// of the client's calls.
absl::StatusOr<SparseLrProgress> TrainSparseLr(PsClient* client,
                                               const std::string& train_path,
                                               const SparseLrOptions& options);

// AUC and log loss on every line of `test_path`, with the shards' rows.
absl::StatusOr<ClickMetrics> EvaluateSparseLr(PsClient* client,
                                              const std::string& test_path,
                                              const SparseLrOptions& options);

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_SPARSE_LR_H_
