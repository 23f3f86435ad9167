// sync: a barrier per step. Every worker pushes its step-t gradient (computed
// from version t); when all have arrived the shard averages them, applies the
// optimizer once and becomes version t+1, which wakes the pulls waiting for it.
// A worker that has stopped calling for the length of its lease no longer
// holds the barrier: the step closes with the gradients that arrived
// (averaged over them), its batch for the step is skipped (its position
// moves past it, StatsResponse.samples_skipped_by_worker), and the barrier is
// the live workers' until it calls again; it then rejoins at the current
// step.
//
// With backup_workers b (Chen et al. 2016), a step also closes as soon as
// all but b workers have pushed it, averaged over those; the batches of the
// workers it closed without are passed over, and their pushes for it, when
// they come, are dropped (answered as stale, counted in
// StatsResponse.backup_dropped_pushes): each step waits for the fastest
// N - b workers only.
//
// With pull_compression ONEBIT, each step's update is quantized to 1 bit
// with error feedback (StepPullEncoder, server/policies/compressed_pulls.h)
// and PullFrom hands out the encoded difference. The optimizer's state
// (momentum) follows the unquantized gradients.

#include <algorithm>
#include <deque>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "server/optimizer.h"
#include "server/policies/policy_factory.h"
#include "server/sync_barrier_log.h"
#include "server/update_rule.h"

namespace monsoon::server {
namespace {

class SyncRule : public UpdateRule {
 public:
  SyncRule(const TrainingConfig& resolved, int num_workers, ShardState* state)
      : num_workers_(num_workers),
        backup_(std::min(resolved.backup_workers(), num_workers - 1)),
        elastic_(resolved.elastic()),
        state_(state),
        optimizer_(MakeOptimizer(resolved, state->size())),
        weights_(state->InitialWeights()),
        arrived_(num_workers, false),
        step_samples_(num_workers, 0),
        step_offsets_(num_workers, 0),
        step_digests_(num_workers, 0),
        step_sessions_(num_workers, 0),
        step_pulls_(std::move(
            MakePolicies(resolved, num_workers, state->size()).step_pulls)),
        dropped_(num_workers) {
    weight_bound_.Reset(MaxAbs(weights_->values()));
  }

  absl::StatusOr<PushResult> Apply(const PushData& push) override {
    std::vector<ShardState::Waiter> ready;
    std::vector<std::shared_ptr<const SyncStep>> closed;
    PushResult result;
    {
      absl::MutexLock lock(&mu_);
      const int64_t version = weights_->version();
      if (push.base_version < version && TakeDropped(push)) {
        // Its step closed without it (backup workers): dropped, and the
        // worker carries on from the current weights. In an elastic run
        // its examples are passed over only now (the step could not know
        // them), so that its data shard is done.
        state_->RecordBackupDrop(push.wire_bytes);
        if (elastic_) {
          state_->PassOver(push.worker_rank, push.sample_offset, push.samples);
        }
        result.version = version;
        result.stale = true;
        return result;
      }
      if (state_->IsRepeat(push.worker_rank, push.sample_offset,
                           push.samples)) {
        // A step already closed with these examples in it.
        result.version = version;
        result.duplicate = true;
        return result;
      }
      if (push.base_version < version) {
        return absl::AbortedError(
            absl::StrCat("sync push for step ", push.base_version,
                         " but shard ", state_->shard(), " is at version ",
                         version, ": that step is closed; pull and retry"));
      }
      if (push.base_version > version) {
        return FutureVersionError(state_->shard(), push.base_version, version);
      }
      if (arrived_[push.worker_rank]) return SecondPush(push, version);
      // The step's pushes are all of the same examples' position (see
      // Alignment); a shard that went back finds out which here.
      switch (Alignment(push)) {
        case Aligned::kBehind:
          PassOverBehind(push);
          result.version = version;
          result.duplicate = true;
          return result;
        case Aligned::kAhead:
          // The step so far is of examples that this push's rank went
          // past: it closes without them, and this push begins the next.
          PassOverOpenStep(push, &ready, &closed);
          result.await_version = weights_->version() + 1;
          break;
        case Aligned::kSame:
          break;
        case Aligned::kUnknown:
          if (PassesOverLostStep(push)) {
            result.version = version;
            result.duplicate = true;
            return result;
          }
          break;
      }
      arrived_[push.worker_rank] = true;
      step_samples_[push.worker_rank] = push.samples;
      step_offsets_[push.worker_rank] = push.sample_offset;
      step_digests_[push.worker_rank] = push.digest;
      step_sessions_[push.worker_rank] = push.session;
      step_max_abs_ += push.max_abs;
      ++count_;
      // The sum is 0 + g1 + g2 + ..., as adding to a zeroed sum would (0 +
      // turns -0 into +0), in fewer passes: the step's first push becomes
      // the sum (its buffer taken over, not copied), the 0 + done by the
      // next pass over it; the last push of several is added as the
      // optimizer applies the sum (CloseStep).
      // The step closes when every worker has pushed it, or every one still
      // alive has (the others' leases ran out).
      // With backup workers, also once all but backup_ have.
      const bool closes = count_ == num_workers_ ||
                          (backup_ > 0 && count_ >= Members() - backup_) ||
                          AllLiveArrived(absl::Now());
      const float* g = push.values.data();
      if (count_ == 1) {
        if (push.buffer != nullptr && *push.buffer != nullptr) {
          sum_ = std::move(*push.buffer);
        } else {
          sum_ = state_->buffers().Take();
          std::copy(g, g + state_->size(), sum_.get());
        }
        sum_plus_zero_ = true;
      } else if (!closes) {
        AddToSum(g);
      }
      state_->RecordPush(/*staleness=*/0, push.samples, push.wire_bytes);
      result.version = weights_->version();
      if (closes) {
        CloseStep(count_ == 1 ? nullptr : g);
        result.version = weights_->version();
        Publish(&ready, &closed);
      }
    }
    for (std::shared_ptr<const SyncStep>& step : closed) {
      publish_(std::move(step));
    }
    state_->RunWaiters(std::move(ready));
    return result;
  }

