// TrainingLoop: how a worker trains in one mode, one implementation per file
// (sync_loop.cc, downpour_loop.cc, easgd_loop.cc, hogwild_loop.cc,
// allreduce_loop.cc; onebit is downpour with 1-bit pushes), chosen by
// MakeTrainingLoop. Also the pieces every loop shares: the stream of batches
// over a worker's partition and the progress log.
#ifndef MONSOON_WORKER_TRAINING_LOOP_H_
#define MONSOON_WORKER_TRAINING_LOOP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "proto/config.pb.h"
#include "proto/metrics.pb.h"
#include "worker/dataset.h"
#include "worker/gradient_pusher.h"
#include "worker/model/model.h"
#include "worker/parameter_client.h"
#include "worker/ring.h"
#include "worker/worker_counters.h"

namespace monsoon::worker {

struct WorkerResult {
  int64_t steps = 0;
  int64_t samples = 0;
  double last_loss = 0;
  absl::Duration elapsed;
  // When the loop's first step began and its last step ended (InfinitePast
  // until a step has run).
  absl::Time first_step = absl::InfinitePast();
  absl::Time last_step = absl::InfinitePast();
  // When the first step ended (its push answered).
  absl::Time first_step_end = absl::InfinitePast();
  // The longest time between the ends of two consecutive steps (from the
  // loop's start for the first): how long a failure held the worker up.
  absl::Duration max_step_gap;
};

// The report a worker writes for the launchers (--report_out, a
// monsoon.WorkerReport): its steps, examples, first and last step, and the
// time of each phase that ran (from `counters`).
WorkerReport MakeWorkerReport(int rank, int64_t resumed_steps,
                              const WorkerResult& progress,
                              const WorkerCounters& counters,
                              const std::string& outcome);

// What a loop needs; nothing here is owned by the loop.
struct WorkerContext {
  TrainingConfig config;  // resolved
  int rank = 0;
  int num_workers = 1;
  const Dataset* train = nullptr;
  Model* model = nullptr;
  ParameterClient* client = nullptr;
  // Progress lines every this often (0: never).
  absl::Duration log_interval = absl::Seconds(5);
  // Notified by another thread to stop early (the loop then returns
  // CANCELLED between steps).
  const absl::Notification* stop = nullptr;
  // Steps of this worker's batches already trained and applied by the
  // servers (a restarted worker; see PlaceWorker): the loop starts after
  // them.
  int64_t resume_steps = 0;
  // Added to the offsets of the examples this worker pushes
  // (PushHeader.sample_offset; see PlaceWorker).
  int64_t sample_origin = 0;
  // If not null, kept up to date after every step, so that what was done
  // is known also when the loop ends with an error or a stop.
  WorkerResult* progress = nullptr;
  // If not null, counted at every step too (for metrics).
  WorkerCounters* counters = nullptr;
  // When the client had registered with every shard (for the report).
  absl::Time registered = absl::InfinitePast();
  // How long a loop waits for a lost shard to come back (RideOut) before
  // it gives up.
  absl::Duration shard_lost_timeout = absl::Minutes(5);
  // A straggler for experiments (ps_worker --slowdown): after each step the
  // worker waits (slowdown - 1) times that step's compute time, as measured
  // by its compute phase (counters needed), so that its steps take about
  // slowdown times as long as its peers'. 1: none.
  double slowdown = 1;
  // How the wait is spent; null: absl::SleepFor (tests record it instead).
  std::function<void(absl::Duration)> sleep;
  // allreduce only: where the ring's members meet (shard 0's rendezvous,
  // PsClient), and the address this worker's peers reach it at.
  RingRendezvous* rendezvous = nullptr;
  std::string ring_host = "127.0.0.1";
  // allreduce only: how often rank 0 publishes the weights to the shards
  // (the evaluator sees nothing newer).
  absl::Duration publish_every = absl::Seconds(1);
  // If set, called by RideOut before it reconnects: it must end the calls
  // that other threads of the caller have in flight on `client` (a
  // reconnection may move a range's connection to its backup, which a call
  // in flight reads). sparse_lr's row push in flight (sparse_rows_async).
  std::function<void()> before_ride_out;
};

// Whether a failed call lost a shard that may come back: UNAVAILABLE (it
// died, restarted, or stayed silent past the peer timeout), ABORTED (it
// came back from an older checkpoint before this worker noticed, and
// refused a push computed from weights it no longer has), or CANCELLED by
// the shard as it shut down (not by this worker's own stop).
bool ShardLost(const WorkerContext& context, const absl::Status& status);

// Waits for a lost shard: logs it, runs the context's before_ride_out,
// then reconnects to every shard
// (ParameterClient::Reconnect) for up to the context's shard_lost_timeout,
// logging while it waits. OK once every shard answers again: the loop then
// pulls afresh and repeats its step (a push the shards already applied is
// answered as a duplicate). Otherwise the error, saying which shard was
// lost and for how long.
absl::Status RideOut(const WorkerContext& context, const absl::Status& lost);

// Runs `step` until it is done: when it loses a shard, waits for the shard
// (RideOut), runs `resync` (a fresh pull) and runs the step again. Any
// other error ends it, and so does ABORTED more than kMaxAbortedInARow
// times in a row (INTERNAL: a shard that went back refuses one push).
inline constexpr int kMaxAbortedInARow = 3;
absl::Status RidingOut(const WorkerContext& context,
                       const std::function<absl::Status()>& step,
                       const std::function<absl::Status()>& resync);

// Where a worker's data starts, from what the servers reported at
// registration (ParameterClient::applied_samples): with `resume`, after the
// steps of this rank that every shard has applied (none in a fresh run), its
// example offsets continuing from there; without, the whole run again, its
// examples numbered after those applied so that the shards take them as
// new. Sets the context's resume_steps and sample_origin.
void PlaceWorker(const ParameterClient& client, const TrainingConfig& config,
                 bool resume, WorkerContext* context);

class TrainingLoop {
 public:
  virtual ~TrainingLoop() = default;
  // Trains for config.epochs over the worker's partition. Errors from the
  // servers come back with the shard named.
  virtual absl::StatusOr<WorkerResult> Run(const WorkerContext& context) = 0;
};

// The loop for `mode` (common/modes.def), or nullptr for a mode not built.
std::unique_ptr<TrainingLoop> MakeTrainingLoop(Mode mode);
// Each mode's loop: std::unique_ptr<TrainingLoop> MakeSyncLoop(); and so on.
#define MONSOON_MODE(mode, Impl) \
  std::unique_ptr<TrainingLoop> Make##Impl##Loop();
#include "common/modes.def"
#undef MONSOON_MODE

// The batches of one worker: config.epochs passes over its partition, each
// shuffled from (seed, rank, epoch). Every worker gets the same number of
// steps per epoch (the smallest partition's, in whole batches), which the
// sync barrier needs.
//
// In an elastic run (config.elastic) the batches come instead from the data
// shards that shard 0's queue hands this worker (server/data_queue.h): each
// is a run of batches of the epoch's order of the whole training set,
// shuffled from (seed, epoch); the stream asks for the next when it has
// given out a shard's last batch, saying it finished that one.
class BatchStream {
 public:
  // The next data shard, `done` the one finished, `next_offset` the
  // sample offset of the next batch: an answer SHARD or FINISHED (a WAIT
  // is waited out by the function, which sets *rejoined if the worker
  // left the run meanwhile and registered again).
  using TakeData = std::function<absl::StatusOr<TakeDataResponse>(
      const std::optional<DataShardRef>& done, int64_t next_offset,
      bool* rejoined)>;
  // The elastic stream over `data` (see above).
  static BatchStream Elastic(const Dataset* data, const TrainingConfig& config,
                             int64_t sample_origin, TakeData take);
  // Why Next() returned false, if not the end of the data (an elastic
  // stream's call to the queue failed).
  const absl::Status& status() const { return status_; }
  // Elastic: data shards taken so far.
  int64_t data_shards() const { return data_shards_; }
  // Elastic sync: whether the worker left the run to wait for data and
  // joined it again since the last call (its weights are then old: pull).
  bool TakeRejoined() { return std::exchange(rejoined_, false); }

