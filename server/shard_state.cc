#include "server/shard_state.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/blocking_counter.h"

namespace monsoon::server {

ShardState::ShardState(const common::ModelLayout& layout, uint64_t seed,
                       int shard, int num_shards)
    : shard_(shard),
      num_shards_(num_shards),
      range_(common::ShardRangeFor(layout.num_params(), num_shards, shard)),
      layout_(layout),
      seed_(seed),
      buffers_(range_.size()),
      staleness_counts_(kStalenessBuckets, 0) {}

ShardState::~ShardState() {
  absl::MutexLock lock(&helpers_mu_);
  helpers_.reset();
}

void ShardState::RunWaiters(std::vector<Waiter> ready) {
  if (ready.size() > 1) {
    TaskThreads* helpers = nullptr;
    {
      absl::MutexLock lock(&helpers_mu_);
      if (helpers_ == nullptr) {
        const int cores = static_cast<int>(std::thread::hardware_concurrency());
        helpers_ = std::make_unique<TaskThreads>(std::max(cores - 1, 0));
      }
      helpers = helpers_.get();
    }
    if (helpers->size() > 0) {
      absl::BlockingCounter done(static_cast<int>(ready.size()) - 1);
      for (size_t i = 1; i < ready.size(); ++i) {
        helpers->Run([&done, waiter = std::move(ready[i])] {
          waiter();
          done.DecrementCount();
        });
      }
      ready[0]();
      done.Wait();
      return;
    }
  }
  for (auto& waiter : ready) waiter();
}

WeightsPtr Weights::Share(const std::shared_ptr<Weights>& weights) {
  // Counted under the owner's lock, so an owner that sees no readers sees
  // every hold taken before; released from any thread.
  weights->readers_.fetch_add(1, std::memory_order_relaxed);
  return WeightsPtr(weights.get(), [held = weights](const Weights* w) {
    w->readers_.fetch_sub(1, std::memory_order_release);
  });
}

std::shared_ptr<Weights> ShardState::InitialWeights() {
  FloatBufferPool::Buffer values = buffers_.Take();
  if (initial_values_.size() == size()) {
    std::copy(initial_values_.begin(), initial_values_.end(), values.get());
  } else {
    common::InitialValues(layout_, seed_, range_.begin,
                          absl::MakeSpan(values.get(), size()));
  }
  return std::make_shared<Weights>(0, std::move(values), size());
}

std::shared_ptr<Weights> ShardState::MakeWeights(
    int64_t version, absl::Span<const float> values) {
  FloatBufferPool::Buffer buffer = buffers_.Take();
  std::copy(values.begin(), values.end(), buffer.get());
  return std::make_shared<Weights>(version, std::move(buffer), size());
}

int64_t ShardState::version() const {
  absl::MutexLock lock(&waiters_mu_);
  return version_;
}

size_t ShardState::NumWaiting() const {
  absl::MutexLock lock(&waiters_mu_);
  return waiters_.size();
}

uint64_t ShardState::WhenVersionAtLeast(int64_t min_version, Waiter ready,
                                        absl::Time deadline, Waiter expired,
                                        int clock_rank) {
  const int caller_rank = clock_rank;
  if (!has_staleness_bound()) clock_rank = -1;
  std::optional<Clocks> clocks;
  if (clock_rank >= 0) clocks = ReadClocks(absl::Now());
  {
    absl::MutexLock lock(&waiters_mu_);
    if (version_ < min_version ||
        (clocks.has_value() && !bound_->Allows(*clocks, clock_rank))) {
      const uint64_t id = next_waiter_id_++;
      waiters_.emplace(id, Pending{min_version, std::move(ready), deadline,
                                   std::move(expired), clock_rank,
                                   caller_rank});
      return id;
    }
  }
  ready();
  return 0;
}

void ShardState::SetStalenessBound(StalenessBound bound) {
  bound_.emplace(std::move(bound));
}

std::map<int, int64_t> ShardState::ClockExamples() const {
  absl::MutexLock lock(&stats_mu_);
  std::map<int, int64_t> examples = applied_samples_;
  for (const auto& [rank, offset] : clock_offsets_) examples[rank] += offset;
  return examples;
}

ShardState::Clocks ShardState::ReadClocks(absl::Time now) const {
  return bound_->Read(ClockExamples(),
                      sessions_.LiveRanks(bound_->num_workers(), now));
}

absl::Status ShardState::OpenSession(int rank, uint64_t session,
                                     uint64_t replaces) {
  const absl::Time now = absl::Now();
  const bool joins = elastic_ && bound_.has_value() && rank >= 0 &&
                     rank < bound_->num_workers() &&
                     !sessions_.Alive(rank, now);
  if (absl::Status opened = sessions_.Open(rank, session, replaces);
      !opened.ok()) {
    return opened;
  }
  if (!joins) return absl::OkStatus();
  std::vector<bool> others = sessions_.LiveRanks(bound_->num_workers(), now);
  others[rank] = false;
  const Clocks clocks = bound_->Read(ClockExamples(), others);
  if (clocks.slowest_rank < 0) return absl::OkStatus();  // nobody to follow
  absl::MutexLock lock(&stats_mu_);
  auto applied = applied_samples_.find(rank);
  clock_offsets_[rank] =
      clocks.slowest * bound_->batch_size() -
      (applied == applied_samples_.end() ? 0 : applied->second);
  return absl::OkStatus();
}

std::vector<ShardState::Waiter> ShardState::TakeReady(const Clocks* clocks) {
  std::vector<Waiter> ready;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    const Pending& pending = it->second;
    if (pending.min_version <= version_ &&
        (pending.clock_rank < 0 || clocks == nullptr ||
         bound_->Allows(*clocks, pending.clock_rank))) {
      ready.push_back(std::move(it->second.ready));
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  return ready;
}

std::vector<ShardState::Waiter> ShardState::ReleaseWaiters(absl::Time now) {
  if (!has_staleness_bound()) return {};
  const Clocks clocks = ReadClocks(now);
  absl::MutexLock lock(&waiters_mu_);
  return TakeReady(&clocks);
}

std::vector<std::string> ShardState::DescribeClockWaits(absl::Time now) const {
  std::vector<std::string> lines;
  if (!has_staleness_bound()) return lines;
  const Clocks clocks = ReadClocks(now);
  absl::MutexLock lock(&waiters_mu_);
  for (const auto& [id, pending] : waiters_) {
    if (pending.clock_rank < 0 || bound_->Allows(clocks, pending.clock_rank)) {
      continue;
    }
    lines.push_back(bound_->DescribeWait(clocks, pending.clock_rank));
  }
  return lines;
}

void ShardState::ExpireWaiters(absl::Time now) {
  std::vector<Waiter> expired;
  {
    absl::MutexLock lock(&waiters_mu_);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->second.deadline < now && it->second.expired != nullptr) {
        expired.push_back(std::move(it->second.expired));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Waiter& run : expired) run();
}

bool ShardState::CancelWaiter(uint64_t id) {
  absl::MutexLock lock(&waiters_mu_);
  return waiters_.erase(id) > 0;
}

void ShardState::TouchWaitingRanks() {
  std::set<int> waiting;
  {
    absl::MutexLock lock(&waiters_mu_);
    for (const auto& [id, pending] : waiters_) {
      if (pending.caller_rank >= 0) waiting.insert(pending.caller_rank);
    }
  }
  for (int rank : waiting) Touch(rank);
}

std::vector<ShardState::Waiter> ShardState::AdvanceVersion(int64_t version) {
  // The rules count a version's examples (RecordAppliedSamples) before
  // they advance to it: the clocks read here include them.
  std::optional<Clocks> clocks;
  if (has_staleness_bound()) clocks = ReadClocks(absl::Now());
  absl::MutexLock lock(&waiters_mu_);
  version_ = std::max(version_, version);
  return TakeReady(clocks.has_value() ? &*clocks : nullptr);
}

void ShardState::ResetVersion(int64_t version) {
  absl::MutexLock lock(&waiters_mu_);
  version_ = version;
}

absl::Time ShardState::BeginApply() {
  const int now = applying_.fetch_add(1) + 1;
  int seen = max_applying_.load();
  while (now > seen && !max_applying_.compare_exchange_weak(seen, now)) {
  }
  if (apply_hook_) apply_hook_();
  return absl::Now();
}

void ShardState::EndApply(absl::Time began) {
  applying_.fetch_sub(1);
  apply_seconds_.Observe(absl::ToDoubleSeconds(absl::Now() - began));
}

void ShardState::RecordCheckpoint(absl::Time ended, absl::Duration took,
                                  bool ok) {
  checkpoint_seconds_.Observe(absl::ToDoubleSeconds(took));
  absl::MutexLock lock(&stats_mu_);
  if (ok) {
    checkpoints_.last_written = ended;
  } else {
    ++checkpoints_.failures;
  }
}

ShardState::CheckpointStats ShardState::checkpoint_stats() const {
  absl::MutexLock lock(&stats_mu_);
  return checkpoints_;
}

namespace {

// a += b for counters of non-negative amounts, stopping at the largest value
// instead of overflowing (a claim from the network is bounded, but a counter
// must not become undefined behaviour whatever comes).
void AddSaturating(int64_t& a, int64_t b) {
  b = std::max<int64_t>(b, 0);
  a = a > std::numeric_limits<int64_t>::max() - b
          ? std::numeric_limits<int64_t>::max()
          : a + b;
}

}  // namespace

void ShardState::RecordPush(int64_t staleness, int64_t samples, int64_t bytes) {
  absl::MutexLock lock(&stats_mu_);
  if (first_push_unix_s_ == 0) {
    first_push_unix_s_ = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  }
  AddSaturating(pushes_, 1);
  AddSaturating(samples_, samples);
  AddSaturating(bytes_pushed_, bytes);
  staleness = std::max<int64_t>(staleness, 0);
  staleness_max_ = std::max(staleness_max_, staleness);
  AddSaturating(staleness_sum_, staleness);
  ++staleness_counts_[std::min<int64_t>(staleness, kStalenessBuckets - 1)];
}

void ShardState::RecordAppliedSamples(int worker_rank, int64_t samples) {
  absl::MutexLock lock(&stats_mu_);
  AddSaturating(applied_samples_[worker_rank], samples);
}

int64_t ShardState::AppliedSamples(int worker_rank) const {
  absl::MutexLock lock(&stats_mu_);
  auto it = applied_samples_.find(worker_rank);
  return it == applied_samples_.end() ? 0 : it->second;
}

int64_t ShardState::SamplePosition(int worker_rank) const {
  absl::MutexLock lock(&stats_mu_);
  auto it = positions_.find(worker_rank);
  return it == positions_.end() ? 0 : it->second;
}

bool ShardState::IsRepeat(int worker_rank, int64_t offset, int64_t samples) {
  absl::MutexLock lock(&stats_mu_);
  auto it = positions_.find(worker_rank);
  const int64_t position = it == positions_.end() ? 0 : it->second;
  if (samples <= 0 || offset + samples > position) return false;
  ++duplicate_pushes_;
  return true;
}

void ShardState::AdvancePosition(int worker_rank, int64_t offset,
                                 int64_t samples) {
  absl::MutexLock lock(&stats_mu_);
  int64_t& position = positions_[worker_rank];
  position = std::max(position, offset + samples);
}

bool ShardState::ClaimSamples(int worker_rank, int64_t offset,
                              int64_t samples) {
  absl::MutexLock lock(&stats_mu_);
  int64_t& position = positions_[worker_rank];
  if (samples > 0 && offset + samples <= position) {
    ++duplicate_pushes_;
    return false;
  }
  position = std::max(position, offset + samples);
  return true;
}

void ShardState::SkipSamples(int worker_rank, int64_t samples) {
  absl::MutexLock lock(&stats_mu_);
  AddSaturating(positions_[worker_rank], samples);
  AddSaturating(skipped_samples_[worker_rank], samples);
}

void ShardState::PassOver(int worker_rank, int64_t offset, int64_t samples) {
  absl::MutexLock lock(&stats_mu_);
  int64_t& position = positions_[worker_rank];
  position = std::max(position, offset + samples);
  AddSaturating(skipped_samples_[worker_rank], samples);
}

void ShardState::RecordBackupDrop(int64_t bytes) {
  absl::MutexLock lock(&stats_mu_);
  AddSaturating(backup_dropped_, 1);
  AddSaturating(bytes_pushed_, bytes);
}

void ShardState::RecordRefusedUpdate() {
  absl::MutexLock lock(&stats_mu_);
  AddSaturating(refused_updates_, 1);
}

int64_t ShardState::RecordRejectedPush(absl::StatusCode code) {
  absl::MutexLock lock(&stats_mu_);
  AddSaturating(rejected_pushes_, 1);
  AddSaturating(rejected_by_code_[absl::StatusCodeToString(code)], 1);
  return rejected_pushes_;
}

void ShardState::RecordSparsePushBytes(int64_t bytes) {
  absl::MutexLock lock(&stats_mu_);
  AddSaturating(bytes_pushed_, bytes);
}

void ShardState::RecordPulledBytes(int64_t bytes) {
  absl::MutexLock lock(&stats_mu_);
  AddSaturating(bytes_pulled_, bytes);
}

void ShardState::SetNumWorkers(int num_workers) {
  absl::MutexLock lock(&stats_mu_);
  num_workers_ = num_workers;
}

void ShardState::SetElastic(std::unique_ptr<DataQueue> queue) {
  elastic_ = true;
  data_queue_ = std::move(queue);
  sessions_.set_elastic(true);
}

std::unique_ptr<DataQueue> ShardState::MakeDataQueue(int epochs,
                                                     int64_t batch_size,
                                                     int shard_batches) {
  return std::make_unique<DataQueue>(
      epochs, batch_size, shard_batches,
      [this](int rank) { return SamplePosition(rank); });
}

bool ShardState::ReleaseData(int rank) {
  if (data_queue_ == nullptr) return false;
  return data_queue_->Release(rank);
}

std::vector<int> ShardState::ReleaseSilentData(absl::Time now) {
  std::vector<int> released;
  if (data_queue_ == nullptr) return released;
  const absl::Duration lease = sessions_.lease();
  for (int rank : data_queue_->Ranks()) {
    if (sessions_.SinceContact(rank, now) >= lease * 1.5 &&
        data_queue_->Release(rank)) {
      released.push_back(rank);
    }
  }
  return released;
}

absl::Status ShardState::RestoreDataQueue(const StatsResponse& stats) {
  if (data_queue_ == nullptr || !stats.has_data_queue()) {
    return absl::OkStatus();
  }
  return data_queue_->Restore(stats.data_queue());
}

bool ShardState::FinishedLocked() const {
  if (num_workers_ <= 0) return false;
  if (!elastic_) {
    return static_cast<int>(finished_ranks_.size()) >= num_workers_;
  }
  // A rank finishes only once the queue is done (or, in sync, has nothing
  // left for it): then the others still live are finishing too.
  if (finished_ranks_.empty()) return false;
  const std::vector<bool> live = sessions_.LiveRanks(num_workers_, absl::Now());
  for (int rank = 0; rank < num_workers_; ++rank) {
    if (live[rank] && finished_ranks_.count(rank) == 0) return false;
  }
  return true;
}

bool ShardState::NoteFinishedLocked() const {
  if (workers_finished_unix_s_ != 0 || finished_ranks_.empty() ||
      !FinishedLocked()) {
    return false;
  }
  workers_finished_unix_s_ =
      absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  return true;
}

bool ShardState::WorkersFinished() const {
  absl::MutexLock lock(&stats_mu_);
  return FinishedLocked();
}

bool ShardState::FinishRank(int rank) {
  absl::MutexLock lock(&stats_mu_);
  finished_ranks_.insert(rank);
  // Not "complete now and not before": in an elastic run the rank's
  // session ended first (Shard::FinishRank), so the last rank already
  // finds every other live rank finished before it is counted.
  return NoteFinishedLocked();
}

absl::Status ShardState::CloseRun(bool closed_by_primary) {
  if (!closed_by_primary) {
    absl::MutexLock lock(&stats_mu_);
    std::vector<int> missing;
    const std::vector<bool> live =
        sessions_.LiveRanks(std::max(num_workers_, 0), absl::Now());
    for (int rank = 0; rank < num_workers_; ++rank) {
      // Elastic: the ranks that are gone are not waited for.
      if (elastic_ && !live[rank]) continue;
      if (finished_ranks_.count(rank) == 0) missing.push_back(rank);
    }
    if (num_workers_ <= 0 || !missing.empty() || !FinishedLocked()) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", shard_,
                       ": the run cannot be closed before every worker "
                       "has finished; rank(s) ",
                       absl::StrJoin(missing, ","), " have not"));
    }
  }
  if (!run_closed_.HasBeenNotified()) run_closed_.Notify();
  return absl::OkStatus();
}