  void PublishStepsThrough(
      std::function<void(std::shared_ptr<const SyncStep>)> publish) override {
    absl::MutexLock lock(&mu_);
    publish_ = std::move(publish);
  }

  absl::StatusOr<PushResult> ApplyStep(const PushData& push) override {
    if (push.step == nullptr || push.values.size() != state_->size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a forwarded sync step needs its examples and ", state_->size(),
          " values"));
    }
    const SyncStep& step = *push.step;
    std::vector<ShardState::Waiter> ready;
    PushResult result;
    {
      absl::MutexLock lock(&mu_);
      if (count_ != 0 || step.version != weights_->version() + 1) {
        return absl::FailedPreconditionError(absl::StrCat(
            "forwarded step to version ", step.version, " but the copy of "
            "shard ", state_->shard(), "'s range is at version ",
            weights_->version(),
            count_ != 0 ? " with a step of its own collecting" : "",
            ": the copies differ"));
      }
      const bool refused = WriteStep(Gradient{push.values}, step.max_abs,
                                     step.without_update);
      if (refused != step.without_update) {
        common::LogError(
            "shard %d: the forwarded step to version %d was applied by the "
            "range's primary, but its update would overflow here: the "
            "copies differ",
            state_->shard(), step.version);
      }
      for (const SyncStep::Examples& examples : step.examples) {
        if (examples.rank < 0 || examples.rank >= num_workers_) continue;
        Settle(examples);
      }
      result.version = weights_->version();
      ready = state_->AdvanceVersion(result.version);
    }
    state_->RunWaiters(std::move(ready));
    return result;
  }

  WeightsPtr Snapshot() override {
    absl::MutexLock lock(&mu_);
    return Weights::Share(weights_);
  }

  PullAnswer PullFrom(int /*worker_rank*/,
                      std::optional<int64_t> have_version) override {
    absl::MutexLock lock(&mu_);
    PullAnswer answer{Weights::Share(weights_), nullptr};
    if (step_pulls_ != nullptr) {
      answer.delta = step_pulls_->DeltaFor(have_version, weights_->version());
    }
    return answer;
  }

  // The last completed step; the partial sum of the step in progress is not
  // part of it (see update_rule.h).
  RuleState SaveState() override {
    absl::MutexLock lock(&mu_);
    RuleState saved = SaveRuleState(*state_, weights_->version(),
                                    weights_->values(), optimizer_.get());
    if (step_pulls_ != nullptr) {
      const absl::Span<const float> residual = step_pulls_->residual();
      saved.pull_residual.assign(residual.begin(), residual.end());
    }
    return saved;
  }

