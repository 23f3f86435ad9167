#include "server/sparse_table.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model_layout.h"
#include "common/sparse_ids.h"
#include "common/sparse_table_config.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "sparse table snapshots are little-endian float32; port Snapshot and Restore."
#endif

namespace monsoon::server {
namespace {

// No row (a slot number no row has).
constexpr uint32_t kNoSlot = std::numeric_limits<uint32_t>::max();
// How many ids ahead of the one in hand a pull or push starts loading an
// id's index entry, and then its row: enough misses in flight to overlap
// (tools/bench/sparse_bench measures it).
constexpr size_t kPrefetchAhead = 16;

int StateFloats(const SparseTableConfig& config) {
  switch (config.optimizer()) {
    case SparseTableConfig::SPARSE_ADAGRAD:
      return config.dim();
    case SparseTableConfig::SPARSE_ROWWISE_ADAGRAD:
      return 1;
    default:
      return 0;
  }
}

// 24 random bits of `bits` as a uniform value in [-1, 1).
double Uniform(uint64_t bits) {
  return static_cast<double>(bits >> 40) / (1ull << 23) - 1.0;
}

}  // namespace

uint64_t SparseTable::BytesAtMaxRows(const SparseTableConfig& config) {
  // absl::flat_hash_map<uint64_t, uint32_t>: a 16-byte slot and a control
  // byte per bucket, at least 7/16 of them full (it doubles at 7/8); the
  // slots' and free list's vectors at most twice their size.
  constexpr uint64_t kIndexEntry = (16 + 1) * 16 / 7 + 1;
  const bool admission =
      config.admit_min_count() > 1 || config.admit_probability() < 1;
  const uint64_t per_row =
      sizeof(float) *
          static_cast<uint64_t>(config.dim() + StateFloats(config)) +
      2 * (sizeof(Slot) + sizeof(uint32_t)) + kIndexEntry +
      (admission ? kIndexEntry : 0);
  return per_row * static_cast<uint64_t>(config.max_rows());
}

absl::StatusOr<std::unique_ptr<SparseTable>> SparseTable::Create(
    const SparseTableConfig& config, uint64_t seed) {
  if (absl::Status valid = common::ValidateSparseTable(config); !valid.ok()) {
    return valid;
  }
  const std::string& name = config.name();
  // Address space for every row, in whole huge pages; MAP_NORESERVE: only
  // the rows made take memory.
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t row_bytes =
      sizeof(float) * static_cast<size_t>(config.dim() + StateFloats(config));
  const size_t bytes =
      (static_cast<size_t>(config.max_rows()) * row_bytes + kHugePage - 1) /
      kHugePage * kHugePage;
  void* slab = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (slab == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "sparse table '", name, "': cannot reserve ", bytes >> 20,
        " MiB of address space for max_rows ", config.max_rows(), " rows of ",
        row_bytes, " bytes; lower max_rows"));
  }
  madvise(slab, bytes, MADV_HUGEPAGE);  // a hint: 4 KiB pages work too
  return std::unique_ptr<SparseTable>(
      new SparseTable(config, seed, static_cast<float*>(slab), bytes));
}

SparseTable::~SparseTable() { munmap(slab_, slab_bytes_); }

SparseTable::SparseTable(const SparseTableConfig& config, uint64_t seed,
                         float* slab, size_t slab_bytes)
    : config_(config),
      dim_(config.dim()),
      state_floats_(StateFloats(config)),
      stride_(dim_ + state_floats_),
      row_seed_(common::SplitMix64(seed) ^
                common::HashStringId(config.name())),
      init_scale_(config.has_init_scale()
                      ? config.init_scale()
                      : static_cast<float>(1.0 / std::sqrt(dim_))),
      slab_(slab),
      slab_bytes_(slab_bytes) {}

void SparseTable::InitialRow(uint64_t id, absl::Span<float> out) const {
  const uint64_t base = common::SplitMix64(row_seed_ ^ id);
  for (int c = 0; c < dim_; ++c) {
    out[c] = init_scale_ == 0
                 ? 0.0f
                 : static_cast<float>(
                       init_scale_ *
                       Uniform(common::SplitMix64(base + static_cast<uint64_t>(c))));
  }
}