StatsResponse ShardState::Stats() const {
  StatsResponse stats;
  // Before stats_mu_: the queue reads the ledger under its own lock.
  if (data_queue_ != nullptr) *stats.mutable_data_queue() = data_queue_->Save();
  stats.set_shard(shard_);
  stats.set_version(version());
  absl::MutexLock lock(&stats_mu_);
  stats.set_pushes(pushes_);
  stats.set_rejected_pushes(rejected_pushes_);
  for (const auto& [code, count] : rejected_by_code_) {
    (*stats.mutable_rejected_pushes_by_code())[code] = count;
  }
  stats.set_samples(samples_);
  stats.set_bytes_pushed(bytes_pushed_);
  stats.set_bytes_pulled(bytes_pulled_);
  stats.set_staleness_max(staleness_max_);
  stats.set_max_concurrent_applies(max_applying_.load());
  for (const auto& [rank, samples] : applied_samples_) {
    (*stats.mutable_samples_applied_by_worker())[rank] = samples;
  }
  for (const auto& [rank, position] : positions_) {
    (*stats.mutable_sample_position_by_worker())[rank] = position;
  }
  for (const auto& [rank, samples] : skipped_samples_) {
    (*stats.mutable_samples_skipped_by_worker())[rank] = samples;
  }
  stats.set_duplicate_pushes(duplicate_pushes_);
  stats.set_refused_updates(refused_updates_);
  stats.set_backup_dropped_pushes(backup_dropped_);
  for (int rank : finished_ranks_) stats.add_finished_ranks(rank);
  // A rank whose lease ran out can complete an elastic run without a
  // FinishRank: its time is noted at the first look.
  NoteFinishedLocked();
  stats.set_workers_finished(FinishedLocked());
  if (elastic_) {
    const Sessions::Membership membership = sessions_.membership();
    stats.set_membership_epoch(membership.epoch);
    stats.set_joins(membership.joins);
    stats.set_leaves(membership.leaves);
    const std::vector<bool> live =
        sessions_.LiveRanks(std::max(num_workers_, 0), absl::Now());
    for (int rank = 0; rank < num_workers_; ++rank) {
      if (live[rank]) stats.add_live_ranks(rank);
    }
  }
  stats.set_first_push_unix_s(first_push_unix_s_);
  stats.set_workers_finished_unix_s(workers_finished_unix_s_);
  stats.set_run_closed(run_closed_.HasBeenNotified());
  stats.set_staleness_sum(staleness_sum_);
  // Trim trailing zero buckets to keep the message small.
  size_t used = staleness_counts_.size();
  while (used > 0 && staleness_counts_[used - 1] == 0) --used;
  for (size_t i = 0; i < used; ++i) {
    stats.add_staleness_counts(staleness_counts_[i]);
  }
  return stats;
}