  // INVALID_ARGUMENT when the partition holds less than one batch.
  static absl::StatusOr<BatchStream> Create(const Dataset* data,
                                            const TrainingConfig& config,
                                            int rank, int num_workers);
  // The batches of a loop's worker, after its context's resume_steps.
  static absl::StatusOr<BatchStream> ForWorker(const WorkerContext& context);

  // Moves past `steps` batches as if Next() had been called that often
  // (without copying them). False if the stream ends first.
  bool Skip(int64_t steps);

  // Copies the next batch into images()/labels(). False after the last.
  bool Next();
  const float* images() const { return images_.data(); }
  const int32_t* labels() const { return labels_.data(); }
  int batch_size() const { return batch_size_; }
  int epoch() const { return epoch_; }             // 0-based, of the last batch
  int64_t step_in_epoch() const { return step_; }  // 1-based, of the last batch
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t total_steps() const { return steps_per_epoch_ * epochs_; }
  // Where the last batch begins in this rank's data over the whole run, in
  // examples (PushHeader.sample_offset).
  int64_t sample_offset() const {
    if (take_) return origin_ + (batches_given_ - 1) * batch_size_;
    return origin_ + (epoch_ * steps_per_epoch_ + step_ - 1) * batch_size_;
  }

 private:
  BatchStream() = default;
  // Moves to the next batch (a new epoch's order when one begins); false
  // after the last.
  bool Advance();