bool SparseTable::Admits(uint64_t id, uint32_t count) const {
  if (count < static_cast<uint32_t>(config_.admit_min_count())) return false;
  const float p = config_.admit_probability();
  if (p >= 1) return true;
  const uint64_t bits = common::SplitMix64(
      row_seed_ ^ common::SplitMix64(id) ^ (count * 0x9e3779b97f4a7c15ull));
  return (Uniform(bits) + 1.0) / 2.0 < p;
}

absl::Status SparseTable::Pull(absl::Span<const uint64_t> ids,
                               absl::Span<float> out) const {
  if (out.size() != ids.size() * static_cast<size_t>(dim_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sparse table '", config_.name(), "': a pull of ", ids.size(),
        " rows of ", dim_, " values needs ", ids.size() * dim_,
        " values, not ", out.size()));
  }
  absl::ReaderMutexLock lock(&mu_);
  // Each id's index entry and row are cache misses in a large table: the
  // entries are looked up, and then the rows read, kPrefetchAhead ids
  // after their loads were started, so that the misses overlap.
  std::vector<uint32_t> slots(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i + kPrefetchAhead < ids.size()) {
      index_.prefetch(ids[i + kPrefetchAhead]);
    }
    auto it = index_.find(ids[i]);
    slots[i] = it == index_.end() ? kNoSlot : it->second;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i + kPrefetchAhead < ids.size()) PrefetchRow(slots[i + kPrefetchAhead]);
    float* into = out.data() + i * dim_;
    if (slots[i] == kNoSlot) {
      InitialRow(ids[i], absl::MakeSpan(into, dim_));
    } else {
      const float* row = slab_ + size_t{slots[i]} * stride_;
      std::copy(row, row + dim_, into);
    }
  }
  return absl::OkStatus();
}

void SparseTable::PrefetchRow(uint32_t slot) const {
  if (slot == kNoSlot) return;
  __builtin_prefetch(slab_ + size_t{slot} * stride_, /*rw=*/1);
  __builtin_prefetch(slots_.data() + slot, /*rw=*/1);
}

void SparseTable::ApplyRow(float* row, const float* grad,
                           float learning_rate) const {
  float* state = row + dim_;
  switch (config_.optimizer()) {
    case SparseTableConfig::SPARSE_ADAGRAD:
      for (int c = 0; c < dim_; ++c) {
        state[c] += grad[c] * grad[c];
        row[c] -= learning_rate * grad[c] / std::sqrt(state[c]);
      }
      break;
    case SparseTableConfig::SPARSE_ROWWISE_ADAGRAD: {
      float sum = 0;
      for (int c = 0; c < dim_; ++c) sum += grad[c] * grad[c];
      state[0] += sum / static_cast<float>(dim_);
      const float scale = learning_rate / std::sqrt(state[0]);
      for (int c = 0; c < dim_; ++c) row[c] -= scale * grad[c];
      break;
    }
    default:
      for (int c = 0; c < dim_; ++c) row[c] -= learning_rate * grad[c];
  }
}

uint32_t SparseTable::NewRow(uint64_t id, int64_t step) {
  uint32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();  // below max_rows: Push checked
  }
  slots_[slot] = {id, step};
  float* row = slab_ + size_t{slot} * stride_;
  InitialRow(id, absl::MakeSpan(row, dim_));
  std::fill(row + dim_, row + stride_, config_.adagrad_initial_accumulator());
  index_.emplace(id, slot);
  return slot;
}

void SparseTable::EvictSlot(uint32_t slot) {
  index_.erase(slots_[slot].id);
  free_.push_back(slot);
  ++stats_.evicted;
}

int64_t SparseTable::EvictLeastRecent(
    int64_t needed, const absl::flat_hash_set<uint64_t>& keep) {
  // (last push, id): rows last pushed at the same step go by id, not by
  // slot, so that two copies of the table whose slots differ (a backup
  // restored from a copy) evict the same rows.
  std::vector<std::pair<int64_t, uint64_t>> candidates;
  candidates.reserve(index_.size());
  for (const auto& [id, slot] : index_) {
    if (!keep.contains(id)) {
      candidates.emplace_back(slots_[slot].last_pushed, id);
    }
  }
  const int64_t count = std::min<int64_t>(
      candidates.size(), std::max<int64_t>(needed, config_.max_rows() / 10));
  std::nth_element(candidates.begin(), candidates.begin() + count,
                   candidates.end());
  for (int64_t i = 0; i < count; ++i) {
    EvictSlot(index_.at(candidates[i].second));
  }
  return count;
}

