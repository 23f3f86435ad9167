#include "server/data_queue.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace monsoon::server {

DataQueue::DataQueue(int epochs, int64_t batch_size, int shard_batches,
                     Position position)
    : epochs_(std::max(epochs, 0)),
      batch_size_(std::max<int64_t>(batch_size, 1)),
      shard_batches_(std::max(shard_batches, 1)),
      position_(std::move(position)),
      done_(std::max(epochs, 0)),
      examples_trained_(std::max(epochs, 0), 0) {}

DataShard DataQueue::MakeShard(int epoch, int64_t index) const {
  DataShard shard;
  shard.epoch = epoch;
  shard.index = index;
  shard.first_batch = index * shard_batches_;
  shard.batches =
      std::min<int64_t>(shard_batches_, batches_per_epoch_ - shard.first_batch);
  return shard;
}

bool DataQueue::Exists(int epoch, int64_t index) const {
  return epoch >= 0 && epoch < epochs_ && index >= 0 &&
         index < shards_per_epoch_;
}

bool DataQueue::IsDone(const DataShard& shard) const {
  return done_[shard.epoch].count(shard.index) > 0;
}

int64_t DataQueue::Applied(int rank, const Held& held) const {
  return std::clamp<int64_t>(position_(rank) - held.first_offset, 0,
                             Examples(held.shard));
}

void DataQueue::Complete(int rank, const Held& held) {
  if (IsDone(held.shard)) {
    // Done by another copy (it was put back while this rank still
    // trained it).
    examples_trained_twice_ += Examples(held.shard);
    return;
  }
  done_[held.shard.epoch].insert(held.shard.index);
  examples_trained_[held.shard.epoch] += Examples(held.shard);
  ++shards_done_;
  put_back_.erase(
      std::remove(put_back_.begin(), put_back_.end(), held.shard),
      put_back_.end());
}

void DataQueue::Settle() {
  for (auto it = trained_.begin(); it != trained_.end();) {
    if (Applied(it->first, it->second) < Examples(it->second.shard)) {
      ++it;
      continue;
    }
    Complete(it->first, it->second);
    it = trained_.erase(it);
  }
}

std::optional<DataShard> DataQueue::Next() {
  while (!put_back_.empty()) {
    DataShard shard = put_back_.front();
    put_back_.pop_front();
    if (!IsDone(shard)) return shard;
  }
  while (epoch_ < epochs_) {
    if (next_index_ < shards_per_epoch_) return MakeShard(epoch_, next_index_++);
    ++epoch_;
    next_index_ = 0;
  }
  return std::nullopt;
}

void DataQueue::PutBack(int rank, const Held& held) {
  const int64_t applied = Applied(rank, held);
  examples_trained_twice_ += applied;
  released_[{rank, held.shard.epoch, held.shard.index}] = applied;
  if (IsDone(held.shard)) return;
  if (std::find(put_back_.begin(), put_back_.end(), held.shard) ==
      put_back_.end()) {
    put_back_.push_front(held.shard);
    ++shards_requeued_;
  }
}

