// PsClient's calls to shard 0 alone: the all-reduce ring's rendezvous
// (mode ALLREDUCE: keys set and read, ParameterService.RendezvousSet/Get)
// and an elastic run's data queue (ParameterService.TakeData).
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "worker/ps_client.h"

namespace monsoon::worker {

// Each call within this; the ring's own timeout bounds the polling.
constexpr absl::Duration kRendezvousCallTimeout = absl::Seconds(10);

template <typename Request, typename Response, typename Method>
absl::Status PsClient::CallRendezvous(Method method, Request* request,
                                      Response* response,
                                      const std::string& what) {
  SparseCaller* caller = request->mutable_caller();
  caller->set_config_fingerprint(fingerprint_);
  caller->set_shard(0);
  caller->set_worker_rank(worker_rank_);
  caller->set_session(session_);
  grpc::ClientContext context;
  shards_[0].Prepare(&context);
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + kRendezvousCallTimeout));
  const grpc::Status status =
      (shards_[0].stub.get()->*method)(&context, *request, response);
  if (status.ok()) return absl::OkStatus();
  const absl::Status error = common::ToAbslStatus(status);
  return absl::Status(
      error.code(), absl::StrCat("rendezvous at shard 0 (", shards_[0].address,
                                 "), ", what, ": ", error.message()));
}

absl::Status PsClient::Set(const std::string& key, const std::string& value) {
  RendezvousSetRequest request;
  request.set_key(key);
  request.set_value(value);
  RendezvousSetResponse response;
  return CallRendezvous(&ParameterService::Stub::RendezvousSet, &request,
                        &response, absl::StrCat("setting '", key, "'"));
}

absl::StatusOr<std::optional<std::string>> PsClient::Get(
    const std::string& key) {
  RendezvousGetRequest request;
  request.set_key(key);
  RendezvousGetResponse response;
  if (absl::Status s =
          CallRendezvous(&ParameterService::Stub::RendezvousGet, &request,
                         &response, absl::StrCat("reading '", key, "'"));
      !s.ok()) {
    return s;
  }
  if (!response.found()) return std::optional<std::string>();
  return std::optional<std::string>(std::move(*response.mutable_value()));
}

absl::StatusOr<TakeDataResponse> PsClient::TakeData(
    int64_t examples_per_epoch, const std::optional<DataShardRef>& done,
    int64_t next_offset, absl::Duration timeout) {
  TakeDataRequest request;
  request.set_worker_rank(worker_rank_);
  request.set_shard(0);
  request.set_config_fingerprint(fingerprint_);
  request.set_session(session_);
  request.set_examples_per_epoch(examples_per_epoch);
  if (done.has_value()) *request.mutable_done() = *done;
  request.set_next_offset(next_offset);
  grpc::ClientContext context;
  shards_[0].Prepare(&context);
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  TakeDataResponse response;
  const grpc::Status status =
      shards_[0].stub->TakeData(&context, request, &response);
  if (status.ok()) return response;
  const absl::Status error = common::ToAbslStatus(status);
  return absl::Status(
      error.code(), absl::StrCat("taking the next data shard from shard 0 (",
                                 shards_[0].address, "): ", error.message()));
}

}  // namespace monsoon::worker
