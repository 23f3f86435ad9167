#include "worker/script_worker.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/model_layout.h"
#include "common/wire.h"
#include "worker/cpu_backend.h"

namespace monsoon::worker {
namespace {

bool Overlapped(const TrainingConfig& c) {
  return (c.mode() == DOWNPOUR || c.mode() == ONEBIT) &&
         (c.n_push() > 1 || c.n_fetch() > 1);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ScriptWorker>> ScriptWorker::Create(
    ParameterClient* client, const TrainingConfig& config, int rank,
    int num_workers, absl::Duration shard_lost_timeout,
    const absl::Notification* stop) {
  if (config.tensors_size() == 0) {
    return absl::InvalidArgumentError(
        "the run's config has no `tensors`: a script's model must be the "
        "run's model (write the config with monsoon.torch.export_layout and "
        "start the shards with it)");
  }
  if (absl::Status open = common::CheckScriptMode(config.mode()); !open.ok()) {
    return open;
  }
  std::unique_ptr<ScriptWorker> worker(new ScriptWorker(
      client, config, rank, num_workers, shard_lost_timeout));
  absl::StatusOr<std::unique_ptr<GradientPusher>> pusher =
      GradientPusher::Create(worker->backend_.get(), client, config,
                             &worker->counters_);
  if (!pusher.ok()) return pusher.status();
  worker->pusher_ = *std::move(pusher);
  worker->context_.stop = stop;
  return worker;
}

ScriptWorker::ScriptWorker(ParameterClient* client,
                           const TrainingConfig& config, int rank,
                           int num_workers, absl::Duration shard_lost_timeout)
    : client_(client),
      config_(config),
      num_params_(static_cast<int64_t>(
          common::ModelLayout::FromConfig(config).num_params())),
      backend_(MakeCpuBackend()),
      timeout_(absl::Seconds(config.call_timeout_s())),
      next_offset_(client->applied_samples()) {
  context_.config = config;
  context_.rank = rank;
  context_.num_workers = num_workers;
  context_.client = client;
  context_.counters = &counters_;
  context_.shard_lost_timeout = shard_lost_timeout;
}

ScriptWorker::~ScriptWorker() { in_flight_.Finish().IgnoreError(); }

absl::StatusOr<bool> ScriptWorker::Ready(absl::Span<const float> grads,
                                         absl::Span<float> params,
                                         int64_t samples, uint64_t from) {
  if (!PushesDuringBackward()) return false;
  if (auto s = CheckStep(grads, samples, params); !s.ok()) return s;
  if (from >= static_cast<uint64_t>(num_params_)) return true;
  if (staged_ == nullptr) {
    // Its answer's versions go to versions_ only once Step has it: the push
    // may still be given up, and versions_ must then stay the base.
    const PullTarget next{params, &staged_versions_, timeout_,
                          /*holds_base_versions=*/true};
    absl::StatusOr<std::unique_ptr<StagedPush>> started =
        pusher_->Start(grads.data(), versions_, samples, next_offset_, &next,
                       /*hold_ends=*/true);
    if (!started.ok()) return started.status();
    staged_ = *std::move(started);
    staged_samples_ = samples;
    staged_grads_ = grads.data();
    staged_params_ = params.data();
  }
  staged_->Ready(from);
  return true;
}

bool ScriptWorker::PushesDuringBackward() const {
  // Sync only: a downpour shard would apply a push as soon as it is whole,
  // but the shards take a script's push only at Step, so the parts gain
  // nothing there and cost the hooks (measured: LeNet on 2 shards, sync
  // 1.02-1.06x, downpour 0.97x).
  return config_.mode() == SYNC && !config_.push_after_backward() &&
         common::PushEncodingFor(config_) == ENCODING_FLOAT32;
}

absl::Status ScriptWorker::CheckStep(absl::Span<const float> grads,
                                     int64_t samples,
                                     absl::Span<float> params) const {
  if (auto s = CheckSize("grads", grads.size()); !s.ok()) return s;
  if (auto s = CheckSize("params", params.size()); !s.ok()) return s;
  if (samples < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a step sums over at least 1 example, not ", samples));
  }
  if (versions_.empty()) {
    return absl::FailedPreconditionError(
        "no weights pulled yet: pull the shards' weights into the model "
        "first (monsoon.torch.broadcast_parameters)");
  }
  return CheckBatchStep(samples);
}

absl::Status ScriptWorker::CheckBatchStep(int64_t samples) const {
  if (!config_.elastic() && !batches_.has_value()) return absl::OkStatus();
  if (samples != config_.batch_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a step of ", samples,
                     " examples: each step trains one batch of "
                     "monsoon.torch.Batches (batch_size ",
                     config_.batch_size(), ")"));
  }
  if (given_.empty() || next_offset_ != given_.front()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a step without a batch to train: ",
        config_.elastic()
            ? "this run is elastic (elastic: true), so its data is handed "
              "out by shard 0's queue and each step trains"
            : "a script that takes its batches from monsoon.torch.Batches "
              "trains",
        " the next batch it gives (", steps_, " steps so far)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ScriptWorker::Batch> ScriptWorker::NextBatch(int64_t examples) {
  if (examples < config_.batch_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a training set of ", examples,
                     " examples holds no batch of ", config_.batch_size()));
  }
  if (!batches_.has_value()) {
    batch_set_.size = examples;
    context_.train = &batch_set_;
    // As ps_worker: a fixed run resumes after the steps of this rank every
    // shard has applied; an elastic one numbers its examples on from them.
    PlaceWorker(*client_, config_, /*resume=*/true, &context_);
    absl::StatusOr<BatchStream> stream = BatchStream::ForWorker(context_);
    if (!stream.ok()) return stream.status();
    batches_.emplace(*std::move(stream));
  } else if (examples != batch_set_.size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training set has ", examples, " examples, but ", batch_set_.size,
        " when this worker took its first batch"));
  }
  if (!given_.empty() && config_.elastic() && config_.mode() == SYNC) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the next batch taken before the last was trained (", steps_,
        " steps): in an elastic sync run a worker with nothing left to take "
        "steps out of the run, so take each batch in step with training (a "
        "DataLoader with worker processes takes batches ahead; iterate "
        "monsoon.torch.Batches in the training loop and load each batch's "
        "examples there)"));
  }
  Batch next;
  if (!batches_->Skip(1)) {
    if (!batches_->status().ok()) return batches_->status();
    next.finished = true;
    return next;
  }
  const int64_t expected =
      given_.empty() ? next_offset_ : given_.back() + config_.batch_size();
  if (batches_->sample_offset() != expected) {
    // A script that stepped before it took batches here (a fixed run's
    // steps of its own): the shards would count its examples at the wrong
    // place.
    return absl::FailedPreconditionError(absl::StrCat(
        "this worker's next example is number ", expected,
        " of its rank, but its next batch begins at ",
        batches_->sample_offset(),
        ": take every step's batch from monsoon.torch.Batches, from the "
        "first"));
  }
  given_.push_back(batches_->sample_offset());
  next.epoch = batches_->epoch();
  next.batch = batches_->step_in_epoch() - 1;
  next.batches_per_epoch = batches_->steps_per_epoch();
  next.rejoined = batches_->TakeRejoined();
  return next;
}

