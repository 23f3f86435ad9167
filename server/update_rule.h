// UpdateRule: what a shard does with a push, one implementation per mode
// (sync_rule.cc, downpour_rule.cc, easgd_rule.cc, hogwild_rule.cc; onebit is
// downpour after PushDecoder has decoded), chosen by MakeUpdateRule from the
// list in common/modes.def.
//
// The service validates every push (length, shard, worker rank, finite
// values) before a rule sees it; a rule that still refuses one returns an
// error and changes nothing. Implementations are thread-safe: gRPC calls
// Apply and Snapshot from many threads at once.
//
// The weights belong to the rule. Every rule but hogwild shares the current
// version's Weights with the pulls that send it (Snapshot), so that all
// pulls of a version send the same buffer and none copies it; an update
// writes the weights in place when no pull holds them any more, else it
// writes the next version into another pooled buffer. Hogwild writes one
// buffer in place, and its Snapshot copies it (once per version).
//
// SaveState and RestoreState export and import what a checkpoint keeps:
// the weights, the version and the optimizer's state. SaveState is
// consistent when no push is running (ShardServer calls it after the server
// has stopped); in sync mode it saves the last completed step only, and the
// gradients collected for the step in progress are dropped (after a restart
// the workers push that step again).
#ifndef MONSOON_SERVER_UPDATE_RULE_H_
#define MONSOON_SERVER_UPDATE_RULE_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "proto/config.pb.h"
#include "server/buffer_pool.h"
#include "server/optimizer.h"
#include "server/policies/compressed_pulls.h"
#include "server/shard_state.h"

namespace monsoon::server {

// A sync step as the range's primary closed it (ps_server --replicas): what
// its backup needs to make the same step (UpdateRule::ApplyStep).
struct SyncStep {
  int64_t version = 0;  // the version the step made
  // The averaged gradient, the shard's size (at the primary, written over
  // the step's sum; a forwarded step's arrive as PushData::values).
  FloatBufferPool::Buffer mean;
  double max_abs = 0;  // the bound on |mean| the overflow checks took
  bool without_update = false;  // refused or passed over: mean not applied
  struct Examples {
    int rank = 0;
    int64_t offset = 0;
    int64_t samples = 0;
    StepExamples::Kind kind = StepExamples::APPLIED;
  };
  std::vector<Examples> examples;
};

// One validated push for this shard.
struct PushData {
  int worker_rank = 0;
  int64_t base_version = 0;
  // PushHeader.have_version, when the worker sent it.
  std::optional<int64_t> have_version;
  int64_t samples = 0;
  int64_t sample_offset = 0;  // see PushHeader.sample_offset
  uint64_t session = 0;       // see PushHeader.session
  bool repeat = false;        // see PushHeader.repeat
  int64_t resume_point = 0;   // see PushHeader.resume_point
  // A push forwarded by the range's primary (PushHeader.replica_seq and
  // replica_epoch; server/replication.h); 0 for a worker's.
  int64_t replica_seq = 0;
  int64_t replica_epoch = 0;
  // A sync step forwarded by the range's primary (PushHeader.sync_step):
  // its examples and flags; the averaged gradient is `values`.
  std::shared_ptr<const SyncStep> step;
  int64_t wire_bytes = 0;     // serialized size, for statistics
  // The largest magnitude among `values`, when whoever made the push knows
  // it (PushDecoder finds it in its check of the values); infinity when
  // unknown. A rule's cheap overflow bound needs it (OverflowBound).
  float max_abs = std::numeric_limits<float>::infinity();
  // common::ValuesDigest of `values`, where the maker computed it (PushDecoder
  // does for sync shards); else 0.
  uint64_t digest = 0;
  // size() == the shard's size; all finite. Owned by whoever made the push
  // (PushDecoder), valid during Apply.
  absl::Span<const float> values;
  // The push as its worker encoded it, where that was not float32: for
  // ENCODING_ONEBIT its packed bits and scales (common/onebit.h, in the
  // config's buckets), valid as long as `values`, to which they decode. A
  // range's primary forwards these to its backup rather than the values,
  // 1/32 of the bytes (server/replication.h). Empty otherwise.
  PushEncoding encoding = ENCODING_FLOAT32;
  absl::string_view onebit_bits;
  absl::string_view onebit_scales;
  // The pooled buffer that holds `values`, if they are in one: a rule may
  // take it over instead of copying them (sync keeps a step's first push as
  // the step's sum). Null when the caller owns the values otherwise.
  FloatBufferPool::Buffer* buffer = nullptr;
};

struct PushResult {
  int64_t version = 0;
  int64_t staleness = 0;
  bool duplicate = false;  // a repeat, acknowledged and not applied
  bool stale = false;      // PushPull only: too stale to apply, dropped
  // Sync: the version whose weights answer the push, where it is not the
  // one after its base_version (the push began a later step than its base:
  // see sync_rule.cc, PassOverOpenStep); 0 otherwise.
  int64_t await_version = 0;
  // The gradient the rule applied, where it is not the push's values
  // (delay compensation): what a range's primary forwards to its backup,
  // so that the backup applies what the primary applied without the
  // worker's last pull, which only the primary saw. Null otherwise.
  std::shared_ptr<const std::vector<float>> applied_gradient;
};

// What a checkpoint keeps of a rule.
struct RuleState {
  int64_t version = 0;
  std::vector<float> weights;   // the shard's slice
  std::string optimizer;        // Optimizer::Name(); empty: no optimizer
  std::string optimizer_state;  // Optimizer::SaveState()
  // The shard's counters, taken with the weights, so that a checkpoint's
  // examples applied per worker match its weights (see SaveRuleState).
  StatsResponse stats;
  // Sync with pull_compression: the residual of the steps' 1-bit encoding
  // (StepPullEncoder), which a range's repair copies so that its two
  // copies go on quantizing alike. Not in checkpoints (empty: error
  // feedback starts again).
  std::vector<float> pull_residual;
};

class UpdateRule {
 public:
  virtual ~UpdateRule() = default;

