#include "server/rendezvous.h"

#include "absl/strings/str_cat.h"

namespace monsoon::server {

absl::Status Rendezvous::Set(const std::string& key, const std::string& value,
                             int rank, uint64_t session) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous key of ", key.size(), " bytes: must be 1 to ",
        kMaxKeyBytes));
  }
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous value of ", value.size(),
                     " bytes for key '", key, "': at most ", kMaxValueBytes));
  }
  absl::MutexLock lock(&mu_);
  auto it = values_.find(key);
  if (it != values_.end()) {
    it->second = Value{value, rank, session};
    return absl::OkStatus();
  }
  if (values_.size() >= kMaxKeys) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the rendezvous holds ", kMaxKeys,
        " keys already; a run needs one per worker: is a client looping?"));
  }
  values_.emplace(key, Value{value, rank, session});
  return absl::OkStatus();
}

std::optional<Rendezvous::Value> Rendezvous::Get(
    const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

}  // namespace monsoon::server