absl::StatusOr<DataQueue::Answer> DataQueue::Take(
    int rank, std::optional<DataShard> done, int64_t next_offset,
    int64_t examples_per_epoch) {
  absl::MutexLock lock(&mu_);
  waiting_.erase(rank);
  const int64_t batches = examples_per_epoch / batch_size_;
  if (batches_per_epoch_ == 0) {
    if (batches < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a training set of ", examples_per_epoch,
          " examples holds less than one batch of ", batch_size_));
    }
    batches_per_epoch_ = batches;
    shards_per_epoch_ = (batches + shard_batches_ - 1) / shard_batches_;
  } else if (batches != batches_per_epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this worker's training set has ", examples_per_epoch,
        " examples (", batches, " batches of ", batch_size_,
        "), but the run's has ", batches_per_epoch_,
        " batches per epoch: give every worker the same data"));
  }
  auto held = held_.find(rank);
  if (done.has_value()) {
    if (!Exists(done->epoch, done->index)) {
      return absl::InvalidArgumentError(
          absl::StrCat("data shard ", done->index, " of epoch ", done->epoch,
                       " does not exist (", epochs_, " epochs of ",
                       shards_per_epoch_, " shards)"));
    }
    const DataShard finished = MakeShard(done->epoch, done->index);
    if (held != held_.end() && held->second.shard == finished) {
      trained_.emplace(rank, held->second);
      held_.erase(held);
      held = held_.end();
    } else if (held == held_.end() &&
               !(last_done_.count(rank) > 0 && last_done_[rank] == finished)) {
      // The rank's shard was put back (its lease ran out while it was
      // only slow, or a restarted shard 0 saved it in flight) and yet it
      // finished it; its examples end where its next begins. What its
      // release counted as trained twice is this copy's, counted whole
      // now when another copy was done first.
      if (auto it = released_.find({rank, finished.epoch, finished.index});
          it != released_.end()) {
        examples_trained_twice_ -= it->second;
        released_.erase(it);
      }
      put_back_.erase(
          std::remove(put_back_.begin(), put_back_.end(), finished),
          put_back_.end());
      trained_.emplace(rank,
                       Held{finished, next_offset - Examples(finished)});
    }
    // Otherwise the rank holds another shard, or said it finished this
    // one already: this call repeats one whose answer was lost.
    last_done_[rank] = finished;
  }
  Settle();
  Answer answer;
  if (held != held_.end()) {
    answer.kind = Kind::kShard;
    answer.shard = held->second.shard;
    return answer;
  }
  if (std::optional<DataShard> next = Next(); next.has_value()) {
    held_[rank] = Held{*next, next_offset};
    answer.kind = Kind::kShard;
    answer.shard = *next;
    return answer;
  }
  // Nothing left to hand out. Another worker's shard in training may come
  // back (its worker may go), and so may one it trained that the ledger
  // does not hold yet: the asker waits for them. Not for a worker's that
  // waits itself (easgd: its last steps reach the centre only once it
  // leaves its loop), nor for its own (its last pushes follow).
  bool others = !held_.empty();
  for (const auto& [other, trained] : trained_) {
    others |= other != rank && waiting_.count(other) == 0;
  }
  answer.kind = others ? Kind::kWait : Kind::kFinished;
  if (others) waiting_.insert(rank);
  return answer;
}

bool DataQueue::Release(int rank) {
  absl::MutexLock lock(&mu_);
  waiting_.erase(rank);
  Settle();
  bool released = false;
  if (auto held = held_.find(rank); held != held_.end()) {
    PutBack(rank, held->second);
    held_.erase(held);
    released = true;
  }
  auto [first, last] = trained_.equal_range(rank);
  for (auto it = first; it != last; ++it) {
    PutBack(rank, it->second);
    released = true;
  }
  trained_.erase(first, last);
  return released;
}

bool DataQueue::Finished() {
  absl::MutexLock lock(&mu_);
  Settle();
  return batches_per_epoch_ > 0 &&
         shards_done_ == shards_per_epoch_ * static_cast<int64_t>(epochs_);
}

std::vector<int> DataQueue::Ranks() {
  absl::MutexLock lock(&mu_);
  Settle();
  std::set<int> ranks;
  for (const auto& [rank, held] : held_) ranks.insert(rank);
  for (const auto& [rank, held] : trained_) ranks.insert(rank);
  return std::vector<int>(ranks.begin(), ranks.end());
}

DataQueue::Counts DataQueue::counts() {
  absl::MutexLock lock(&mu_);
  Settle();
  Counts counts;
  counts.batches_per_epoch = batches_per_epoch_;
  counts.shards_per_epoch = shards_per_epoch_;
  counts.examples_trained = examples_trained_;
  counts.shards_done = shards_done_;
  counts.shards_requeued = shards_requeued_;
  counts.examples_trained_twice = examples_trained_twice_;
  return counts;
}