  absl::Status RestoreState(const RuleState& saved) override {
    std::vector<ShardState::Waiter> ready;
    {
      absl::MutexLock lock(&mu_);
      if (!saved.pull_residual.empty() &&
          (step_pulls_ == nullptr ||
           saved.pull_residual.size() != step_pulls_->size())) {
        return absl::InvalidArgumentError(
            absl::StrCat("the copy carries a compressed pulls' residual of ",
                         saved.pull_residual.size(), " values; this shard ",
                         step_pulls_ == nullptr
                             ? "runs without pull_compression"
                             : absl::StrCat("keeps ", step_pulls_->size()),
                         ": the two processes run different configs"));
      }
      absl::StatusOr<std::shared_ptr<Weights>> restored =
          RestoreWeightsAndOptimizer(saved, state_, optimizer_.get());
      if (!restored.ok()) return restored.status();
      weights_ = *std::move(restored);
      weight_bound_.Reset(MaxAbs(weights_->values()));
      sum_.reset();
      step_max_abs_ = 0;
      std::fill(arrived_.begin(), arrived_.end(), false);
      std::fill(step_samples_.begin(), step_samples_.end(), 0);
      for (auto& offsets : dropped_) offsets.clear();
      count_ = 0;
      // The residual is not in checkpoints: error feedback starts again,
      // unless a repair copied it, and the first pulls are full ones.
      if (step_pulls_ != nullptr && !saved.pull_residual.empty()) {
        step_pulls_->RestoreResidual(saved.pull_residual);
      } else if (step_pulls_ != nullptr) {
        step_pulls_->Reset();
      }
      ready = state_->AdvanceVersion(weights_->version());
    }
    state_->RunWaiters(std::move(ready));
    return absl::OkStatus();
  }