absl::StatusOr<SparsePushResult> SparseTable::Push(
    absl::Span<const uint64_t> ids, absl::Span<const float> grads,
    float run_learning_rate, int64_t step) {
  const std::string& name = config_.name();
  const float learning_rate = config_.has_learning_rate()
                                  ? config_.learning_rate()
                                  : run_learning_rate;
  auto refuse = [this](absl::Status status) {
    absl::MutexLock lock(&mu_);
    ++stats_.refused_pushes;
    return status;
  };
  if (grads.size() != ids.size() * static_cast<size_t>(dim_)) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "sparse table '", name, "': a push of ", ids.size(), " rows of ", dim_,
        " values has ", grads.size(), " values")));
  }
  if (!std::isfinite(learning_rate) || learning_rate < 0) {
    return refuse(absl::InvalidArgumentError(
        absl::StrCat("sparse table '", name, "': learning rate ",
                     learning_rate, " is not a finite rate >= 0")));
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!std::isfinite(grads[i])) {
      return refuse(absl::InvalidArgumentError(absl::StrCat(
          "sparse table '", name, "': the gradient of id ", ids[i / dim_],
          " holds ", grads[i], " (value ", i % dim_,
          "); nothing of the push was applied")));
    }
  }
  absl::MutexLock lock(&mu_);
  auto refuse_locked = [this](absl::Status status) {
    ++stats_.refused_pushes;
    return status;
  };
  // Look every id up, and count the rows the push would create, before
  // writing anything. kNoSlot: no row.
  std::vector<uint32_t> slots(ids.size(), kNoSlot);
  std::vector<uint32_t> counts(ids.size(), 0);  // pushes of a pending id
  absl::flat_hash_set<uint64_t> in_push;
  in_push.reserve(ids.size());
  int64_t existing = 0, admitted_new = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i + kPrefetchAhead < ids.size()) {
      index_.prefetch(ids[i + kPrefetchAhead]);
    }
    if (!in_push.insert(ids[i]).second) {
      return refuse_locked(absl::InvalidArgumentError(absl::StrCat(
          "sparse table '", name, "': id ", ids[i],
          " appears twice in one push (a worker sums a batch's repeats)")));
    }
    auto it = index_.find(ids[i]);
    if (it != index_.end()) {
      slots[i] = it->second;
      ++existing;
      continue;
    }
    auto pending = pending_.find(ids[i]);
    counts[i] = (pending == pending_.end() ? 0 : pending->second) + 1;
    if (Admits(ids[i], counts[i])) ++admitted_new;
  }
  const int64_t max_rows = config_.max_rows();
  const int64_t rows = static_cast<int64_t>(index_.size());
  if (existing + admitted_new > max_rows) {
    return refuse_locked(absl::ResourceExhaustedError(absl::StrCat(
        "sparse table '", name, "': one push of ", existing + admitted_new,
        " rows cannot fit in max_rows ", max_rows,
        "; raise max_rows, or push fewer ids at a time")));
  }
  const bool evict = config_.at_max_rows() == SparseTableConfig::EVICT_LEAST_RECENT;
  if (rows + admitted_new > max_rows && !evict) {
    return refuse_locked(absl::ResourceExhaustedError(absl::StrCat(
        "sparse table '", name, "' holds ", rows, " rows of its max_rows ",
        max_rows, " on this shard, and this push would create ", admitted_new,
        " more; nothing was applied. Raise max_rows, or let rows go: "
        "at_max_rows: EVICT_LEAST_RECENT or evict_unseen_steps")));
  }

  // Checked: apply. Making room evicts rows outside the push: there are
  // enough, since the push's own rows fit (above).
  SparsePushResult result;
  if (rows + admitted_new > max_rows) {
    result.evicted = EvictLeastRecent(rows + admitted_new - max_rows, in_push);
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i + kPrefetchAhead < ids.size()) PrefetchRow(slots[i + kPrefetchAhead]);
    uint32_t slot = slots[i];
    if (slot != kNoSlot) slots_[slot].last_pushed = step;
    if (slot == kNoSlot) {
      if (!Admits(ids[i], counts[i])) {
        if (pending_.size() >= static_cast<size_t>(max_rows) &&
            !pending_.contains(ids[i])) {
          pending_.clear();  // bounded: counting starts again
        }
        pending_[ids[i]] = counts[i];
        ++result.not_admitted;
        continue;
      }
      if (counts[i] > 1) pending_.erase(ids[i]);
      slot = NewRow(ids[i], step);
      ++result.created;
    }
    ApplyRow(slab_ + size_t{slot} * stride_,
             grads.data() + i * dim_, learning_rate);
    ++result.updated;
  }
  stats_.row_updates += result.updated;
  stats_.created += result.created;
  stats_.not_admitted += result.not_admitted;
  // After the apply: this push's rows were pushed at `step`, and stay.
  if (config_.evict_unseen_steps() > 0 && step - swept_at_ >= SweepEvery()) {
    result.evicted += EvictUnseenLocked(step);
  }
  return result;
}