DataQueueState DataQueue::Save() {
  absl::MutexLock lock(&mu_);
  Settle();
  DataQueueState state;
  state.set_epochs(epochs_);
  state.set_batch_size(batch_size_);
  state.set_shard_batches(shard_batches_);
  state.set_batches_per_epoch(batches_per_epoch_);
  state.set_epoch(epoch_);
  state.set_next_index(next_index_);
  auto add = [](DataShardRef* ref, const DataShard& shard, int rank) {
    ref->set_epoch(shard.epoch);
    ref->set_index(shard.index);
    ref->set_rank(rank);
  };
  for (const auto& [rank, held] : held_) {
    add(state.add_in_flight(), held.shard, rank);
  }
  for (const auto& [rank, held] : trained_) {
    add(state.add_in_flight(), held.shard, rank);
  }
  for (const DataShard& shard : put_back_) add(state.add_put_back(), shard, 0);
  for (int epoch = 0; epoch < epochs_; ++epoch) {
    for (int64_t index : done_[epoch]) {
      DataShardRef* ref = state.add_done();
      ref->set_epoch(epoch);
      ref->set_index(index);
    }
  }
  for (int64_t examples : examples_trained_) state.add_examples_trained(examples);
  state.set_shards_requeued(shards_requeued_);
  state.set_examples_trained_twice(examples_trained_twice_);
  return state;
}

absl::Status DataQueue::Restore(const DataQueueState& state) {
  if (state.batches_per_epoch() == 0) {
    return absl::OkStatus();  // saved before the first Take
  }
  if (state.epochs() != epochs_ || state.batch_size() != batch_size_ ||
      state.shard_batches() != shard_batches_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoint's data queue is of ", state.epochs(), " epochs, ",
        "batches of ", state.batch_size(), " and data shards of ",
        state.shard_batches(), " batches; this run's of ", epochs_, ", ",
        batch_size_, " and ", shard_batches_));
  }
  absl::MutexLock lock(&mu_);
  batches_per_epoch_ = std::max<int64_t>(state.batches_per_epoch(), 1);
  shards_per_epoch_ = (batches_per_epoch_ + shard_batches_ - 1) / shard_batches_;
  auto missing = [](const DataShardRef& ref) {
    return absl::InvalidArgumentError(
        absl::StrCat("the checkpoint's data queue names shard ", ref.index(),
                     " of epoch ", ref.epoch(), ", which does not exist"));
  };
  epoch_ = std::clamp(state.epoch(), 0, epochs_);
  next_index_ = std::clamp<int64_t>(state.next_index(), 0, shards_per_epoch_);
  put_back_.clear();
  held_.clear();
  trained_.clear();
  for (auto& done : done_) done.clear();
  shards_done_ = 0;
  for (const DataShardRef& ref : state.done()) {
    if (!Exists(ref.epoch(), ref.index())) return missing(ref);
    if (done_[ref.epoch()].insert(ref.index()).second) ++shards_done_;
  }
  // Shards in flight when the checkpoint was written go first.
  for (const auto* list : {&state.in_flight(), &state.put_back()}) {
    for (const DataShardRef& ref : *list) {
      if (!Exists(ref.epoch(), ref.index())) return missing(ref);
      const DataShard shard = MakeShard(ref.epoch(), ref.index());
      if (!IsDone(shard)) put_back_.push_back(shard);
    }
  }
  for (int epoch = 0; epoch < epochs_; ++epoch) {
    examples_trained_[epoch] = epoch < state.examples_trained_size()
                                   ? state.examples_trained(epoch)
                                   : 0;
  }
  shards_requeued_ = state.shards_requeued();
  examples_trained_twice_ = state.examples_trained_twice();
  return absl::OkStatus();
}

}  // namespace monsoon::server