std::vector<int64_t> ScriptWorker::EpochOrder(int epoch,
                                              int64_t examples) const {
  if (config_.elastic()) {
    return ShuffledOrder(Partition{0, examples}, config_.seed(), /*rank=*/0,
                         epoch);
  }
  return ShuffledOrder(
      PartitionFor(examples, context_.num_workers, context_.rank),
      config_.seed(), context_.rank, epoch);
}

int64_t ScriptWorker::OverlapFrom() const {
  if (!PushesDuringBackward()) return -1;
  const uint64_t chunk = common::Float32ChunkValues(config_);
  int64_t from = -1;
  for (const common::ShardRange& range : client_->ranges()) {
    if (range.begin > 0 && range.size() > 1) {
      from = std::max(from, static_cast<int64_t>(range.begin));
    }
    if (range.size() > chunk) {
      from = std::max(from, static_cast<int64_t>(range.end - chunk));
    }
  }
  return from;
}

void ScriptWorker::Withdraw() {
  if (staged_ == nullptr) return;
  staged_.reset();  // the shards take none of it
  ++pushes_withdrawn_;
}

bool ScriptWorker::StepReplacesParams() const {
  return config_.mode() == SYNC || config_.mode() == HOGWILD ||
         ((config_.mode() == DOWNPOUR || config_.mode() == ONEBIT) &&
          !Overlapped(config_));
}

