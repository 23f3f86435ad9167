#include "server/shard_sparse_tables.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/machine_memory.h"
#include "common/sparse_ids.h"
#include "common/sparse_table_config.h"

namespace monsoon::server {

absl::StatusOr<std::unique_ptr<ShardSparseTables>> ShardSparseTables::Create(
    const TrainingConfig& resolved, int shard, int num_shards,
    uint64_t memory_bytes, int copies) {
  const uint32_t buckets = resolved.sparse_buckets();
  if (resolved.sparse_tables_size() > 0 &&
      buckets < static_cast<uint32_t>(num_shards)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sparse_buckets ", buckets, " is fewer than the ", num_shards,
        " shards: every shard needs a bucket of rows"));
  }
  if (memory_bytes == 0) memory_bytes = common::MemoryLimitBytes();
  memory_bytes /= static_cast<uint64_t>(std::max(copies, 1));
  uint64_t total = 0;
  std::vector<std::string> shares;
  for (const SparseTableConfig& config : resolved.sparse_tables()) {
    if (absl::Status valid = common::ValidateSparseTable(config); !valid.ok()) {
      return valid;
    }
    const uint64_t bytes = SparseTable::BytesAtMaxRows(config);
    total += bytes;
    shares.push_back(absl::StrCat("'", config.name(), "' ", bytes >> 20,
                                  " MiB for max_rows ", config.max_rows(),
                                  " of dim ", config.dim()));
  }
  if (memory_bytes > 0 && total > memory_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the sparse tables would take up to ", total >> 20,
        " MiB on this shard once full (", absl::StrJoin(shares, ", "),
        "), more than the ", memory_bytes >> 20,
        " MiB of memory this process may use",
        copies > 1 ? absl::StrCat(" for each of the ", copies,
                                  " ranges it holds with --replicas")
                   : std::string(),
        "; the kernel would kill the "
        "shard as they fill. Lower max_rows (the most rows one shard holds "
        "of a table; at_max_rows: EVICT_LEAST_RECENT trains on within it; more "
        "shards hold fewer rows each), or give the shard more memory"));
  }
  std::vector<std::unique_ptr<SparseTable>> tables;
  for (const SparseTableConfig& config : resolved.sparse_tables()) {
    absl::StatusOr<std::unique_ptr<SparseTable>> table =
        SparseTable::Create(config, resolved.seed());
    if (!table.ok()) return table.status();
    tables.push_back(*std::move(table));
  }
  return std::unique_ptr<ShardSparseTables>(new ShardSparseTables(
      shard, num_shards, buckets, resolved.learning_rate(), std::move(tables)));
}

ShardSparseTables::ShardSparseTables(
    int shard, int num_shards, uint32_t buckets, float run_learning_rate,
    std::vector<std::unique_ptr<SparseTable>> tables)
    : shard_(shard),
      num_shards_(num_shards),
      buckets_(buckets),
      run_learning_rate_(run_learning_rate),
      tables_(std::move(tables)) {}

absl::StatusOr<SparseTable*> ShardSparseTables::Find(
    const std::string& name) const {
  std::vector<std::string> names;
  for (const auto& table : tables_) {
    if (table->config().name() == name) return table.get();
    names.push_back(absl::StrCat("'", table->config().name(), "'"));
  }
  return absl::NotFoundError(absl::StrCat(
      "no sparse table '", name, "' in this run",
      names.empty() ? std::string(" (its config has no sparse_tables)")
                    : absl::StrCat("; its tables: ", absl::StrJoin(names, ", "))));
}

