// Compressed pulls (config.proto pull_compression ONEBIT): a worker that
// holds the shard's previous weights gets the 1-bit difference to the
// current ones (common/onebit.h, with error feedback: the residual of what
// earlier encodings lost) instead of the float32 weights, and adding its
// decoding gives it the shard's weights bit for bit.
//
// - StepPullEncoder (sync): each step's update u (the new weights minus the
//   old) is quantized once for every worker; the shard's weights become the
//   old ones plus the decoded update, exactly what a worker holding the old
//   weights gets. One residual per shard.
// - WorkerPullCopies (downpour, onebit): the shard keeps, per worker, the
//   copy of the weights that worker holds and the residual of its pulls; a
//   worker that says it holds its copy gets the difference from its copy to
//   the current weights, and its copy on both sides becomes the old one
//   plus the decoded difference. Any other pull is a full one, which resets
//   the copy to the weights sent. Two shard-sized arrays per worker (see
//   PolicyMemory). The copy is named by the shard version of the answer
//   that made it: every answer a worker holds its copy for is a
//   push-pull's, which includes that worker's push, so two such answers
//   never share a version, and an answer that was lost (the shard's copy
//   moved on, the worker's did not) shows at the next pull, which is then a
//   full one.
//
// StepPullEncoder is used under its rule's lock; WorkerPullCopies is
// thread-safe.
#ifndef MONSOON_SERVER_POLICIES_COMPRESSED_PULLS_H_
#define MONSOON_SERVER_POLICIES_COMPRESSED_PULLS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "server/shard_state.h"

namespace monsoon::server {

// A 1-bit difference between two versions of a shard's weights, as
// common/onebit.h encodes it: adding its decoding to the weights of
// base_version gives those of `version`, bit for bit.
struct EncodedDelta {
  int64_t base_version = 0;
  int64_t version = 0;
  std::string bits;
  std::string scales;
};

class StepPullEncoder {
 public:
  StepPullEncoder(int bucket_size, size_t size);

  // `w` (size() values) holds the step just written, of `version`, from
  // `previous`: replaces it by previous plus the 1-bit decoding of its
  // update with the residual, and keeps the encoding for DeltaFor.
  void EncodeStep(absl::Span<const float> previous, float* w, int64_t version);

  // The last step's encoding, for a worker that holds `have_version` when
  // the shard is at `version`; null when that worker needs a full pull.
  std::shared_ptr<const EncodedDelta> DeltaFor(
      std::optional<int64_t> have_version, int64_t version) const;

  // After a restore: error feedback starts again (the residual is not in
  // checkpoints), and the first pulls are full ones.
  void Reset();

  // The residual: what the encodings so far lost. A range's two copies
  // (--replicas) quantize each step alike only from the same residual, so
  // a repair copies it (RuleState::pull_residual).
  absl::Span<const float> residual() const { return residual_; }
  // After a repair: error feedback goes on from `residual` (size() values:
  // check first), and the first pulls are full ones.
  void RestoreResidual(absl::Span<const float> residual);
  size_t size() const { return residual_.size(); }

 private:
  const int bucket_size_;
  std::vector<float> residual_;
  std::vector<float> update_;
  std::shared_ptr<const EncodedDelta> delta_;
};

class WorkerPullCopies {
 public:
  explicit WorkerPullCopies(int bucket_size) : bucket_size_(bucket_size) {}

  // The difference to send worker `rank` (>= 0), which holds
  // `have_version`, for the current `weights`; null for a full pull, which
  // resets the worker's copy to `weights`.
  std::shared_ptr<const EncodedDelta> DeltaFor(
      int rank, std::optional<int64_t> have_version, const WeightsPtr& weights);

  // Drops worker `rank`'s copy and residual (it left): its next pull is a
  // full one, which makes them again.
  void Drop(int rank);

  // The workers whose copy is kept.
  int workers();

 private:
  struct WorkerView {
    std::vector<float> values;
    std::vector<float> residual;
    int64_t version = -1;
  };
  const int bucket_size_;
  absl::Mutex mu_;
  std::map<int, WorkerView> views_ ABSL_GUARDED_BY(mu_);
  std::vector<float> scratch_ ABSL_GUARDED_BY(mu_);
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_POLICIES_COMPRESSED_PULLS_H_