int64_t SparseTable::SweepEvery() const {
  return std::max<int64_t>(1, config_.evict_unseen_steps() / 10);
}

int64_t SparseTable::EvictUnseen(int64_t step) {
  absl::MutexLock lock(&mu_);
  return EvictUnseenLocked(step);
}

int64_t SparseTable::EvictUnseenLocked(int64_t step) {
  const int64_t unseen = config_.evict_unseen_steps();
  if (unseen <= 0) return 0;
  swept_at_ = std::max(swept_at_, step);
  std::vector<uint32_t> old;
  for (const auto& [id, slot] : index_) {
    if (slots_[slot].last_pushed < step - unseen) old.push_back(slot);
  }
  for (uint32_t slot : old) EvictSlot(slot);
  return static_cast<int64_t>(old.size());
}

bool SparseTable::Contains(uint64_t id) const {
  absl::ReaderMutexLock lock(&mu_);
  return index_.contains(id);
}

SparseTableStats SparseTable::stats() const {
  absl::ReaderMutexLock lock(&mu_);
  SparseTableStats stats = stats_;
  stats.rows = static_cast<int64_t>(index_.size());
  stats.bytes = static_cast<int64_t>(
      slots_.size() * stride_ * sizeof(float) +
      slots_.capacity() * sizeof(Slot) +
      free_.capacity() * sizeof(uint32_t) +
      (index_.capacity() + pending_.capacity()) *
          (sizeof(uint64_t) + sizeof(uint32_t) + 1));
  return stats;
}

void SparseTable::Clear() {
  absl::MutexLock lock(&mu_);
  slots_.clear();
  free_.clear();
  index_.clear();
  pending_.clear();
  swept_at_ = 0;
}

SparseTableSnapshot SparseTable::Snapshot(uint32_t buckets) const {
  absl::ReaderMutexLock lock(&mu_);
  SparseTableSnapshot snapshot;
  *snapshot.mutable_config() = config_;
  snapshot.set_buckets(buckets);
  snapshot.set_swept_at(swept_at_);
  std::string* rows = snapshot.mutable_rows();
  rows->reserve(index_.size() * stride_ * sizeof(float));
  // In slot order: the same table always writes the same bytes.
  std::vector<std::pair<uint32_t, uint64_t>> order;
  order.reserve(index_.size());
  for (const auto& [id, slot] : index_) order.emplace_back(slot, id);
  std::sort(order.begin(), order.end());
  for (const auto& [slot, id] : order) {
    snapshot.add_ids(id);
    snapshot.add_last_pushed(slots_[slot].last_pushed);
    rows->append(reinterpret_cast<const char*>(slab_ + size_t{slot} * stride_),
                 stride_ * sizeof(float));
  }
  std::vector<std::pair<uint64_t, uint32_t>> pending(pending_.begin(),
                                                     pending_.end());
  std::sort(pending.begin(), pending.end());
  for (const auto& [id, count] : pending) {
    snapshot.add_pending_ids(id);
    snapshot.add_pending_counts(count);
  }
  return snapshot;
}