absl::Status ScriptWorker::CheckSize(const char* what, size_t size) const {
  if (static_cast<int64_t>(size) == num_params_) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " hold ", size, " values, but the run's model has ",
                   num_params_, " parameters"));
}

absl::Status ScriptWorker::Pull(absl::Span<float> params) {
  if (auto s = CheckSize("params", params.size()); !s.ok()) return s;
  auto pull = [&] { return client_->Pull(0, timeout_, params, &versions_); };
  PhaseTimer timer(&counters_, Phase::kPull);
  return RidingOut(context_, pull, pull);
}

absl::Status ScriptWorker::RideOut(const absl::Status& lost) {
  if (!ShardLost(context_, lost)) return lost;
  return worker::RideOut(context_, lost);
}

absl::StatusOr<bool> ScriptWorker::Step(absl::Span<const float> grads,
                                        int64_t samples,
                                        absl::Span<float> params) {
  if (auto s = CheckStep(grads, samples, params); !s.ok()) return s;
  if (!given_.empty()) given_.pop_front();  // this step's batch
  const int64_t offset = next_offset_;
  next_offset_ += samples;
  ++steps_;
  counters_.steps.fetch_add(1);
  counters_.samples.fetch_add(samples);
  const Mode mode = config_.mode();
  auto pull = [&] { return client_->Pull(0, timeout_, params, &versions_); };
  if (mode == SYNC || ((mode == DOWNPOUR || mode == ONEBIT) &&
                       !Overlapped(config_))) {
    // One round trip: the push's answer carries the weights that include
    // it (sync: once the step's barrier closes). A shard that has the push
    // already (a repeat after a lost shard) answers it as a duplicate.
    const PullTarget next{params, &versions_, timeout_,
                          /*holds_base_versions=*/true};
    if (staged_ != nullptr &&
        (staged_samples_ != samples || staged_grads_ != grads.data() ||
         staged_params_ != params.data())) {
      Withdraw();  // told otherwise while backward ran
    }
    // Sent again after a lost shard (the weights pulled in full since), a
    // 1-bit push goes as it was encoded (GradientPusher::PushAgain).
    bool again = false;
    auto step = [&]() -> absl::Status {
      PhaseTimer timer(&counters_, Phase::kPushPull);
      if (staged_ != nullptr) {
        // Backward's parts are on their way: the shards get the rest.
        std::unique_ptr<StagedPush> staged = std::move(staged_);
        absl::StatusOr<std::unique_ptr<PendingCall>> push = staged->Finish();
        counters_.shard_pushes_during_backward.fetch_add(staged->sent_early());
        absl::Status done = push.ok() ? (*push)->Wait() : push.status();
        if (done.ok()) versions_ = staged_versions_;
        again = true;
        return done;
      }
      absl::StatusOr<std::unique_ptr<PendingCall>> push =
          again
              ? pusher_->PushAgain(grads.data(), versions_, samples, offset,
                                   &next)
              : pusher_->Push(grads.data(), versions_, samples, offset, &next);
      again = true;
      if (!push.ok()) return push.status();
      return (*push)->Wait();
    };
    if (auto s = RidingOut(context_, step, pull); !s.ok()) return s;
    return true;
  }
  if (mode == HOGWILD) {
    // The push runs while the next step computes; the weights are pulled
    // now. A push lost on a shard is not sent again (as in hogwild_loop).
    auto push = [&]() -> absl::Status {
      PhaseTimer timer(&counters_, Phase::kPush);
      if (auto s = in_flight_.Finish(); !s.ok()) return s;
      absl::StatusOr<std::unique_ptr<PendingCall>> started =
          pusher_->Push(grads.data(), versions_, samples, offset);
      if (!started.ok()) return started.status();
      in_flight_.Hold(*std::move(started));
      return absl::OkStatus();
    };
    auto none = [] { return absl::OkStatus(); };
    if (auto s = RidingOut(context_, push, none); !s.ok()) return s;
    if (auto s = Pull(params); !s.ok()) return s;
    return true;
  }
  if (mode == EASGD) {
    if (since_exchange_ == 0) {
      first_offset_ = offset;
      summed_samples_ = 0;
    }
    summed_samples_ += samples;
    return false;
  }
  // downpour and onebit, pushing every n_push steps: the gradient summed.
  if (pusher_->accumulated_steps() == 0) {
    first_offset_ = offset;
    summed_samples_ = 0;
  }
  summed_samples_ += samples;
  if (pusher_->accumulated_steps() + 1 < config_.n_push()) {
    if (auto s = pusher_->Accumulate(grads.data()); !s.ok()) return s;
    return false;
  }
  if (auto s = PushAsync(grads.data(), summed_samples_); !s.ok()) return s;
  return false;
}

