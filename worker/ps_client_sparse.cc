// PsClient's sparse-table calls: ids routed to the shards that own their
// buckets, repeats sent once, the shards asked at once.
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "common/config.h"
#include "common/grpc_status.h"
#include "common/sparse_ids.h"
#include "worker/ps_client.h"
#include "worker/sparse_rows.h"

namespace monsoon::worker {
namespace {

// One unary call per shard that has ids, all in flight at once, each
// within `deadline`; returns each shard's status (OK for shards without
// ids).
template <typename Request, typename Response, typename Start>
std::vector<grpc::Status> CallShards(
    const std::vector<ShardConnection>& shards,
    const std::vector<Request>& requests, std::vector<Response>* responses,
    absl::Time deadline, const Start& start) {
  const int n = static_cast<int>(shards.size());
  std::vector<grpc::Status> statuses(n);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts(n);
  int calls = 0;
  for (int s = 0; s < n; ++s) calls += requests[s].ids_size() > 0 ? 1 : 0;
  if (calls == 0) return statuses;
  absl::BlockingCounter pending(calls);
  for (int s = 0; s < n; ++s) {
    if (requests[s].ids_size() == 0) continue;
    contexts[s] = std::make_unique<grpc::ClientContext>();
    shards[s].Prepare(contexts[s].get());
    contexts[s]->set_deadline(absl::ToChronoTime(deadline));
    start(s, contexts[s].get(), &requests[s], &(*responses)[s],
          [&statuses, &pending, s](grpc::Status status) {
            statuses[s] = std::move(status);
            pending.DecrementCount();
          });
  }
  pending.Wait();
  return statuses;
}

}  // namespace

template <typename Request, typename AddRow>
std::vector<Request> PsClient::SparseRequests(
    const std::string& table, const std::vector<uint64_t>& ids,
    const AddRow& add_row) const {
  const int n = num_shards();
  std::vector<Request> requests(n);
  for (int s = 0; s < n; ++s) {
    SparseCaller* caller = requests[s].mutable_caller();
    caller->set_config_fingerprint(fingerprint_);
    caller->set_shard(s);
    caller->set_worker_rank(worker_rank_);
    caller->set_session(session_);
    requests[s].set_table(table);
  }
  for (size_t u = 0; u < ids.size(); ++u) {
    const int s = common::ShardOfId(ids[u], config_.sparse_buckets(), n);
    requests[s].add_ids(ids[u]);
    add_row(s, u, &requests[s]);
  }
  return requests;
}

absl::StatusOr<int> PsClient::SparseDim(const std::string& table) const {
  for (const SparseTableConfig& t : config_.sparse_tables()) {
    if (t.name() == table) return t.dim();
  }
  return absl::NotFoundError(absl::StrCat(
      "no sparse table '", table, "' in this run's config (sparse_tables)"));
}

template <typename Request, typename Response, typename Start>
absl::Status PsClient::CallShardsRidingOut(std::vector<Request> requests,
                                           std::vector<Response>* responses,
                                           absl::Duration timeout,
                                           const RideOut& ride_out,
                                           const Start& start) {
  const int n = num_shards();
  for (int ride_outs = 0;; ++ride_outs) {
    // Shards may have moved (a take-over) since the last try.
    const std::vector<grpc::Status> statuses =
        CallShards(shards_, requests, responses, absl::Now() + timeout, start);
    absl::Status first;
    for (int s = 0; s < n; ++s) {
      if (statuses[s].ok()) {
        requests[s].clear_ids();  // answered: not asked again
      } else if (first.ok()) {
        first =
            Annotate(common::ToAbslStatus(statuses[s]), s, shards_[s].address);
      }
    }
    if (first.ok()) return first;
    if (ride_out == nullptr || ride_outs >= kMaxRideOutsPerCall) return first;
    if (absl::Status back = ride_out(first); !back.ok()) return back;
  }
}

absl::Status PsClient::SparsePull(const std::string& table,
                                  absl::Span<const uint64_t> ids,
                                  absl::Span<float> out, absl::Duration timeout,
                                  const RideOut& ride_out) {
  absl::StatusOr<int> dim = SparseDim(table);
  if (!dim.ok()) return dim.status();
  if (out.size() != ids.size() * static_cast<size_t>(*dim)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a pull of ", ids.size(), " rows of table '", table, "' (dim ", *dim,
        ") needs ", ids.size() * *dim, " values, not ", out.size()));
  }
  const UniqueIds unique = Deduplicate(ids);
  const int n = num_shards();
  std::vector<SparsePullRequest> requests = SparseRequests<SparsePullRequest>(
      table, unique.ids, [](int, size_t, SparsePullRequest*) {});
  std::vector<std::vector<uint32_t>> positions(n);  // indices into unique
  for (size_t u = 0; u < unique.ids.size(); ++u) {
    positions[common::ShardOfId(unique.ids[u], config_.sparse_buckets(), n)]
        .push_back(static_cast<uint32_t>(u));
  }
  std::vector<SparsePullResponse> responses(n);
  if (absl::Status called = CallShardsRidingOut(
          std::move(requests), &responses, timeout, ride_out,
          [this](int s, grpc::ClientContext* context,
                 const SparsePullRequest* request, SparsePullResponse* response,
                 std::function<void(grpc::Status)> done) {
            shards_[s].stub->async()->SparsePull(context, request, response,
                                                 std::move(done));
          });
      !called.ok()) {
    return called;
  }
  std::vector<float> rows(unique.ids.size() * *dim);
  const size_t row_bytes = *dim * sizeof(float);
  for (int s = 0; s < n; ++s) {
    const std::string& values = responses[s].values();
    if (values.size() != positions[s].size() * row_bytes) {
      return Annotate(
          absl::DataLossError(absl::StrCat(
              "answered ", values.size(), " bytes for ", positions[s].size(),
              " rows of ", row_bytes, " bytes")),
          s, shards_[s].address);
    }
    for (size_t i = 0; i < positions[s].size(); ++i) {
      std::memcpy(rows.data() + size_t{positions[s][i]} * *dim,
                  values.data() + i * row_bytes, row_bytes);
    }
    bytes_pulled_ += static_cast<int64_t>(responses[s].ByteSizeLong());
  }
  const std::vector<float> expanded = ExpandRows(unique, rows, *dim);
  std::copy(expanded.begin(), expanded.end(), out.begin());
  return absl::OkStatus();
}