absl::StatusOr<int64_t> SparseTable::Restore(
    const SparseTableSnapshot& snapshot, uint32_t first_bucket,
    uint32_t last_bucket, uint32_t buckets) {
  const std::string& name = config_.name();
  const SparseTableConfig& theirs = snapshot.config();
  if (theirs.name() != name || theirs.dim() != dim_ ||
      theirs.optimizer() != config_.optimizer()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sparse table '", name, "' (dim ", dim_, ", optimizer ",
        SparseTableConfig::Optimizer_Name(config_.optimizer()),
        "): the snapshot is of table '", theirs.name(), "' (dim ",
        theirs.dim(), ", optimizer ",
        SparseTableConfig::Optimizer_Name(theirs.optimizer()), ")"));
  }
  if (snapshot.buckets() != buckets) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sparse table '", name, "': the snapshot places rows in ",
        snapshot.buckets(), " buckets, this run in ", buckets));
  }
  const size_t n = static_cast<size_t>(snapshot.ids_size());
  const size_t row_bytes = stride_ * sizeof(float);
  if (static_cast<size_t>(snapshot.last_pushed_size()) != n ||
      snapshot.rows().size() != n * row_bytes ||
      snapshot.pending_ids_size() != snapshot.pending_counts_size()) {
    return absl::DataLossError(absl::StrCat(
        "sparse table '", name, "': the snapshot's ", n, " ids, ",
        snapshot.last_pushed_size(), " ages and ", snapshot.rows().size(),
        " bytes of rows (", row_bytes, " a row) disagree"));
  }
  const float* rows = reinterpret_cast<const float*>(snapshot.rows().data());
  std::vector<size_t> mine;
  absl::flat_hash_set<uint64_t> seen;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t id = snapshot.ids(static_cast<int>(i));
    if (!seen.insert(id).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparse table '", name, "': id ", id, " is twice in the snapshot"));
    }
    const uint32_t bucket = common::BucketOfId(id, buckets);
    if (bucket < first_bucket || bucket >= last_bucket) continue;
    for (int c = 0; c < stride_; ++c) {
      float v;
      std::memcpy(&v, reinterpret_cast<const char*>(rows) + i * row_bytes +
                          c * sizeof(float),
                  sizeof(float));
      if (!std::isfinite(v) || (c >= dim_ && !(v > 0))) {
        return absl::DataLossError(absl::StrCat(
            "sparse table '", name, "': the snapshot's row of id ", id,
            " holds ", v, c >= dim_ ? " as an accumulator" : "",
            " (value ", c, ")"));
      }
    }
    mine.push_back(i);
  }
  absl::MutexLock lock(&mu_);
  for (size_t i : mine) {
    if (index_.contains(snapshot.ids(static_cast<int>(i)))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparse table '", name, "': id ", snapshot.ids(static_cast<int>(i)),
          " already has a row here"));
    }
  }
  if (static_cast<int64_t>(index_.size() + mine.size()) > config_.max_rows()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "sparse table '", name, "': restoring ", mine.size(), " rows beside ",
        index_.size(), " passes max_rows ", config_.max_rows(),
        "; raise max_rows"));
  }
  for (size_t i : mine) {
    const uint64_t id = snapshot.ids(static_cast<int>(i));
    uint32_t slot = NewRow(id, snapshot.last_pushed(static_cast<int>(i)));
    std::memcpy(slab_ + size_t{slot} * stride_,
                reinterpret_cast<const char*>(rows) + i * row_bytes, row_bytes);
  }
  for (int i = 0; i < snapshot.pending_ids_size(); ++i) {
    const uint64_t id = snapshot.pending_ids(i);
    const uint32_t bucket = common::BucketOfId(id, buckets);
    if (bucket < first_bucket || bucket >= last_bucket) continue;
    if (pending_.size() < static_cast<size_t>(config_.max_rows())) {
      pending_[id] = std::max(pending_[id], snapshot.pending_counts(i));
    }
  }
  // Several shards' snapshots (another shard count): the latest sweep.
  swept_at_ = std::max(swept_at_, snapshot.swept_at());
  return static_cast<int64_t>(mine.size());
}

}  // namespace monsoon::server