  // Applies (or, in sync, collects) one push. A push whose examples the
  // shard has already applied (ShardState::IsRepeat) changes nothing and is
  // answered as a duplicate. Status codes: ABORTED when the push is too
  // stale to apply (pull, then retry), ALREADY_EXISTS for a sync step's push
  // sent again (FAILED_PRECONDITION for a different second push of the
  // step: see sync_rule.cc), INVALID_ARGUMENT for a version the shard never had
  // or for an update that would leave a weight or an optimizer value infinite
  // or NaN (an overflow). On error the shard is unchanged.
  virtual absl::StatusOr<PushResult> Apply(const PushData& push) = 0;

  // The current weights and their version, shared (not copied): valid as
  // long as the pointer is held.
  virtual WeightsPtr Snapshot() = 0;

  // What a pull of worker `worker_rank` (-1: an evaluator) sends, when the
  // worker holds the weights of `have_version` (if it said so): the current
  // weights, and with pull_compression, where the rule can, the 1-bit
  // difference from what the worker holds (sync keeps the last step's, see
  // sync_rule.cc; downpour and onebit keep each worker's copy, see
  // downpour_rule.cc). Thread-safe.
  struct PullAnswer {
    WeightsPtr weights;
    std::shared_ptr<const EncodedDelta> delta;  // null: send the weights
  };
  virtual PullAnswer PullFrom(int worker_rank,
                              std::optional<int64_t> have_version) {
    return {Snapshot(), nullptr};
  }

  // The weights, version and optimizer state (see the file comment).
  virtual RuleState SaveState() = 0;

  // `weights` (from Snapshot) are on their way to worker `worker_rank`'s
  // pull: a rule that compensates for what a worker last saw
  // (delay_compensation) keeps them. Thread-safe, like Snapshot.
  virtual void Pulled(int worker_rank, const WeightsPtr& weights) {}

  // Worker `worker_rank` left, finished or let its lease run out: what the
  // rule keeps per worker (compressed pulls' copy, delay compensation's
  // last pull) is dropped. If the rank calls again, its next pull is a full
  // one and its next push is not compensated. Thread-safe.
  virtual void DropWorker(int worker_rank) {}

