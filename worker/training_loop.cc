#include "worker/training_loop.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"

namespace monsoon::worker {

namespace {

double UnixSeconds(absl::Time t) {
  return t == absl::InfinitePast() ? 0 : absl::ToUnixMicros(t) * 1e-6;
}

}  // namespace

WorkerReport MakeWorkerReport(int rank, int64_t resumed_steps,
                              const WorkerResult& progress,
                              const WorkerCounters& counters,
                              const std::string& outcome) {
  WorkerReport report;
  report.set_rank(rank);
  report.set_steps(progress.steps);
  report.set_samples(progress.samples);
  report.set_resumed_steps(resumed_steps);
  report.set_first_step_unix_s(UnixSeconds(progress.first_step));
  report.set_last_step_unix_s(UnixSeconds(progress.last_step));
  report.set_first_step_end_unix_s(UnixSeconds(progress.first_step_end));
  report.set_outcome(outcome);
  for (int p = 0; p < kNumPhases; ++p) {
    const common::Histogram::Snapshot phase = counters.phases[p].Read();
    if (phase.count == 0) continue;
    PhaseTime* time = report.add_phases();
    time->set_phase(PhaseName(static_cast<Phase>(p)));
    time->set_count(static_cast<int64_t>(phase.count));
    time->set_seconds(phase.sum);
  }
  report.set_max_step_gap_s(absl::ToDoubleSeconds(progress.max_step_gap));
  report.set_ring_bytes_sent(counters.ring_bytes_sent.load());
  report.set_ring_bytes_received(counters.ring_bytes_received.load());
  report.set_shard_pushes_during_backward(
      counters.shard_pushes_during_backward.load());
  return report;
}

std::unique_ptr<TrainingLoop> MakeTrainingLoop(Mode mode) {
  switch (mode) {
#define MONSOON_MODE(mode, Impl) \
  case mode:                     \
    return Make##Impl##Loop();
#include "common/modes.def"
#undef MONSOON_MODE
    default:
      return nullptr;
  }
}

absl::StatusOr<BatchStream> BatchStream::Create(const Dataset* data,
                                                const TrainingConfig& config,
                                                int rank, int num_workers) {
  BatchStream stream;
  stream.data_ = data;
  stream.partition_ = PartitionFor(data->size, num_workers, rank);
  stream.seed_ = config.seed();
  stream.rank_ = rank;
  stream.batch_size_ = config.batch_size();
  stream.epochs_ = config.epochs();
  stream.steps_per_epoch_ =
      SmallestPartition(data->size, num_workers) / config.batch_size();
  if (stream.steps_per_epoch_ < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "each of ", num_workers, " workers gets ",
        SmallestPartition(data->size, num_workers),
        " training examples, fewer than one batch of ", config.batch_size(),
        ": lower batch_size or the worker count"));
  }
  stream.images_.resize(static_cast<size_t>(config.batch_size()) * data->dim);
  stream.labels_.resize(config.batch_size());
  return stream;
}

BatchStream BatchStream::Elastic(const Dataset* data,
                                 const TrainingConfig& config,
                                 int64_t sample_origin, TakeData take) {
  BatchStream stream;
  stream.data_ = data;
  stream.partition_ = Partition{0, data->size};
  stream.seed_ = config.seed();
  stream.rank_ = 0;  // one order per epoch for every worker
  stream.batch_size_ = config.batch_size();
  stream.epochs_ = config.epochs();
  stream.origin_ = sample_origin;
  stream.take_ = std::move(take);
  stream.images_.resize(static_cast<size_t>(config.batch_size()) * data->dim);
  stream.labels_.resize(config.batch_size());
  return stream;
}

