#include "server/shard_ticker.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/log.h"

namespace monsoon::server {

ShardTicker::ShardTicker(ShardState* state, UpdateRule* rule,
                         absl::Duration log_every, int max_staleness,
                         bool log_lapses, std::function<bool()> serving)
    : state_(state),
      rule_(rule),
      log_every_(log_every),
      max_staleness_(max_staleness),
      log_lapses_(log_lapses),
      serving_(std::move(serving)),
      last_log_(absl::Now()),
      thread_([this] {
        constexpr absl::Duration kEvery = absl::Milliseconds(200);
        absl::Time last = absl::Now();
        while (!stop_.WaitForNotificationWithTimeout(kEvery)) {
          const absl::Time now = absl::Now();
          // A tick over a second late: this process did not run meanwhile
          // (stopped, a paused machine), and no worker could reach it.
          if (const absl::Duration late = now - last - kEvery;
              late > absl::Seconds(1)) {
            state_->ForgiveStall(late);
            common::LogWarning(
                "shard %d: this process did not run for %.1f s (stopped, or "
                "its machine paused); that time does not count against the "
                "workers' leases",
                state_->shard(), absl::ToDoubleSeconds(late));
          }
          last = now;
          Tick(now);
        }
      }) {}

ShardTicker::~ShardTicker() { Stop(); }

void ShardTicker::Stop() {
  absl::MutexLock lock(&join_mu_);
  if (!thread_.joinable()) return;
  stop_.Notify();
  thread_.join();
}

void ShardTicker::Tick(absl::Time now) {
  if (serving_ != nullptr && !serving_()) return;
  // A rank whose call waits at the barrier (or for the staleness bound) is
  // in touch, however long the others take: its lease does not run out
  // meanwhile (it would count as gone, and in an elastic run lose its data
  // shard). A rank that only pushed, and whose process then died, is not.
  state_->TouchWaitingRanks();
  rule_->Tick(now, log_every_);
  state_->ExpireWaiters(now);
  // A slow worker whose lease ran out, or that left, no longer holds the
  // others back (bounded staleness).
  state_->RunWaiters(state_->ReleaseWaiters(now));
  for (int rank : state_->ReleaseSilentData(now)) {
    common::Log(
        "shard %d: rank %d's unfinished data shards went back to the queue "
        "(it made no call for one and a half leases)",
        state_->shard(), rank);
  }
  for (const auto& [rank, silent] : state_->NewlyLapsed(now)) {
    rule_->DropWorker(rank);
    if (!log_lapses_) continue;
    common::LogWarning(
        "shard %d: rank %d made no call for %s: its lease of %s ran out "
        "(a sync step closes without it; it is let back in when it "
        "calls again)",
        state_->shard(), rank,
        absl::FormatDuration(absl::Trunc(silent, absl::Milliseconds(100))),
        absl::FormatDuration(state_->lease()));
  }
  if (log_every_ > absl::ZeroDuration() && now - last_log_ >= log_every_) {
    if (const std::vector<std::string> waits = state_->DescribeClockWaits(now);
        !waits.empty()) {
      common::Log("shard %d: bounded staleness (max_staleness %d): %s",
                  state_->shard(), max_staleness_, absl::StrJoin(waits, "; "));
    }
    LogProgress(now - last_log_);
    last_log_ = now;
  }
}

void ShardTicker::LogProgress(absl::Duration since) {
  StatsResponse now = state_->Stats();
  const StatsResponse& last = last_stats_;
  if (now.pushes() == last.pushes() &&
      now.rejected_pushes() == last.rejected_pushes()) {
    last_stats_ = std::move(now);
    return;  // nothing happened: no line
  }
  const double seconds = absl::ToDoubleSeconds(since);
  const int64_t pushes = now.pushes() - last.pushes();
  const int64_t staleness = now.staleness_sum() - last.staleness_sum();
  common::Log(
      "shard %d: version %d, %d pushes (%.0f/s, mean staleness %.2f), %.1f MB "
      "in, %.1f MB out, %d rejected, %d refused updates, %d calls waiting",
      state_->shard(), now.version(), pushes, pushes / seconds,
      pushes > 0 ? static_cast<double>(staleness) / pushes : 0.0,
      (now.bytes_pushed() - last.bytes_pushed()) / 1e6,
      (now.bytes_pulled() - last.bytes_pulled()) / 1e6,
      now.rejected_pushes() - last.rejected_pushes(),
      now.refused_updates() - last.refused_updates(), state_->NumWaiting());
  last_stats_ = std::move(now);
}

}  // namespace monsoon::server