absl::Status PsClient::SparsePush(const std::string& table,
                                  absl::Span<const uint64_t> ids,
                                  absl::Span<const float> grads,
                                  absl::Duration timeout,
                                  SparsePushResponse* result,
                                  const RideOut& ride_out, uint64_t seq) {
  absl::StatusOr<int> dim = SparseDim(table);
  if (!dim.ok()) return dim.status();
  if (grads.size() != ids.size() * static_cast<size_t>(*dim)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a push of ", ids.size(), " rows of table '", table, "' (dim ", *dim,
        ") needs ", ids.size() * *dim, " values, not ", grads.size()));
  }
  // Checked here too, so that a push that spans shards is refused whole:
  // each shard checks only its part.
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!std::isfinite(grads[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparse table '", table, "': the gradient of id ", ids[i / *dim],
          " holds ", grads[i], "; nothing was sent"));
    }
  }
  if (seq == 0) seq = NextRowPushSeq();
  const UniqueIds unique = Deduplicate(ids);
  const std::vector<float> sums = SumRepeats(unique, grads, *dim);
  const int n = num_shards();
  const size_t row_bytes = *dim * sizeof(float);
  std::vector<SparsePushRequest> requests = SparseRequests<SparsePushRequest>(
      table, unique.ids, [&](int, size_t u, SparsePushRequest* request) {
        request->mutable_grads()->append(
            reinterpret_cast<const char*>(sums.data() + u * *dim), row_bytes);
      });
  for (SparsePushRequest& request : requests) {
    request.set_seq(seq);
    bytes_pushed_ += static_cast<int64_t>(request.ByteSizeLong());
  }
  std::vector<SparsePushResponse> responses(n);
  const absl::Status called = CallShardsRidingOut(
      std::move(requests), &responses, timeout, ride_out,
      [this](int s, grpc::ClientContext* context,
             const SparsePushRequest* request, SparsePushResponse* response,
             std::function<void(grpc::Status)> done) {
        shards_[s].stub->async()->SparsePush(context, request, response,
                                             std::move(done));
      });
  SparsePushResponse total;
  for (int s = 0; s < n; ++s) {
    total.set_updated(total.updated() + responses[s].updated());
    total.set_created(total.created() + responses[s].created());
    total.set_not_admitted(total.not_admitted() + responses[s].not_admitted());
    total.set_evicted(total.evicted() + responses[s].evicted());
    if (responses[s].repeat()) total.set_repeat(true);
  }
  if (result != nullptr) *result = total;
  return called;
}

}  // namespace monsoon::worker