absl::Status ShardSparseTables::CheckIdsAreMine(
    absl::Span<const uint64_t> ids) const {
  if (ids.size() > static_cast<size_t>(kMaxIdsPerCall)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a call of ", ids.size(), " ids; at most ",
                     kMaxIdsPerCall, " a call"));
  }
  for (uint64_t id : ids) {
    const int owner = common::ShardOfId(id, buckets_, num_shards_);
    if (owner != shard_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "id ", id, " is shard ", owner, "'s (bucket ",
          common::BucketOfId(id, buckets_), " of ", buckets_,
          "), not shard ", shard_, "'s: send each id to the shard of its "
          "bucket"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SparsePullResponse> ShardSparseTables::Pull(
    const SparsePullRequest& request) const {
  absl::StatusOr<SparseTable*> table = Find(request.table());
  if (!table.ok()) return table.status();
  const absl::Span<const uint64_t> ids(request.ids().data(),
                                       request.ids().size());
  if (absl::Status mine = CheckIdsAreMine(ids); !mine.ok()) return mine;
  std::vector<float> values(ids.size() * (*table)->dim());
  if (absl::Status s = (*table)->Pull(ids, absl::MakeSpan(values)); !s.ok()) {
    return s;
  }
  SparsePullResponse response;
  response.set_values(reinterpret_cast<const char*>(values.data()),
                      values.size() * sizeof(float));
  return response;
}

absl::StatusOr<SparsePushResponse> ShardSparseTables::Push(
    const SparsePushRequest& request, int64_t step, const Forward& forward) {
  absl::MutexLock lock(&push_mu_);
  if (AppliedLocked(request)) {
    SparsePushResponse repeat;
    repeat.set_repeat(true);
    return repeat;
  }
  absl::StatusOr<SparsePushResponse> response = ApplyLocked(request, step);
  if (!response.ok()) return response;
  ++row_pushes_;
  if (forward != nullptr) {
    if (absl::Status forwarded = forward(row_pushes_, step); !forwarded.ok()) {
      return forwarded;
    }
  }
  MarkLocked(request);
  return response;
}

bool ShardSparseTables::AppliedLocked(const SparsePushRequest& request) const {
  if (request.seq() == 0) return false;
  auto mark = marks_.find(request.caller().worker_rank());
  return mark != marks_.end() &&
         mark->second.session == request.caller().session() &&
         request.seq() <= mark->second.seq;
}

void ShardSparseTables::MarkLocked(const SparsePushRequest& request) {
  if (request.seq() == 0) return;
  marks_[request.caller().worker_rank()] = {request.caller().session(),
                                            request.seq()};
}

absl::Status ShardSparseTables::ApplyForwarded(
    const SparsePushRequest& request) {
  absl::MutexLock lock(&push_mu_);
  if (holding_) {
    held_.push_back(request);
    return absl::OkStatus();
  }
  return ApplyForwardedLocked(request);
}

absl::Status ShardSparseTables::ApplyForwardedLocked(
    const SparsePushRequest& request) {
  const int64_t seq = request.replica_seq();
  if (seq <= row_pushes_) return absl::OkStatus();  // sent again
  if (seq != row_pushes_ + 1) {
    return absl::DataLossError(absl::StrCat(
        "shard ", shard_, "'s backup has applied ", row_pushes_,
        " row pushes and was forwarded row push ", seq, ": the copies differ"));
  }
  absl::StatusOr<SparsePushResponse> applied =
      ApplyLocked(request, request.step());
  if (!applied.ok()) {
    return absl::DataLossError(
        absl::StrCat("shard ", shard_, "'s backup could not apply row push ",
                     seq, " that its primary applied (",
                     applied.status().ToString(), "): the copies differ"));
  }
  row_pushes_ = seq;
  MarkLocked(request);
  return absl::OkStatus();
}

void ShardSparseTables::BeginRepair() {
  absl::MutexLock lock(&push_mu_);
  holding_ = true;
  held_.clear();
}

void ShardSparseTables::EndRepair() {
  absl::MutexLock lock(&push_mu_);
  holding_ = false;
  held_.clear();
}

absl::Status ShardSparseTables::RestoreCopy(const ShardCheckpoint& copy) {
  absl::MutexLock lock(&push_mu_);
  holding_ = false;
  std::vector<SparsePushRequest> held = std::move(held_);
  held_.clear();
  for (const auto& table : tables_) table->Clear();
  const common::BucketRange mine =
      common::BucketsOfShard(shard_, buckets_, num_shards_);
  for (const std::string& bytes : copy.sparse_tables()) {
    SparseTableSnapshot snapshot;
    if (!snapshot.ParseFromString(bytes)) {
      return absl::DataLossError("a sparse table's rows do not parse");
    }
    absl::StatusOr<SparseTable*> table = Find(snapshot.config().name());
    if (!table.ok()) return table.status();
    absl::StatusOr<int64_t> restored =
        (*table)->Restore(snapshot, mine.first, mine.last, buckets_);
    if (!restored.ok()) return restored.status();
  }
  RestoreMarksLocked(copy);
  std::sort(held.begin(), held.end(),
            [](const SparsePushRequest& a, const SparsePushRequest& b) {
              return a.replica_seq() < b.replica_seq();
            });
  for (const SparsePushRequest& request : held) {
    if (absl::Status applied = ApplyForwardedLocked(request); !applied.ok()) {
      return applied;
    }
  }
  return absl::OkStatus();
}

void ShardSparseTables::SaveTo(ShardCheckpoint* checkpoint) const {
  absl::MutexLock lock(&push_mu_);
  for (const auto& table : tables_) {
    table->Snapshot(buckets_).SerializeToString(
        checkpoint->add_sparse_tables());
  }
  checkpoint->set_row_pushes(row_pushes_);
  std::vector<std::pair<int, Mark>> marks(marks_.begin(), marks_.end());
  std::sort(marks.begin(), marks.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [rank, mark] : marks) {
    RowPushMark* saved = checkpoint->add_row_push_marks();
    saved->set_rank(rank);
    saved->set_session(mark.session);
    saved->set_seq(mark.seq);
  }
}

void ShardSparseTables::RestoreMarks(const ShardCheckpoint& checkpoint) {
  absl::MutexLock lock(&push_mu_);
  RestoreMarksLocked(checkpoint);
}

void ShardSparseTables::RestoreMarksLocked(const ShardCheckpoint& checkpoint) {
  row_pushes_ = checkpoint.row_pushes();
  marks_.clear();
  for (const RowPushMark& mark : checkpoint.row_push_marks()) {
    marks_[mark.rank()] = {mark.session(), mark.seq()};
  }
}

int64_t ShardSparseTables::row_pushes() const {
  absl::MutexLock lock(&push_mu_);
  return row_pushes_;
}

absl::StatusOr<SparsePushResponse> ShardSparseTables::ApplyLocked(
    const SparsePushRequest& request, int64_t step) {
  absl::StatusOr<SparseTable*> table = Find(request.table());
  if (!table.ok()) return table.status();
  const absl::Span<const uint64_t> ids(request.ids().data(),
                                       request.ids().size());
  if (absl::Status mine = CheckIdsAreMine(ids); !mine.ok()) return mine;
  const size_t want = ids.size() * (*table)->dim() * sizeof(float);
  if (request.grads().size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sparse table '", request.table(), "': ", ids.size(), " ids of ",
        (*table)->dim(), " values need ", want, " bytes of gradients, not ",
        request.grads().size()));
  }
  // The bytes are copied out: a protobuf string need not be float-aligned.
  std::vector<float> grads(ids.size() * (*table)->dim());
  std::memcpy(grads.data(), request.grads().data(), want);
  absl::StatusOr<SparsePushResult> result =
      (*table)->Push(ids, grads, run_learning_rate_, step);
  if (!result.ok()) return result.status();
  SparsePushResponse response;
  response.set_updated(result->updated);
  response.set_created(result->created);
  response.set_not_admitted(result->not_admitted);
  response.set_evicted(result->evicted);
  return response;
}

}  // namespace monsoon::server
