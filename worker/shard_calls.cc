#include "worker/shard_calls.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/auth.h"
#include "common/log.h"
#include "common/wire.h"

namespace monsoon::worker {

WaitNote NoteFor(absl::Duration every, int rank, std::string what) {
  return WaitNote{
      every,
      rank >= 0 ? absl::StrCat("worker ", rank) : std::string("evaluator"),
      std::move(what)};
}

void ShardConnection::Prepare(grpc::ClientContext* context) const {
  if (!authorization.empty()) {
    context->AddMetadata(common::kAuthMetadataKey, authorization);
  }
  if (!range.empty()) context->AddMetadata(common::kRangeMetadataKey, range);
}

absl::Status Annotate(const absl::Status& status, int shard,
                      const std::string& address) {
  if (status.ok()) return status;
  return absl::Status(
      status.code(),
      absl::StrCat("shard ", shard, " at ", address, ": ", status.message()));
}

absl::Status ShardCalls::Wait() {
  if (!waited_) {
    std::unique_lock<std::mutex> lock(mu_);
    bool cancelled = false;
    const absl::Time start = absl::Now();
    absl::Time last_log = start;
    while (pending_ > 0) {
      // Checks the stop notification every 100 ms while calls run.
      done_.wait_for(lock, std::chrono::milliseconds(100));
      if (!cancelled && stop_ != nullptr && stop_->HasBeenNotified()) {
        cancelled = true;
        for (grpc::ClientContext* context : contexts_) context->TryCancel();
      }
      if (!cancelled && shards_ != nullptr && pending_ > 0) {
        for (size_t s = 0; s < answered_.size(); ++s) {
          if (!answered_[s]) continue;
          const grpc_connectivity_state state =
              (*shards_)[s].channel->GetState(/*try_to_connect=*/false);
          if (state == GRPC_CHANNEL_READY) continue;
          cancelled = true;
          lost_ = absl::UnavailableError(absl::StrCat(
              "shard ", s, " at ", (*shards_)[s].address,
              " lost its connection after it answered, while other shards "
              "had not (it may have restarted from a checkpoint without "
              "this step)"));
          for (grpc::ClientContext* context : contexts_) context->TryCancel();
          break;
        }
      }
      const absl::Time now = absl::Now();
      if (pending_ > 0 && note_.every > absl::ZeroDuration() &&
          now - last_log >= note_.every) {
        std::vector<int> pending;
        for (size_t s = 0; s < answered_.size(); ++s) {
          if (!answered_[s]) pending.push_back(static_cast<int>(s));
        }
        common::LogWarning("%s: waiting %.0f s for shard(s) %s to answer %s",
                           note_.who, absl::ToDoubleSeconds(now - start),
                           absl::StrJoin(pending, ","), note_.what);
        last_log = now;
      }
    }
    lock.unlock();
    waited_ = true;
    calls_.clear();  // every reactor has reached OnDone
  }
  if (!lost_.ok()) return lost_;
  for (const absl::Status& status : statuses_) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace monsoon::worker