  // Replication of a rule that closes steps (sync): from now on a step
  // that closes is not published (its version does not advance, no wait
  // for it ends) but handed to `publish`, outside the rule's locks, in the
  // order the steps close; `publish` forwards it to the range's backup and
  // then advances the version (ShardState::AdvanceVersion). Call before
  // serving. Rules that make no steps ignore it.
  virtual void PublishStepsThrough(
      std::function<void(std::shared_ptr<const SyncStep>)> publish) {}

  // Replication: from now on a rule that applies a gradient other than the
  // one pushed (delay compensation) hands it out with each push's result
  // (PushResult::applied_gradient), for the range's backup. Call before
  // serving. The others ignore it.
  virtual void HandOutAppliedGradients() {}

  // Backup: makes the step that the range's primary closed (forwarded, see
  // SyncStep), with `push.values` its averaged gradient. FAILED_PRECONDITION
  // when the step does not follow this copy's version (the copies differ);
  // UNIMPLEMENTED for rules that make no steps.
  virtual absl::StatusOr<PushResult> ApplyStep(const PushData& push) {
    return absl::UnimplementedError("this mode forwards pushes, not steps");
  }

  // Called every fraction of a second by the shard's server. A rule that
  // waits for workers (sync's barrier) closes a step whose missing workers'
  // leases have run out (ShardState::Alive), and logs every `log_every`
  // whom it waits for.
  virtual void Tick(absl::Time now, absl::Duration log_every) {}

  // Replaces the weights, version and optimizer state with `saved`, and
  // wakes pulls waiting for versions up to it. Call before serving.
  // INVALID_ARGUMENT (nothing changed) when `saved` does not fit this rule:
  // another weight count, optimizer or optimizer state size.
  virtual absl::Status RestoreState(const RuleState& saved) = 0;
};

// Helpers for the rules' SaveState and RestoreState. The caller holds
// whatever lock keeps pushes out (none under hogwild, whose saved counters
// may then be a push ahead of or behind its weights). `optimizer` may be
// null (no optimizer).
RuleState SaveRuleState(const ShardState& state, int64_t version,
                        absl::Span<const float> weights,
                        const Optimizer* optimizer);
// Checks that `saved` fits, then restores the optimizer state and returns
// the saved weights as version saved.version; the caller makes them its
// current weights and advances the shard's version.
absl::StatusOr<std::shared_ptr<Weights>> RestoreWeightsAndOptimizer(
    const RuleState& saved, ShardState* state, Optimizer* optimizer);

// A bound on the magnitude of a rule's weights, advanced by each update's
// step bound, so that the exact check before an update (StaysFinite, a pass
// over the shard) runs only when the bounds allow an overflow. Not
// thread-safe.
class WeightBound {
 public:
  // Starts again from the weights' largest magnitude (MaxAbs).
  void Reset(double max_abs) { bound_ = max_abs; }
  // Whether weights moved by at most `step` surely stay below
  // kSafeMagnitude.
  bool Allows(double step) const { return bound_ + step < kSafeMagnitude; }
  // After an update that moved them by at most `step` (infinity: unknown).
  // False when the bound is no longer below kSafeMagnitude: the caller then
  // Resets it from the weights.
  bool Advance(double step) {
    bound_ += step;
    return bound_ < kSafeMagnitude;
  }

