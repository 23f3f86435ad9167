// ScriptWorker: a worker whose training loop belongs to someone else: a
// script (PyTorch, through the monsoon Python package) computes each step's
// gradient into one flat float32 buffer of all parameters and hands it
// over; ScriptWorker does with it what the mode's loop (worker/*_loop.cc)
// does with its own gradients, on the same ParameterClient and
// GradientPusher, so that every mode, 1-bit pushes with their residual,
// staleness options and riding out a lost shard work the same for both.
//
// A step, from the script's side:
//   1. backward pass: gradients into `grads`;
//   2. Step(grads, samples, params): true when `params` now hold the
//      shards' weights for the next step (sync; downpour and onebit with
//      n_push = n_fetch = 1; hogwild), false when the script takes its own
//      local optimizer step (downpour and onebit otherwise, easgd);
//   3. after a local step, AfterLocalStep(params): downpour's pull every
//      n_fetch steps, easgd's exchange with the centre every tau steps.
// Finish() pushes what is still summed and waits for the push in flight.
//
// `params` and `grads` are the script's memory (the model's parameters and
// gradients, viewed as flat float32 arrays): pulls land in `params` without
// a copy. CPU memory only. One thread at a time.
#ifndef MONSOON_WORKER_SCRIPT_WORKER_H_
#define MONSOON_WORKER_SCRIPT_WORKER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/types/span.h"
#include "proto/config.pb.h"
#include "worker/compute_backend.h"
#include "worker/dataset.h"
#include "worker/gradient_pusher.h"
#include "worker/parameter_client.h"
#include "worker/training_loop.h"
#include "worker/worker_counters.h"

namespace monsoon::worker {

class ScriptWorker {
 public:
  // `client` (connected with `config`, the resolved one) must outlive the
  // worker. INVALID_ARGUMENT for a config whose model is not external
  // (TrainingConfig.tensors): a script's parameters define the model.
  // `stop`, if set (and then outliving the worker), ends the waits between
  // calls with CANCELLED once notified: a lost shard ridden out, an elastic
  // worker waiting for data (the client's own stop ends its calls).
  static absl::StatusOr<std::unique_ptr<ScriptWorker>> Create(
      ParameterClient* client, const TrainingConfig& config, int rank,
      int num_workers, absl::Duration shard_lost_timeout = absl::Minutes(5),
      const absl::Notification* stop = nullptr);
  ~ScriptWorker();

  int64_t num_params() const { return num_params_; }
  // Whether Step replaces the weights itself (no local step for the script).
  bool StepReplacesParams() const;

  // The shards' current weights into `params` (num_params() values).
  absl::Status Pull(absl::Span<float> params);
  // For a call of its own on the client (a sparse table's rows,
  // PsClient::RideOut) that lost a shard: waits for the shard as a step
  // does (RideOut: up to shard_lost_timeout, a take-over with replicas),
  // then OK, to ask it again; an error that is not a lost shard, as it is.
  // Not while another thread is in a call of this worker (one thread
  // reconnects at a time).
  absl::Status RideOut(const absl::Status& lost);
  // Calls of the caller's own on the client from another thread (a row
  // push in flight): `settle` ends them, and every ride-out (this worker's
  // steps' and RideOut's) runs it before it reconnects. Null: none.
  void SetBeforeRideOut(std::function<void()> settle) {
    context_.before_ride_out = std::move(settle);
  }
  // See the file comment. `samples`: the examples the gradient sums over.
  absl::StatusOr<bool> Step(absl::Span<const float> grads, int64_t samples,
                            absl::Span<float> params);

  // Pushes during the backward pass (sync with float32 pushes; not with
  // the config's push_after_backward): the gradients grads[from, n) of the
  // step to come
  // are final and stay so until Step. Their bytes start on their way to
  // the shards (StagedPush, holding its ends), which take the push only at
  // Step, and only if Step's `samples` is the one given here and `grads`
  // and `params` the same memory; otherwise Step gives it up and pushes
  // the step whole. False where the mode pushes otherwise (Step does it
  // all). The first call of a step starts the push.
  absl::StatusOr<bool> Ready(absl::Span<const float> grads,
                             absl::Span<float> params, int64_t samples,
                             uint64_t from);
  // The largest `from` at which Ready could send anything before Step (a
  // shard's range whole, or a whole chunk of it, before backward ends), or
  // -1 where nothing can be (not sync, or 1-bit pushes, or
  // push_after_backward, or one shard holding at most one chunk): a
  // script then need not watch its gradients at all.
  int64_t OverlapFrom() const;
  // Gives up what Ready started (the gradients changed after they were said
  // final: a second backward pass, a clipped gradient): Step pushes the
  // step whole.
  void Withdraw();
  // Pushes started by Ready that Step or Withdraw gave up.
  int64_t pushes_withdrawn() const { return pushes_withdrawn_; }
  absl::Status AfterLocalStep(absl::Span<float> params);