absl::Status ScriptWorker::PushAsync(const float* grads, int64_t samples) {
  // A push that fails on a lost shard is not sent again: that shard loses
  // it, the others have it (as in downpour_loop).
  bool sent = false;
  auto push = [&]() -> absl::Status {
    if (sent) return absl::OkStatus();
    PhaseTimer timer(&counters_, Phase::kPush);
    if (auto s = in_flight_.Finish(); !s.ok()) return s;
    sent = true;
    absl::StatusOr<std::unique_ptr<PendingCall>> started =
        pusher_->Push(grads, versions_, samples, first_offset_);
    if (!started.ok()) return started.status();
    in_flight_.Hold(*std::move(started));
    return absl::OkStatus();
  };
  return RidingOut(context_, push, [] { return absl::OkStatus(); });
}

absl::Status ScriptWorker::AfterLocalStep(absl::Span<float> params) {
  if (auto s = CheckSize("params", params.size()); !s.ok()) return s;
  if (config_.mode() == EASGD) {
    if (++since_exchange_ < config_.tau()) return absl::OkStatus();
    return Exchange(params);
  }
  if (Overlapped(config_) && steps_ % config_.n_fetch() == 0) {
    return Pull(params);
  }
  return absl::OkStatus();
}

absl::Status ScriptWorker::Exchange(absl::Span<float> params) {
  const size_t p = params.size();
  center_.resize(p);
  elastic_.resize(p);
  const float alpha = config_.has_alpha()
                          ? config_.alpha()
                          : 0.9f / static_cast<float>(context_.num_workers);
  // Lost while pulling the centre: the exchange runs again once the shard
  // is back. Lost while pushing d: x has moved, so it is not repeated.
  bool pushing = false;
  auto once = [&]() -> absl::Status {
    if (pushing) return absl::OkStatus();
    {
      PhaseTimer timer(&counters_, Phase::kPull);
      if (auto s = client_->Pull(0, timeout_, absl::MakeSpan(center_),
                                 &versions_);
          !s.ok()) {
        return s;
      }
    }
    PhaseTimer timer(&counters_, Phase::kPush);
    for (size_t i = 0; i < p; ++i) {
      elastic_[i] = alpha * (params[i] - center_[i]);
      params[i] -= elastic_[i];
    }
    pushing = true;
    absl::StatusOr<std::unique_ptr<PendingCall>> push = pusher_->Push(
        elastic_.data(), versions_, summed_samples_, first_offset_);
    if (!push.ok()) return push.status();
    return (*push)->Wait();
  };
  since_exchange_ = 0;
  return RidingOut(context_, once, [] { return absl::OkStatus(); });
}

absl::Status ScriptWorker::Finish(absl::Span<float> params) {
  if (auto s = CheckSize("params", params.size()); !s.ok()) return s;
  // A backward pass whose step never came: its push is not a step's.
  Withdraw();
  if (config_.mode() == EASGD && since_exchange_ > 0) {
    return Exchange(params);
  }
  if (pusher_->accumulated_steps() > 0) {
    if (auto s = PushAsync(nullptr, summed_samples_); !s.ok()) return s;
  }
  auto finish = [&] { return in_flight_.Finish(); };
  return RidingOut(context_, finish, [] { return absl::OkStatus(); });
}

}  // namespace monsoon::worker
