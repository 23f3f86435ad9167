#include "server/shard_sparse_tables.h"

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
    uint64_t memory_bytes) {
  const uint32_t buckets = resolved.sparse_buckets();
  if (resolved.sparse_tables_size() > 0 &&
      buckets < static_cast<uint32_t>(num_shards)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sparse_buckets ", buckets, " is fewer than the ", num_shards,
        " shards: every shard needs a bucket of rows"));
  }
  if (memory_bytes == 0) memory_bytes = common::MemoryLimitBytes();
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
        " MiB of memory this process may use; the kernel would kill the "
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
  return std::unique_ptr<ShardSparseTables>(
      new ShardSparseTables(shard, num_shards, buckets, std::move(tables)));
}

ShardSparseTables::ShardSparseTables(
    int shard, int num_shards, uint32_t buckets,
    std::vector<std::unique_ptr<SparseTable>> tables)
    : shard_(shard),
      num_shards_(num_shards),
      buckets_(buckets),
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
    const SparsePushRequest& request, float learning_rate, int64_t step) {
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
      (*table)->Push(ids, grads, learning_rate, step);
  if (!result.ok()) return result.status();
  SparsePushResponse response;
  response.set_updated(result->updated);
  response.set_created(result->created);
  response.set_not_admitted(result->not_admitted);
  response.set_evicted(result->evicted);
  return response;
}

}  // namespace monsoon::server