  // The batches this worker is to train, as ps_worker's (BatchStream), of
  // a training set of `examples` (every worker's must agree):
  // - a fixed run: its rank's part (the rank-th contiguous 1/W of the set),
  //   each epoch shuffled from (seed, rank, epoch), every rank the same
  //   number of whole batches; a script started again after it died
  //   resumes after the examples the shards had applied when it connected;
  // - an elastic run (config.elastic): the data shards shard 0's queue hands
  //   this worker (server/data_queue.h), taking the next when the one held
  //   is used up, and waiting (a line every 5 s) while other workers'
  //   shards in flight may come back.
  // Each call gives the next: batch `batch` (0-based) of `epoch`'s order
  // (EpochOrder), or `finished`. Once a script takes its batches here
  // (always in an elastic run) each step trains one whole batch of them, in
  // the order given (Step checks it: the shards count the examples a
  // worker steps). Batches may be taken ahead of training (a DataLoader's
  // worker processes prefetch), except in an elastic sync run, where a
  // worker with nothing left to take steps out of the run: there each is
  // taken once the one before it was stepped (FAILED_PRECONDITION).
  struct Batch {
    bool finished = false;
    int epoch = 0;
    int64_t batch = 0;
    int64_t batches_per_epoch = 0;
    // Elastic sync: the worker left the run while it waited for data and
    // joined it again, so its weights are old: pull before the step.
    bool rejoined = false;
  };
  absl::StatusOr<Batch> NextBatch(int64_t examples);
  // The examples of `epoch` in their order, for a set of `examples`: batch
  // b is [b * batch_size, (b + 1) * batch_size). The order ps_worker uses:
  // the rank's part shuffled (fixed runs), the whole set (elastic).
  std::vector<int64_t> EpochOrder(int epoch, int64_t examples) const;
  // Elastic runs: data shards taken so far.
  int64_t data_shards() const {
    return batches_.has_value() ? batches_->data_shards() : 0;
  }
  // The last steps' sums reach the shards; the push in flight is waited for.
  absl::Status Finish(absl::Span<float> params);

  int64_t steps() const { return steps_; }
  const WorkerCounters& counters() const { return counters_; }
  // For a caller that times its own phases (its compute) into the same
  // counters.
  WorkerCounters* mutable_counters() { return &counters_; }

 private:
  ScriptWorker(ParameterClient* client, const TrainingConfig& config,
               int rank, int num_workers, absl::Duration shard_lost_timeout);
  // INVALID_ARGUMENT unless the span holds num_params() values.
  absl::Status CheckSize(const char* what, size_t size) const;
  // Step's arguments: sizes, at least one example, weights pulled first.
  absl::Status CheckStep(absl::Span<const float> grads, int64_t samples,
                         absl::Span<float> params) const;
  // Once batches are taken here (NextBatch; an elastic run always does):
  // why a step of `samples` examples may not be pushed now (OK: it may).
  absl::Status CheckBatchStep(int64_t samples) const;
  // Whether the mode pushes during backward (Ready): sync, float32, not
  // push_after_backward.
  bool PushesDuringBackward() const;
  // Pushes `steps` steps' gradient (grads plus the pusher's sum; null:
  // only the sum) without waiting, after the push in flight.
  absl::Status PushAsync(const float* grads, int64_t samples);
  // easgd: pull the centre, d = alpha (x - centre), x -= d, push d.
  absl::Status Exchange(absl::Span<float> params);

  ParameterClient* const client_;
  const TrainingConfig config_;
  const int64_t num_params_;
  std::unique_ptr<ComputeBackend> backend_;  // the host's memory
  std::unique_ptr<GradientPusher> pusher_;
  WorkerCounters counters_;
  WorkerContext context_;  // for RidingOut
  const absl::Duration timeout_;
  std::vector<int64_t> versions_;  // of the weights last pulled
  PushInFlight in_flight_;
  // The push Ready started for the step to come, and what it was told.
  std::unique_ptr<StagedPush> staged_;
  std::vector<int64_t> staged_versions_;  // its answer's
  int64_t staged_samples_ = 0;
  const float* staged_grads_ = nullptr;
  const float* staged_params_ = nullptr;
  int64_t pushes_withdrawn_ = 0;
  int64_t steps_ = 0;
  int64_t next_offset_ = 0;   // where the next step's examples begin
  int64_t first_offset_ = 0;  // of the steps being summed (downpour, easgd)
  int64_t summed_samples_ = 0;
  int since_exchange_ = 0;  // easgd
  std::vector<float> center_, elastic_;  // easgd
  // NextBatch's: the training set (its size only), its batches, and where
  // each batch given and not stepped yet begins in this rank's examples,
  // oldest first.
  Dataset batch_set_;
  std::optional<BatchStream> batches_;
  std::deque<int64_t> given_;
};

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_SCRIPT_WORKER_H_
