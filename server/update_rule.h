// UpdateRule: what a shard does with a push, one implementation per mode
// (sync_rule.cc, downpour_rule.cc, easgd_rule.cc,
// hogwild_rule.cc; onebit is downpour after PushDecoder has decoded), chosen by MakeUpdateRule.
//
// The service validates every push (length, shard, worker rank, finite
// values) before a rule sees it; a rule that still refuses one returns an
// error and changes nothing. Implementations are thread-safe: gRPC calls
// Apply and Snapshot from many threads at once.
#ifndef MONSOON_SERVER_UPDATE_RULE_H_
#define MONSOON_SERVER_UPDATE_RULE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "proto/config.pb.h"
#include "server/shard_state.h"

namespace monsoon::server {

// One validated push for this shard.
struct PushData {
  int worker_rank = 0;
  int64_t base_version = 0;
  int64_t samples = 0;
  int64_t wire_bytes = 0;    // serialized size, for statistics
  std::vector<float> values;  // size() == the shard's size; all finite
};

struct PushResult {
  int64_t version = 0;
  int64_t staleness = 0;
};

class UpdateRule {
 public:
  virtual ~UpdateRule() = default;

  // Applies (or, in sync, collects) one push. Status codes: ABORTED when the
  // push is too stale to apply (pull, then retry), ALREADY_EXISTS for a
  // second push of the same step, INVALID_ARGUMENT for a version the shard
  // never had. On error the shard is unchanged.
  virtual absl::StatusOr<PushResult> Apply(const PushData& push) = 0;

  // A copy of the weights and the version they belong to.
  virtual void Snapshot(std::vector<float>* weights, int64_t* version) = 0;
};

// A rule that applies pushes one at a time, at once, whatever their
// staleness (recorded, not refused): downpour and easgd. Subclasses say only
// how a push changes the weights.
class SerialRule : public UpdateRule {
 public:
  explicit SerialRule(ShardState* state) : state_(state) {}

  absl::StatusOr<PushResult> Apply(const PushData& push) final;
  void Snapshot(std::vector<float>* weights, int64_t* version) final;

 protected:
  // Called with the rule's lock held, one push at a time.
  virtual void Update(absl::Span<const float> values,
                      absl::Span<std::atomic<float>> weights) = 0;

 private:
  ShardState* const state_;  // constant after construction

  absl::Mutex mu_;
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
};

// The rule for resolved.mode(), over `state` (not owned; must outlive it).
std::unique_ptr<UpdateRule> MakeUpdateRule(const TrainingConfig& resolved,
                                           int num_workers, ShardState* state);

// Each mode's constructor, for tests and the factory.
std::unique_ptr<UpdateRule> MakeSyncRule(const TrainingConfig& resolved,
                                         int num_workers, ShardState* state);
std::unique_ptr<UpdateRule> MakeDownpourRule(const TrainingConfig& resolved,
                                             ShardState* state);
std::unique_ptr<UpdateRule> MakeEasgdRule(ShardState* state);
std::unique_ptr<UpdateRule> MakeHogwildRule(const TrainingConfig& resolved,
                                            ShardState* state);

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_UPDATE_RULE_H_