namespace {

// An elastic worker's way to the queue: a lost shard 0 is waited for
// (RidingOut), and so are other workers' shards in flight (WAIT), with a
// line every log interval saying so. A sync worker leaves the run while it
// waits (a member that pushes nothing would hold every step up) and
// registers again when a data shard comes back.
BatchStream::TakeData QueueFor(const WorkerContext& c) {
  return [&c](const std::optional<DataShardRef>& done, int64_t next_offset,
              bool* rejoined) -> absl::StatusOr<TakeDataResponse> {
    const absl::Duration timeout = absl::Seconds(c.config.call_timeout_s());
    const absl::Time start = absl::Now();
    absl::Time logged = start;
    bool left = false;
    for (;;) {
      TakeDataResponse answer;
      auto take = [&]() -> absl::Status {
        absl::StatusOr<TakeDataResponse> next =
            c.client->TakeData(c.train->size, done, next_offset, timeout);
        if (!next.ok()) return next.status();
        answer = *std::move(next);
        return absl::OkStatus();
      };
      if (absl::Status s = RidingOut(c, take, [] { return absl::OkStatus(); });
          !s.ok()) {
        return s;
      }
      if (answer.kind() == TakeDataResponse::SHARD && left) {
        const absl::Duration log_every = c.log_interval > absl::ZeroDuration()
                                             ? c.log_interval
                                             : absl::Seconds(5);
        if (absl::Status back = c.client->Reconnect(timeout, log_every);
            !back.ok()) {
          return back;
        }
        common::Log("worker %d: a data shard came back; joined the run again",
                    c.rank);
        *rejoined = true;
      }
      if (answer.kind() != TakeDataResponse::WAIT) return answer;
      if (c.stop != nullptr && c.stop->HasBeenNotified()) {
        return absl::CancelledError("stopped");
      }
      if (c.config.mode() == SYNC && !left) {
        if (absl::Status out = c.client->Leave(timeout); !out.ok()) return out;
        left = true;
        common::Log(
            "worker %d: no data shard left to take while others train "
            "theirs; out of the steps until one comes back or the data is "
            "all trained",
            c.rank);
      }
      const absl::Time now = absl::Now();
      if (c.log_interval > absl::ZeroDuration() &&
          now - logged >= c.log_interval) {
        common::Log(
            "worker %d: no data shard left to take; waiting %.0f s so far "
            "for other workers' shards in flight (one comes back if its "
            "worker goes)",
            c.rank, absl::ToDoubleSeconds(now - start));
        logged = now;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  };
}

}  // namespace

absl::StatusOr<BatchStream> BatchStream::ForWorker(const WorkerContext& c) {
  if (c.config.elastic()) {
    return Elastic(c.train, c.config, c.sample_origin, QueueFor(c));
  }
  absl::StatusOr<BatchStream> stream =
      Create(c.train, c.config, c.rank, c.num_workers);
  if (!stream.ok()) return stream;
  stream->origin_ = c.sample_origin;
  stream->Skip(c.resume_steps);
  return stream;
}

bool ShardLost(const WorkerContext& c, const absl::Status& status) {
  if (status.code() == absl::StatusCode::kUnavailable ||
      status.code() == absl::StatusCode::kAborted) {
    return true;
  }
  return status.code() == absl::StatusCode::kCancelled &&
         !(c.stop != nullptr && c.stop->HasBeenNotified());
}

absl::Status RideOut(const WorkerContext& c, const absl::Status& lost) {
  common::LogWarning(
      "worker %d: lost a parameter server (%s); waiting up to %.0f s for it "
      "to come back",
      c.rank, lost.ToString(), absl::ToDoubleSeconds(c.shard_lost_timeout));
  if (c.before_ride_out) c.before_ride_out();
  const absl::Time start = absl::Now();
  absl::Status back = c.client->Reconnect(c.shard_lost_timeout,
                                          c.log_interval > absl::ZeroDuration()
                                              ? c.log_interval
                                              : absl::Seconds(5));
  if (!back.ok()) {
    if (back.code() == absl::StatusCode::kCancelled) return back;
    return absl::Status(
        back.code(),
        absl::StrCat("gave up after ",
                     absl::FormatDuration(
                         absl::Trunc(absl::Now() - start, absl::Seconds(1))),
                     " (--shard_lost_timeout_s): ", back.message()));
  }
  common::Log("worker %d: every shard answers again after %.1f s; carrying on",
              c.rank, absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

absl::Status RidingOut(const WorkerContext& c,
                       const std::function<absl::Status()>& step,
                       const std::function<absl::Status()>& resync) {
  absl::Status status = step();
  // A shard that went back refuses a push from newer weights once; after a
  // fresh pull the step goes through unless it went back again. Refused
  // again and again, the loop does not refresh what it pushes from.
  int aborted_in_a_row = 0;
  while (ShardLost(c, status)) {
    aborted_in_a_row =
        status.code() == absl::StatusCode::kAborted ? aborted_in_a_row + 1 : 0;
    if (aborted_in_a_row > kMaxAbortedInARow) {
      return absl::InternalError(absl::StrCat(
          "a shard refused this worker's step ", aborted_in_a_row,
          " times in a row, though the worker pulled before each retry (",
          status.message(),
          "): the worker's versions do not follow the shard's; a bug, "
          "please report it"));
    }
    if (absl::Status back = RideOut(c, status); !back.ok()) return back;
    status = resync();
    if (status.ok()) status = step();
  }
  return status;
}

void PlaceWorker(const ParameterClient& client, const TrainingConfig& config,
                 bool resume, WorkerContext* context) {
  // Elastic: the queue knows what is left to train; the rank's examples
  // are numbered on from those its shards applied.
  if (resume && !config.elastic()) {
    context->resume_steps =
        std::max<int64_t>(client.applied_samples() / config.batch_size(), 0);
    context->sample_origin = 0;
  } else {
    context->resume_steps = 0;
    context->sample_origin = client.applied_samples();
  }
}

bool BatchStream::Skip(int64_t steps) {
  for (; steps > 0; --steps) {
    if (!Advance()) return false;
  }
  return true;
}

bool BatchStream::AdvanceElastic() {
  if (!status_.ok()) return false;
  if (held_.has_value() && step_ < shard_end_) {
    ++step_;
    ++batches_given_;
    return true;
  }
  bool rejoined = false;
  absl::StatusOr<TakeDataResponse> next =
      take_(held_, origin_ + batches_given_ * batch_size_, &rejoined);
  rejoined_ |= rejoined;
  if (!next.ok()) {
    status_ = next.status();
    return false;
  }
  held_.reset();
  if (next->kind() != TakeDataResponse::SHARD) return false;
  const int epoch = next->shard().epoch();
  if (epoch < 0 || epoch >= epochs_ || next->batches() < 1 ||
      next->first_batch() < 0 ||
      (next->first_batch() + next->batches()) * batch_size_ > data_->size) {
    status_ = absl::InternalError(absl::StrCat(
        "shard 0 handed out data shard ", next->shard().index(), " of epoch ",
        epoch, " (batches ", next->first_batch(), " to ",
        next->first_batch() + next->batches(), " of ", batch_size_,
        " examples), which this worker's ", data_->size,
        " examples and ", epochs_, " epochs do not hold"));
    return false;
  }
  held_ = next->shard();
  ++data_shards_;
  if (epoch != epoch_) {
    epoch_ = epoch;
    order_ = ShuffledOrder(partition_, seed_, rank_, epoch_);
  }
  steps_per_epoch_ = next->batches_per_epoch();
  step_ = next->first_batch() + 1;
  shard_end_ = next->first_batch() + next->batches();
  ++batches_given_;
  return true;
}

bool BatchStream::Advance() {
  if (take_) return AdvanceElastic();
  if (epoch_ < 0 || step_ == steps_per_epoch_) {
    if (epoch_ + 1 >= epochs_) return false;
    ++epoch_;
    step_ = 0;
    order_ = ShuffledOrder(partition_, seed_, rank_, epoch_);
  }
  ++step_;
  return true;
}

bool BatchStream::Next() {
  if (!Advance()) return false;
  --step_;
  const int64_t first = step_ * batch_size_;
  for (int i = 0; i < batch_size_; ++i) {
    const int64_t example = order_[first + i];
    std::memcpy(images_.data() + static_cast<size_t>(i) * data_->dim,
                data_->example(example), data_->dim * sizeof(float));
    labels_[i] = data_->labels[example];
  }
  ++step_;
  return true;
}

float LearningRateScale(const TrainingConfig& config, int epoch) {
  if (config.lr_decay_epochs() <= 0 || epoch < config.lr_decay_epochs()) {
    return 1;
  }
  return static_cast<float>(std::pow(double{config.lr_decay_factor()},
                                     epoch / config.lr_decay_epochs()));
}

absl::StatusOr<BatchResult> ComputeBatchGradients(
    const WorkerContext& context, const BatchStream& batches,
    const Model::GradientsReady& ready) {
  context.model->set_gradient_scale(
      LearningRateScale(context.config, batches.epoch()));
  return context.model->ComputeGradients(batches.images(), batches.labels(),
                                         batches.batch_size(), ready);
}

absl::StatusOr<BatchResult> ComputeAndPush(
    const WorkerContext& context, const BatchStream& batches,
    GradientPusher& pusher, const std::vector<int64_t>& versions,
    const PullTarget* pull, std::unique_ptr<PendingCall>* push) {
  absl::StatusOr<std::unique_ptr<StagedPush>> staged =
      pusher.Start(context.model->device_gradients(), versions,
                   batches.batch_size(), batches.sample_offset(), pull);
  if (!staged.ok()) return staged.status();
  Model::GradientsReady ready;
  if (!context.config.push_after_backward()) {
    ready = [&staged](uint64_t from) { (*staged)->Ready(from); };
  }
  absl::StatusOr<BatchResult> step =
      ComputeBatchGradients(context, batches, ready);
  if (!step.ok()) return step.status();  // ~StagedPush waits for it
  if (context.counters != nullptr) {
    context.counters->shard_pushes_during_backward += (*staged)->sent_early();
  }
  absl::StatusOr<std::unique_ptr<PendingCall>> finished = (*staged)->Finish();
  if (!finished.ok()) return finished.status();
  *push = *std::move(finished);
  return step;
}

PulledParams::PulledParams(Model* model) : model_(model) {
  const size_t n = model->layout().num_params();
  if (model->backend()->HostMemory()) {
    span_ = absl::MakeSpan(model->device_params(), n);
  } else {
    host_.resize(n);
    span_ = absl::MakeSpan(host_);
  }
}

absl::Status PulledParams::Commit() {
  if (host_.empty()) {
    // Work queued on the parameters must not overlap the pull's writes; on
    // a host backend it has finished (loops pull between steps).
    return absl::OkStatus();
  }
  return model_->SetParams(host_);
}

ProgressLog::ProgressLog(const WorkerContext& context,
                         const BatchStream& batches)
    : context_(context),
      batches_(batches),
      start_(absl::Now()),
      last_log_(start_) {}

void ProgressLog::Step(double loss, int64_t samples) {
  if (context_.slowdown > 1 && context_.counters != nullptr) {
    const double computed =
        context_.counters->phases[static_cast<int>(Phase::kCompute)].Read().sum;
    const absl::Duration wait =
        absl::Seconds((context_.slowdown - 1) * (computed - compute_seconds_));
    compute_seconds_ = computed;
    if (wait > absl::ZeroDuration()) {
      if (context_.sleep) {
        context_.sleep(wait);
      } else {
        absl::SleepFor(wait);
      }
    }
  }
  const absl::Time now = absl::Now();
  if (result_.steps == 0) {
    result_.first_step = start_;
    result_.first_step_end = now;
  }
  result_.max_step_gap = std::max(
      result_.max_step_gap, now - (result_.steps == 0 ? start_ : result_.last_step));
  result_.last_step = now;
  ++result_.steps;
  result_.samples += samples;
  result_.last_loss = loss;
  loss_sum_ += loss;
  ++loss_count_;
  if (context_.progress != nullptr) *context_.progress = result_;
  if (WorkerCounters* counters = context_.counters; counters != nullptr) {
    counters->steps.fetch_add(1);
    counters->samples.fetch_add(samples);
    counters->last_loss.store(loss);
    counters->last_step_time.store(
        absl::ToDoubleSeconds(now - absl::UnixEpoch()));
  }
  if (context_.log_interval <= absl::ZeroDuration() ||
      now - last_log_ < context_.log_interval) {
    return;
  }
  const double seconds = absl::ToDoubleSeconds(now - last_log_);
  // Where the learning-rate schedule has taken the rates down.
  const float scale = LearningRateScale(context_.config, batches_.epoch());
  common::Log(
      "worker %d: epoch %d/%d step %d/%d loss %.4f samples/s %.0f pushed "
      "%.1f MB pulled %.1f MB%s",
      context_.rank, batches_.epoch() + 1, context_.config.epochs(),
      batches_.step_in_epoch(), batches_.steps_per_epoch(),
      loss_sum_ / loss_count_, (result_.samples - last_samples_) / seconds,
      context_.client->bytes_pushed() / 1e6,
      context_.client->bytes_pulled() / 1e6,
      scale == 1 ? "" : absl::StrFormat(" lr x%g", scale));
  last_log_ = now;
  last_samples_ = result_.samples;
  loss_sum_ = 0;
  loss_count_ = 0;
}

WorkerResult ProgressLog::Finish() {
  result_.elapsed = absl::Now() - start_;
  if (context_.progress != nullptr) *context_.progress = result_;
  const double seconds = absl::ToDoubleSeconds(result_.elapsed);
  common::Log(
      "worker %d: done: %d steps, %d samples in %.1f s (%.0f samples/s), "
      "last loss %.4f",
      context_.rank, result_.steps, result_.samples, seconds,
      seconds > 0 ? result_.samples / seconds : 0.0, result_.last_loss);
  return result_;
}

}  // namespace monsoon::worker