 private:
  // A second push of `push`'s rank for the step in progress. The same push
  // sent again (the same examples and values: a retry after a lost answer),
  // or the same examples computed again, by a new process of the rank (one
  // restarted mid-step) or by a worker that lost another shard and repeats
  // the step on the weights the shards have now (PushHeader.repeat), is
  // ALREADY_EXISTS: the step has that gradient, and the first one stays.
  // Anything else is a mistake that would change the step silently:
  // FAILED_PRECONDITION.
  absl::Status SecondPush(const PushData& push, int64_t version)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int rank = push.worker_rank;
    const bool same_examples = push.sample_offset == step_offsets_[rank] &&
                               push.samples == step_samples_[rank];
    if (same_examples &&
        (push.digest == step_digests_[rank] ||
         push.session != step_sessions_[rank] || push.repeat)) {
      return absl::AlreadyExistsError(
          absl::StrCat("worker ", rank, " already pushed step ", version,
                       " to shard ", state_->shard()));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", rank, " pushed step ", version, " to shard ",
        state_->shard(), " twice with different ",
        same_examples ? "values" : "examples", " (examples ",
        step_offsets_[rank], "+", step_samples_[rank], " first, then ",
        push.sample_offset, "+", push.samples,
        "); the first push stays in the step. Does another process push "
        "for this rank, or does the worker compute a step twice?"));
  }

  // Where `push` stands against the pushes already in the step.
  //
  // In sync every rank's examples advance by the same batch each step (a
  // step skipped for a rank skips a batch of its examples), so the pushes
  // of one step begin at the same position in their ranks' data. A shard
  // that restarted from an older checkpoint lost some steps; the workers
  // that lived on come back at the step the shards that did not go back
  // are at, or one after (a worker whose answer from the lost shard came
  // before it died has gone on to its next batch, another whose answer was
  // lost repeats the step). Which of its lost steps each worker passes over
  // is known only once the pushes meet here: a push behind the step's
  // (kBehind) is of examples that another rank went past, and is passed
  // over; a push ahead (kAhead) passes over the step's. Deciding it from
  // what each worker saw of the other shards (PassesOverLostStep) paired one
  // worker's batch with another's next when the two workers looked at a
  // moment apart, and the last step then waited for a worker that had
  // finished. kUnknown: nothing to compare (an empty step, or ranks whose
  // pushes hold different numbers of examples).
  enum class Aligned { kSame, kBehind, kAhead, kUnknown };

  Aligned Alignment(const PushData& push) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // Elastic: each rank's examples are counted from its own start, not
    // in step with the others'.
    if (elastic_ || count_ == 0 || push.samples <= 0) return Aligned::kUnknown;
    int64_t offset = -1;
    for (int rank = 0; rank < num_workers_; ++rank) {
      if (!arrived_[rank]) continue;
      if (step_samples_[rank] != push.samples) return Aligned::kUnknown;
      offset = step_offsets_[rank];  // the same for all (kept so here)
    }
    if (push.sample_offset == offset) return Aligned::kSame;
    return push.sample_offset < offset ? Aligned::kBehind : Aligned::kAhead;
  }

  // kBehind: the push's examples are passed over; its rank goes on to its
  // next batch.
  void PassOverBehind(const PushData& push) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    state_->PassOver(push.worker_rank, push.sample_offset, push.samples);
    int64_t ahead = 0;
    for (int rank = 0; rank < num_workers_; ++rank) {
      if (arrived_[rank]) ahead = step_offsets_[rank];
    }
    common::Log(
        "shard %d: passed over rank %d's examples [%d, %d) at step %d: the "
        "step holds other ranks' examples from %d on (this shard went back "
        "to an older checkpoint, and the workers went past these examples "
        "on the other shards)",
        state_->shard(), push.worker_rank, push.sample_offset,
        push.sample_offset + push.samples, weights_->version(), ahead);
  }

  // kAhead: closes the step in progress without an update (the weights and
  // the optimizer's state as they were, its pushes' examples passed over,
  // as for a refused update), so that `push` begins the next one, and
  // publishes it (Publish): the passed-over pushes' workers get the weights
  // (unchanged) and go on to their next batch, which is the position of
  // `push`.
  void PassOverOpenStep(const PushData& push,
                        std::vector<ShardState::Waiter>* ready,
                        std::vector<std::shared_ptr<const SyncStep>>* closed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::string> passed;
    for (int rank = 0; rank < num_workers_; ++rank) {
      if (!arrived_[rank]) continue;
      passed.push_back(absl::StrCat(rank, " [", step_offsets_[rank], ", ",
                                    step_offsets_[rank] + step_samples_[rank],
                                    ")"));
    }
    common::Log(
        "shard %d: step %d closes without an update, its examples passed "
        "over (rank(s) %s): rank %d pushed examples from %d on, past them "
        "(this shard went back to an older checkpoint, and the workers went "
        "past these examples on the other shards); step %d begins with it",
        state_->shard(), weights_->version(), absl::StrJoin(passed, ", "),
        push.worker_rank, push.sample_offset, weights_->version() + 1);
    CloseStep(nullptr, /*pass_over=*/true);
    waiting_since_ = absl::InfiniteFuture();
    Publish(ready, closed);
  }

  // A step repeated after a lost shard, at a shard that went back (it
  // restarted from an older checkpoint: it lacks this rank's examples
  // before the push's), whose examples a shard that did not go back has
  // applied (PushHeader.resume_point): this shard lost that step of every
  // worker, and passes over it. Taken into a step here, it would pair this
  // worker's batch with another worker's next one, a worker that had been
  // a step ahead when the shard was lost, and the two would stay a step
  // apart on this shard to the end of the run, where the last step waits
  // for a worker that has finished.
  bool PassesOverLostStep(const PushData& push)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!push.repeat || push.samples <= 0 ||
        push.sample_offset + push.samples > push.resume_point ||
        state_->SamplePosition(push.worker_rank) >= push.sample_offset) {
      return false;
    }
    state_->PassOver(push.worker_rank, push.sample_offset, push.samples);
    common::Log(
        "shard %d: passed over rank %d's repeated examples [%d, %d) at step "
        "%d: this shard went back to a checkpoint before them (rank %d "
        "resumes at %d)",
        state_->shard(), push.worker_rank, push.sample_offset,
        push.sample_offset + push.samples, weights_->version(),
        push.worker_rank, push.resume_point);
    return true;
  }

  // pull_compression: replaces the step just written (weights_, from
  // previous_) by previous_ plus the 1-bit decoding of its update.
  void QuantizeStep() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // weights_ is not shared yet, or unread.
    step_pulls_->EncodeStep(previous_, weights_->mutable_data(),
                            weights_->version());
    weight_bound_.Reset(MaxAbs(weights_->values()));
  }

  // Whether `push` is one whose step closed without it (backup workers),
  // which it then forgets.
  bool TakeDropped(const PushData& push) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::deque<int64_t>& steps = dropped_[push.worker_rank];
    auto it = std::find(steps.begin(), steps.end(), push.base_version);
    if (it == steps.end()) return false;
    steps.erase(it);
    return true;
  }

  // sum += g (the step's second push on, not its first or last).
  void AddToSum(const float* g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t n = state_->size();
    float* __restrict sum = sum_.get();
    const float* __restrict values = g;
    if (sum_plus_zero_) {
      for (size_t i = 0; i < n; ++i) sum[i] = (0.0f + sum[i]) + values[i];
    } else {
      for (size_t i = 0; i < n; ++i) sum[i] += values[i];
    }
    sum_plus_zero_ = false;
  }

  // The ranks a step is of: every worker, or in an elastic run the live
  // ones (those that pushed it included).
  int Members() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!elastic_) return num_workers_;
    const std::vector<bool> live = state_->sessions().LiveRanks(
        num_workers_, absl::Now());
    int members = 0;
    for (int rank = 0; rank < num_workers_; ++rank) {
      if (live[rank] || arrived_[rank]) ++members;
    }
    return members;
  }

  // Whether every rank that is still alive has pushed this step (and at
  // least one has).
  bool AllLiveArrived(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (count_ == 0) return false;
    for (int rank = 0; rank < num_workers_; ++rank) {
      if (!arrived_[rank] && state_->Alive(rank, now)) return false;
    }
    return true;
  }

 public:
  void Tick(absl::Time now, absl::Duration log_every) override {
    std::vector<ShardState::Waiter> ready;
    std::vector<std::shared_ptr<const SyncStep>> closed;
    {
      absl::MutexLock lock(&mu_);
      if (count_ == 0) {
        waiting_since_ = absl::InfiniteFuture();
        return;
      }
      if (waiting_since_ == absl::InfiniteFuture()) {
        waiting_since_ = now;
        last_log_ = now;
      }
      if (AllLiveArrived(now)) {
        CloseStep(nullptr);
        Publish(&ready, &closed);
        waiting_since_ = absl::InfiniteFuture();
      } else if (log_every > absl::ZeroDuration() &&
                 now - last_log_ >= log_every) {
        common::LogWarning("shard %d: step %d has waited %s for rank(s) %s",
                           state_->shard(), weights_->version(),
                           absl::FormatDuration(absl::Trunc(
                               now - waiting_since_, absl::Seconds(1))),
                           DescribeMissingRanks(*state_, arrived_, now));
        last_log_ = now;
      }
    }
    for (std::shared_ptr<const SyncStep>& step : closed) {
      publish_(std::move(step));
    }
    state_->RunWaiters(std::move(ready));
  }

 private:
  // Averages the step's gradients (the sum, plus `last` where the last push
  // is not in it yet) and publishes the next version.
  // With `pass_over`, the step closes without an update (PassOverOpenStep).
  // Replicated (publish_), the step's averaged gradient is written out
  // first, over the sum (the update applies from it, as the backup's will:
  // the same values, the same weights), and the step is kept in step_ for
  // Publish.
  void CloseStep(const float* last, bool pass_over = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // Closed for the backup count (not for leases that ran out): the live
    // ranks it closes without will still push this step; their pushes are
    // to be dropped. That is the design, not news: no log line.
    const int members = Members();
    const bool by_backup = !pass_over && backup_ > 0 &&
                           count_ >= members - backup_ && count_ < members;
    if (!by_backup && !pass_over) {
      missing_log_.StepCloses(*state_, arrived_, count_, weights_->version());
    }
    Gradient mean{absl::MakeConstSpan(sum_.get(), state_->size()), last,
                  1.0f / static_cast<float>(count_), sum_plus_zero_};
    // The mean is at most the sum of the pushes' largest magnitudes,
    // scaled, once that sum cannot overflow.
    const double max_abs = step_max_abs_ < kSafeMagnitude
                               ? step_max_abs_ * mean.scale
                               : std::numeric_limits<double>::infinity();
    if (publish_) {
      step_ = std::make_shared<SyncStep>();
      step_->version = weights_->version() + 1;
      step_->max_abs = max_abs;
      // In place: each value of the sum is read before it is written.
      float* out = sum_.get();
      WithGradient(mean, [out](size_t n, auto grad) {
        for (size_t i = 0; i < n; ++i) out[i] = grad(i);
      });
      step_->mean = std::move(sum_);
      mean = Gradient{absl::MakeConstSpan(step_->mean.get(), state_->size())};
    }
    const bool refused = WriteStep(mean, max_abs, pass_over);
    if (step_ != nullptr) step_->without_update = refused;
    sum_.reset();  // back to the pool (replicated: the step has it)
    step_max_abs_ = 0;
    SettleExamples(refused, by_backup, pass_over);
  }

  // Writes the next version: the optimizer's step with `mean` (whose
  // magnitude is at most `max_abs`), or without an update when
  // `without_update` or when the update would overflow (logged). Returns
  // whether the step went without an update.
  bool WriteStep(const Gradient& mean, double max_abs, bool without_update)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // An update that would overflow is refused: the step still closes (the
    // workers wait for its version), with the weights and the optimizer's
    // state as they were and the step's examples passed over.
    // The bounds usually guarantee it without a pass.
    double step = 0;
    const bool bounded = !without_update &&
                         optimizer_->BoundStep(max_abs, &step) &&
                         weight_bound_.Allows(step);
    const bool refused =
        without_update ||
        (!bounded && !optimizer_->StaysFinite(mean, weights_->values().data()));
    const absl::Time began = state_->BeginApply();
    if (step_pulls_ != nullptr) {
      previous_.assign(weights_->values().begin(), weights_->values().end());
    }
    WriteNextVersion(state_, &weights_, weights_->version() + 1,
                     [&](const float* in, float* out) {
                       if (!refused) {
                         optimizer_->Apply(mean, in, out);
                       } else if (in != out) {
                         std::copy(in, in + state_->size(), out);
                       }
                     });
    if (step_pulls_ != nullptr) QuantizeStep();
    state_->EndApply(began);
    if (!refused) {
      optimizer_->AdvanceBound(max_abs);
      if (!weight_bound_.Advance(
              bounded ? step : std::numeric_limits<double>::infinity())) {
        weight_bound_.Reset(MaxAbs(weights_->values()));
      }
    } else if (!without_update) {
      state_->RecordRefusedUpdate();
      common::LogError(
          "shard %d: step %d's averaged update would make a weight or "
          "an optimizer value infinite or NaN (an overflow); refused: the "
          "shard keeps its state and the step's examples are passed over "
          "(StatsResponse.refused_updates). The run diverges: lower the "
          "learning rate, or the shards' --max_abs_gradient",
          state_->shard(), weights_->version() - 1);
    }
    return refused;
  }

  // After a step closed (CloseStep): without replication its version is
  // published now (the waiters it lets go added to `ready`); replicated,
  // the step is added to `closed`, for publish_ once the lock is released.
  void Publish(std::vector<ShardState::Waiter>* ready,
               std::vector<std::shared_ptr<const SyncStep>>* closed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (step_ != nullptr) {
      closed->push_back(std::move(step_));
      step_.reset();
      return;
    }
    std::vector<ShardState::Waiter> released =
        state_->AdvanceVersion(weights_->version());
    std::move(released.begin(), released.end(), std::back_inserter(*ready));
  }

  // After the step closed (its update `refused` or not; closed for the
  // backup count or not): only now are the step's examples in the weights.
  // A rank missing from the step (its lease ran out) passes over its batch
  // for it, as large as the others': when it returns it takes up the step
  // the others are at.
  // A step passed over (`pass_over`) skips nothing of the ranks missing
  // from it: their next push begins the next step. Nor does any step of an
  // elastic run: a rank's data is the data shards it takes, not a place in
  // the steps.
  void SettleExamples(bool refused, bool by_backup, bool pass_over)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int64_t batch = 0;
    for (int rank = 0; rank < num_workers_; ++rank) {
      if (arrived_[rank]) batch = std::max(batch, step_samples_[rank]);
    }
    // Elastic, closed for the backup count: the members it closed without.
    std::vector<bool> late;
    if (elastic_ && by_backup) {
      late = state_->sessions().LiveRanks(num_workers_, absl::Now());
    }
    for (int rank = 0; rank < num_workers_; ++rank) {
      SyncStep::Examples examples{rank, step_offsets_[rank],
                                  step_samples_[rank], StepExamples::APPLIED};
      if (arrived_[rank] && refused) {
        examples.kind = StepExamples::PASSED_OVER;
      } else if (!arrived_[rank] && !pass_over && !elastic_) {
        if (by_backup) RememberDropped(rank);
        examples = {rank, 0, batch, StepExamples::SKIPPED};
      } else if (!arrived_[rank]) {
        if (!late.empty() && late[rank]) RememberDropped(rank);
        step_samples_[rank] = 0;
        continue;
      }
      Settle(examples);
      if (step_ != nullptr) step_->examples.push_back(examples);
      step_samples_[rank] = 0;
    }
    std::fill(arrived_.begin(), arrived_.end(), false);
    count_ = 0;
  }

  // The step just closed (backup workers) without `rank`: its push for
  // it is to be dropped. A few steps are remembered (a worker late by
  // several).
  void RememberDropped(int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::deque<int64_t>& steps = dropped_[rank];
    steps.push_back(weights_->version() - 1);
    if (steps.size() > kDroppedKept) steps.pop_front();
  }

  // What a step did with one rank's examples, in the shard's counters.
  void Settle(const SyncStep::Examples& examples) {
    switch (examples.kind) {
      case StepExamples::APPLIED:
        state_->RecordAppliedSamples(examples.rank, examples.samples);
        state_->AdvancePosition(examples.rank, examples.offset,
                                examples.samples);
        break;
      case StepExamples::PASSED_OVER:
        state_->PassOver(examples.rank, examples.offset, examples.samples);
        break;
      default:  // SKIPPED
        state_->SkipSamples(examples.rank, examples.samples);
        break;
    }
  }

  // Dropped pushes remembered per rank (TakeDropped); older ones, if they
  // ever come, are answered as duplicates.
  static constexpr size_t kDroppedKept = 16;

  // Constant after construction.
  const int num_workers_;
  const int backup_;  // backup_workers, fewer than num_workers_
  const bool elastic_;
  ShardState* const state_;

  absl::Mutex mu_;
  const std::unique_ptr<Optimizer> optimizer_ ABSL_PT_GUARDED_BY(mu_);
  std::shared_ptr<Weights> weights_ ABSL_GUARDED_BY(mu_);  // last closed step
  // The step's gradients summed (see Apply): the first push's buffer, null
  // between steps; and whether its values still need 0 + (that is, hold
  // the first push alone).
  FloatBufferPool::Buffer sum_ ABSL_GUARDED_BY(mu_);
  bool sum_plus_zero_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<bool> arrived_ ABSL_GUARDED_BY(mu_);
  // Examples behind each worker's gradient for the step in progress.
  std::vector<int64_t> step_samples_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> step_offsets_ ABSL_GUARDED_BY(mu_);
  // Each arrived push's digest and session (SecondPush).
  std::vector<uint64_t> step_digests_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> step_sessions_ ABSL_GUARDED_BY(mu_);
  // pull_compression (null: off): the step encoder, and the step's old
  // weights.
  const std::unique_ptr<StepPullEncoder> step_pulls_ ABSL_PT_GUARDED_BY(mu_);
  std::vector<float> previous_ ABSL_GUARDED_BY(mu_);
  // Per rank, the steps that closed without it (TakeDropped).
  std::vector<std::deque<int64_t>> dropped_ ABSL_GUARDED_BY(mu_);
  int count_ ABSL_GUARDED_BY(mu_) = 0;
  // The sum of the step's pushes' largest magnitudes (PushData::max_abs).
  double step_max_abs_ ABSL_GUARDED_BY(mu_) = 0;
  WeightBound weight_bound_ ABSL_GUARDED_BY(mu_);
  MissingRanksLog missing_log_ ABSL_GUARDED_BY(mu_);
  // Replicated (PublishStepsThrough): where closed steps go (set before
  // serving, constant after), and the step CloseStep just made, until
  // Publish hands it on.
  std::function<void(std::shared_ptr<const SyncStep>)> publish_;
  std::shared_ptr<SyncStep> step_ ABSL_GUARDED_BY(mu_);
  // Since when the step in progress has had a push and waited (logging).
  absl::Time waiting_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Time last_log_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<UpdateRule> MakeSyncRule(const TrainingConfig& resolved,
                                         int num_workers, ShardState* state) {
  return std::make_unique<SyncRule>(resolved, num_workers, state);
}

}  // namespace monsoon::server
