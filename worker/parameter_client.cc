#include "worker/parameter_client.h"

namespace monsoon::worker {

std::unique_ptr<PendingCall> ParameterClient::PullAsync(
    int64_t min_version, absl::Duration timeout, absl::Span<float> params,
    std::vector<int64_t>* versions) {
  return PullAsync(std::vector<int64_t>(num_shards(), min_version), timeout,
                   params, versions);
}

absl::Status ParameterClient::Pull(int64_t min_version, absl::Duration timeout,
                                   absl::Span<float> params,
                                   std::vector<int64_t>* versions,
                                   bool params_hold_versions) {
  return PullAsync(std::vector<int64_t>(num_shards(), min_version), timeout,
                   params, versions, params_hold_versions)
      ->Wait();
}

}  // namespace monsoon::worker
