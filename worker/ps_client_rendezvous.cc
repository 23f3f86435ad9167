// PsClient as the all-reduce ring's rendezvous (mode ALLREDUCE): keys set
// and read on shard 0 (ParameterService.RendezvousSet/Get).
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "worker/ps_client.h"

namespace monsoon::worker {

// Each call within this; the ring's own timeout bounds the polling.
constexpr absl::Duration kRendezvousCallTimeout = absl::Seconds(10);

absl::Status PsClient::RendezvousError(const grpc::Status& status,
                                       const std::string& what) const {
  const absl::Status error = common::ToAbslStatus(status);
  return absl::Status(
      error.code(), absl::StrCat("rendezvous at shard 0 (", shards_[0].address,
                                 "), ", what, ": ", error.message()));
}

template <typename Request>
void PsClient::FillRendezvousCaller(Request* request) const {
  SparseCaller* caller = request->mutable_caller();
  caller->set_config_fingerprint(fingerprint_);
  caller->set_shard(0);
  caller->set_worker_rank(worker_rank_);
  caller->set_session(session_);
}

absl::Status PsClient::Set(const std::string& key, const std::string& value) {
  RendezvousSetRequest request;
  FillRendezvousCaller(&request);
  request.set_key(key);
  request.set_value(value);
  RendezvousSetResponse response;
  grpc::ClientContext context;
  shards_[0].Prepare(&context);
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + kRendezvousCallTimeout));
  const grpc::Status status =
      shards_[0].stub->RendezvousSet(&context, request, &response);
  if (status.ok()) return absl::OkStatus();
  return RendezvousError(status, absl::StrCat("setting '", key, "'"));
}

absl::StatusOr<std::optional<std::string>> PsClient::Get(
    const std::string& key) {
  RendezvousGetRequest request;
  FillRendezvousCaller(&request);
  request.set_key(key);
  RendezvousGetResponse response;
  grpc::ClientContext context;
  shards_[0].Prepare(&context);
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + kRendezvousCallTimeout));
  const grpc::Status status =
      shards_[0].stub->RendezvousGet(&context, request, &response);
  if (!status.ok()) {
    return RendezvousError(status, absl::StrCat("reading '", key, "'"));
  }
  if (!response.found()) return std::optional<std::string>();
  return std::optional<std::string>(std::move(*response.mutable_value()));
}

}  // namespace monsoon::worker
