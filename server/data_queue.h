// DataQueue: the training data of an elastic run (TrainingConfig.elastic),
// handed out in small data shards rather than split by rank, so that
// workers can come and go. Shard 0 keeps it.
//
// Each epoch's batches (the training set shuffled for the epoch, cut into
// whole batches; the workers compute the same order) are cut into data
// shards of data_shard_batches batches. A worker takes one at a time
// (Take), saying which one it finished training when it takes the next. A
// shard is done once the shard's ledger has applied its examples: a
// worker numbers its examples consecutively (PushHeader.sample_offset), so
// a shard handed out when the worker's next example was k is applied once
// the rank's position in the ledger reaches k plus the shard's examples. A
// worker that leaves, whose lease runs out, or whose rank another process
// registers (Release) has what it held and what the ledger does not hold
// yet of what it trained put back at the front of the queue. The next
// epoch's shards are handed out once the current epoch's are all handed
// out; the run is finished when every shard of every epoch is done. Each
// done shard's examples count toward its epoch (examples_trained); the
// examples the ledger applied of a put-back shard, or of a shard trained
// again after it was done, count as trained twice.
//
// Thread-safe (one lock). The ledger is read through a function given at
// construction, called under the queue's lock: it must not call the queue.
#ifndef MONSOON_SERVER_DATA_QUEUE_H_
#define MONSOON_SERVER_DATA_QUEUE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/service.pb.h"

namespace monsoon::server {

// One data shard: batches [first_batch, first_batch + batches) of an
// epoch's shuffled order.
struct DataShard {
  int epoch = 0;
  int64_t index = 0;
  int64_t first_batch = 0;
  int64_t batches = 0;
  bool operator==(const DataShard& o) const {
    return epoch == o.epoch && index == o.index;
  }
};

class DataQueue {
 public:
  // Where `rank`'s examples stand in the shard's ledger.
  using Position = std::function<int64_t(int rank)>;
  // A worker that finds no shard left while another is training one, or
  // has trained one that the ledger does not hold yet, is told to wait
  // (Take answers kWait), since it may come back.
  DataQueue(int epochs, int64_t batch_size, int shard_batches,
            Position position);

  enum class Kind { kShard, kWait, kFinished };
  struct Answer {
    Kind kind = Kind::kFinished;
    DataShard shard;  // kShard
  };

  // Rank `rank`, `done` training the shard it held (none at its first
  // call), asks for the next; its next example is numbered `next_offset`,
  // and its training set holds `examples_per_epoch`. The first call fixes
  // the epoch's size: a worker with another training set is refused
  // (FAILED_PRECONDITION). A call repeated after its answer was lost gets
  // the same shard again.
  absl::StatusOr<Answer> Take(int rank, std::optional<DataShard> done,
                              int64_t next_offset, int64_t examples_per_epoch);

  // The rank is gone (left, lease ran out, replaced by another process):
  // what it held, and what it trained that the ledger lacks, goes back to
  // the front of the queue. True if anything did.
  bool Release(int rank);

  // Every shard of every epoch is done (false before the first Take).
  bool Finished();
  // The ranks with a shard in training or trained and not all applied.
  std::vector<int> Ranks();

  struct Counts {
    int64_t batches_per_epoch = 0;
    int64_t shards_per_epoch = 0;
    std::vector<int64_t> examples_trained;  // per epoch, of done shards
    int64_t shards_done = 0;
    int64_t shards_requeued = 0;
    int64_t examples_trained_twice = 0;
  };
  Counts counts();

  // The queue in a checkpoint, and back. Shards in flight (held, or
  // trained and not yet applied) are saved with their ranks and restored
  // as put back: their workers' word that they finished one is still
  // taken.
  DataQueueState Save();
  // INVALID_ARGUMENT for a state of another shape (epochs, batch size) or
  // one naming shards that do not exist.
  absl::Status Restore(const DataQueueState& state);

 private:
  // A shard a rank trains or trained: its examples are the rank's from
  // first_offset on.
  struct Held {
    DataShard shard;
    int64_t first_offset = 0;
  };
  int64_t Examples(const DataShard& shard) const {
    return shard.batches * batch_size_;
  }
  DataShard MakeShard(int epoch, int64_t index) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Exists(int epoch, int64_t index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsDone(const DataShard& shard) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `held`'s examples the ledger applied, of `rank`.
  int64_t Applied(int rank, const Held& held) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A trained shard the ledger holds all of: done, or (done before by
  // another copy) trained twice.
  void Complete(int rank, const Held& held) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes the trained shards whose examples the ledger now holds.
  void Settle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next shard to hand out, if any.
  std::optional<DataShard> Next() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Back to the queue (unless done), what the ledger applied of it
  // counted as trained twice.
  void PutBack(int rank, const Held& held) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const int epochs_;
  const int64_t batch_size_;
  const int shard_batches_;
  const Position position_;

  absl::Mutex mu_;
  int64_t batches_per_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // 0: not known yet
  int64_t shards_per_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // The epoch whose shards are being handed out, and its next new shard.
  int epoch_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_index_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<DataShard> put_back_ ABSL_GUARDED_BY(mu_);
  std::map<int, Held> held_ ABSL_GUARDED_BY(mu_);  // being trained
  // Trained, not all applied yet.
  std::multimap<int, Held> trained_ ABSL_GUARDED_BY(mu_);
  // The ranks told to wait at their last call.
  std::set<int> waiting_ ABSL_GUARDED_BY(mu_);
  // What each release counted as trained twice, by (rank, epoch, index):
  // taken back if the rank was only slow and finishes the shard after all.
  std::map<std::tuple<int, int, int64_t>, int64_t> released_
      ABSL_GUARDED_BY(mu_);
  // The shard each rank last said it finished (a repeat is ignored).
  std::map<int, DataShard> last_done_ ABSL_GUARDED_BY(mu_);
  // Done shards per epoch.
  std::vector<std::set<int64_t>> done_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> examples_trained_ ABSL_GUARDED_BY(mu_);
  int64_t shards_done_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t shards_requeued_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t examples_trained_twice_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_DATA_QUEUE_H_