void ShardState::RestoreStats(const StatsResponse& stats) {
  absl::MutexLock lock(&stats_mu_);
  pushes_ = stats.pushes();
  rejected_pushes_ = stats.rejected_pushes();
  // Only the names of status codes, so that a damaged or crafted file
  // cannot add labels to the metrics; what they leave out (an older
  // checkpoint kept no codes) counts as UNKNOWN.
  rejected_by_code_.clear();
  int64_t by_code = 0;
  for (int c = 1; c <= 16; ++c) {
    const std::string name =
        absl::StatusCodeToString(static_cast<absl::StatusCode>(c));
    auto it = stats.rejected_pushes_by_code().find(name);
    if (it == stats.rejected_pushes_by_code().end() || it->second <= 0) {
      continue;
    }
    rejected_by_code_[name] = it->second;
    AddSaturating(by_code, it->second);
  }
  if (rejected_pushes_ > by_code) {
    AddSaturating(rejected_by_code_["UNKNOWN"], rejected_pushes_ - by_code);
  }
  samples_ = stats.samples();
  bytes_pushed_ = stats.bytes_pushed();
  bytes_pulled_ = stats.bytes_pulled();
  staleness_max_ = stats.staleness_max();
  applied_samples_.clear();
  for (const auto& [rank, samples] : stats.samples_applied_by_worker()) {
    applied_samples_[rank] = samples;
  }
  positions_.clear();
  for (const auto& [rank, position] : stats.sample_position_by_worker()) {
    positions_[rank] = position;
  }
  // A checkpoint from before positions were kept: each rank's data was
  // applied in order from its start, so its position is its count.
  if (stats.sample_position_by_worker().empty()) positions_ = applied_samples_;
  skipped_samples_.clear();
  for (const auto& [rank, samples] : stats.samples_skipped_by_worker()) {
    skipped_samples_[rank] = samples;
  }
  duplicate_pushes_ = stats.duplicate_pushes();
  // Only ranks of this run, so that a damaged or crafted file cannot make
  // a rank count as finished that never ran.
  finished_ranks_.clear();
  for (int rank : stats.finished_ranks()) {
    if (rank >= 0 && rank < num_workers_) finished_ranks_.insert(rank);
  }
  first_push_unix_s_ = std::max(0.0, stats.first_push_unix_s());
  workers_finished_unix_s_ = std::max(0.0, stats.workers_finished_unix_s());
  backup_dropped_ = std::max<int64_t>(0, stats.backup_dropped_pushes());
  refused_updates_ = stats.refused_updates();
  staleness_sum_ = stats.staleness_sum();
  std::fill(staleness_counts_.begin(), staleness_counts_.end(), 0);
  const int n = std::min<int>(stats.staleness_counts_size(),
                              static_cast<int>(staleness_counts_.size()));
  for (int i = 0; i < n; ++i) staleness_counts_[i] = stats.staleness_counts(i);
  // Counts beyond our histogram (a file from a build with more buckets)
  // join the last bucket.
  for (int i = n; i < stats.staleness_counts_size(); ++i) {
    staleness_counts_.back() += stats.staleness_counts(i);
  }
}

}  // namespace monsoon::server