 private:
  double bound_ = std::numeric_limits<double>::infinity();
};

// INVALID_ARGUMENT: the push of `worker_rank` at `version` would overflow the
// shard's state (StaysFinite was false), with what to do about it.
absl::Status NonFiniteUpdateError(int shard, int worker_rank, int64_t version);

// ABORTED: a push computed from `base_version`, which this shard (at
// `version`) has not reached. A shard restored from an older checkpoint
// while the worker held newer weights answers so: the worker pulls again
// and computes on the shard's weights as they are now (worker/
// training_loop.h, ShardLost); nothing changes on the shard.
absl::Status FutureVersionError(int shard, int64_t base_version,
                                int64_t version);

// Applies `update(in, out)` to `weights` as the next version: in place when
// no reader holds them (in == out), else into a new pooled buffer that
// replaces them. Sets the version to `version`.
template <typename Update>
void WriteNextVersion(ShardState* state, std::shared_ptr<Weights>* weights,
                      int64_t version, Update update) {
  if ((*weights)->unread()) {
    float* data = (*weights)->mutable_data();
    update(data, data);
    (*weights)->set_version(version);
    return;
  }
  FloatBufferPool::Buffer next = state->buffers().Take();
  update((*weights)->values().data(), next.get());
  *weights = std::make_shared<Weights>(version, std::move(next), state->size());
}

// A rule that applies pushes one at a time, at once, whatever their
// staleness (recorded, not refused): downpour and easgd. Subclasses say only
// how a push changes the weights.
class SerialRule : public UpdateRule {
 public:
  explicit SerialRule(ShardState* state)
      : state_(state), weights_(state->InitialWeights()) {
    weight_bound_.Reset(MaxAbs(weights_->values()));
  }

  absl::StatusOr<PushResult> Apply(const PushData& push) final;
  WeightsPtr Snapshot() final;
  RuleState SaveState() final;
  absl::Status RestoreState(const RuleState& saved) final;

 protected:
  // The optimizer whose state checkpoints keep, if any; used only under the
  // rule's lock.
  virtual Optimizer* optimizer() { return nullptr; }

  // What a subclass sees of a push.
  struct Incoming {
    absl::Span<const float> values;
    int worker_rank = 0;
    int64_t staleness = 0;  // the shard's version minus the push's base
    // Forwarded by the range's primary (PushData::replica_seq): `values`
    // are the gradient as the primary applied it
    // (PushResult::applied_gradient).
    bool forwarded = false;
  };
  // out = the weights `in` after the push: in place (in == out) or into
  // another array that does not overlap; both have values.size() floats.
  // Called with the rule's lock held, one push at a time.
  virtual void Update(const Incoming& push, const float* in, float* out) = 0;
  // Whether Update(push, in, ...) would leave every weight and every value
  // of the optimizer's state finite; changes nothing. Called first, under
  // the same lock, whenever BoundStep cannot tell: a push that would not is
  // refused.
  virtual bool StaysFinite(const Incoming& push, const float* in) = 0;
  // The cheap guarantee (see Optimizer::BoundStep): true when Update with
  // values at most `max_abs` in magnitude surely keeps the state (beyond
  // the weights) below kSafeMagnitude; *step is the most it moves a weight.
  virtual bool BoundStep(double max_abs, double* step) = 0;
  // After an Update with such values (see Optimizer::AdvanceBound).
  virtual void AdvanceBound(double max_abs) {}
  // After an Update: the gradient it applied, where that was not the
  // push's values (PushResult::applied_gradient); null otherwise.
  virtual std::shared_ptr<const std::vector<float>> AppliedGradient() {
    return nullptr;
  }

 private:
  ShardState* const state_;  // constant after construction

  absl::Mutex mu_;
  std::shared_ptr<Weights> weights_ ABSL_GUARDED_BY(mu_);  // the current one
  WeightBound weight_bound_ ABSL_GUARDED_BY(mu_);
};

// The rule for resolved.mode(), over `state` (not owned; must outlive it).
std::unique_ptr<UpdateRule> MakeUpdateRule(const TrainingConfig& resolved,
                                           int num_workers, ShardState* state);

// Each mode's constructor (common/modes.def), for tests and the factory:
// std::unique_ptr<UpdateRule> MakeSyncRule(const TrainingConfig& resolved,
//                                          int num_workers, ShardState* state);
// and so on.
#define MONSOON_MODE(mode, Impl)                \
  std::unique_ptr<UpdateRule> Make##Impl##Rule( \
      const TrainingConfig& resolved, int num_workers, ShardState* state);
#include "common/modes.def"
#undef MONSOON_MODE

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_UPDATE_RULE_H_