  const Dataset* data_ = nullptr;
  Partition partition_{0, 0};
  uint64_t seed_ = 0;
  int rank_ = 0;
  int batch_size_ = 0;
  int epochs_ = 0;
  int64_t steps_per_epoch_ = 0;
  int64_t origin_ = 0;  // the context's sample_origin
  int epoch_ = -1;
  int64_t step_ = 0;
  std::vector<int64_t> order_;
  std::vector<float> images_;
  std::vector<int32_t> labels_;
  // Elastic streams only.
  // Moves to the next batch, asking for a data shard when the one held is
  // used up.
  bool AdvanceElastic();
  TakeData take_;
  absl::Status status_;
  std::optional<DataShardRef> held_;
  int64_t shard_end_ = 0;      // the held shard's end, in batches of the epoch
  int64_t batches_given_ = 0;  // by this stream, for sample_offset()
  int64_t data_shards_ = 0;
  bool rejoined_ = false;
};

// The config's learning-rate schedule at `epoch` (0-based):
// lr_decay_factor ^ floor(epoch / lr_decay_epochs), 1 without a schedule.
float LearningRateScale(const TrainingConfig& config, int epoch);

// The gradients of the stream's current batch, on the context's model,
// scaled for the batch's epoch by the config's learning-rate schedule: the
// one way every loop computes a step's gradients. `ready` (if set) hears
// of each layer's gradients as backward makes them final (Model).
absl::StatusOr<BatchResult> ComputeBatchGradients(
    const WorkerContext& context, const BatchStream& batches,
    const Model::GradientsReady& ready = nullptr);

// The batch's gradients (as ComputeBatchGradients), pushed with `pull` as
// a push-pull from `versions`: each shard's part leaves as soon as backward
// has made its range final, the last shard's first, while backward goes on
// below it, and float32 values the final end of a range before the rest
// (StagedPush; unless the config's push_after_backward), and counts in
// counters->shard_pushes_during_backward if it did. The push to
// wait on lands in *push. The answer of a shard sent early may write its
// range of pull->params while backward runs: backward no longer reads it.
absl::StatusOr<BatchResult> ComputeAndPush(
    const WorkerContext& context, const BatchStream& batches,
    GradientPusher& pusher, const std::vector<int64_t>& versions,
    const PullTarget* pull, std::unique_ptr<PendingCall>* push);

// Where a loop's pulls put the weights: straight into the model's own
// parameters where the backend keeps them in host memory (no copy), else
// into a host buffer that Commit() uploads. Not thread-safe.
class PulledParams {
 public:
  explicit PulledParams(Model* model);
  // All parameters; pull into this.
  absl::Span<float> span() { return span_; }
  // Makes the model train on what was pulled last.
  absl::Status Commit();

 private:
  Model* const model_;
  std::vector<float> host_;  // empty when pulls land in the model
  absl::Span<float> span_;
};

// Logs "worker R: epoch e/E step s/S loss ... samples/s ..." at most once per
// interval, and a summary at the end; keeps the context's `progress`.
// Construct it just before the first step: the training time starts there.
class ProgressLog {
 public:
  ProgressLog(const WorkerContext& context, const BatchStream& batches);
  void Step(double loss, int64_t samples);
  WorkerResult Finish();

 private:
  const WorkerContext& context_;
  const BatchStream& batches_;
  const absl::Time start_;
  absl::Time last_log_;
  int64_t last_samples_ = 0;
  // The compute phase's total at the last step (for the slowdown).
  double compute_seconds_ = 0;
  WorkerResult result_;
  double loss_sum_ = 0;
  int loss_count_ = 0;
};

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_TRAINING_LOOP_H_
