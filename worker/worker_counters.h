// WorkerCounters: what a worker has done, updated by its training loop at
// every step and read from other threads (its metrics, worker_metrics.h, and
// its report). Where a step's time goes is kept per phase (PhaseTimer).
// Thread-safe.
#ifndef MONSOON_WORKER_WORKER_COUNTERS_H_
#define MONSOON_WORKER_WORKER_COUNTERS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <limits>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/histogram.h"

namespace monsoon::worker {

// The parts of a step. A mode has some of them: sync and downpour with
// n_fetch = n_push = 1 compute, then push and pull in one round trip
// (kPushPull, which in sync includes the wait at the barrier); the others
// compute, pull (every n_fetch steps) and push (waiting for the previous
// push, if it is still in flight, and quantizing in onebit). allreduce
// computes, then sums the gradients over the ring (kAllreduce, which
// includes the wait for the slowest worker) and applies the step.
enum class Phase {
  kCompute = 0,
  kPull = 1,
  kPush = 2,
  kPushPull = 3,
  kAllreduce = 4
};
inline constexpr int kNumPhases = 5;
// "compute", "pull", "push", "push_pull", "allreduce".
const char* PhaseName(Phase phase);

struct WorkerCounters {
  std::atomic<int64_t> steps{0};
  std::atomic<int64_t> samples{0};
  std::atomic<double> last_loss{0};
  // When the last step ended, in seconds since the Unix epoch (0: none yet).
  std::atomic<double> last_step_time{0};
  // Seconds per phase, indexed by Phase.
  std::array<common::Histogram, kNumPhases> phases;
  // The L2 norm of the 1-bit residual (error feedback) after the last push
  // that measured it (GradientPusher, at most once a second); NaN without
  // 1-bit pushes.
  std::atomic<double> residual_norm{std::numeric_limits<double>::quiet_NaN()};
  // allreduce: payload bytes this worker sent to and received from its
  // ring neighbours (worker/ring.h).
  std::atomic<int64_t> ring_bytes_sent{0};
  std::atomic<int64_t> ring_bytes_received{0};
  // Shards' parts of push-pulls sent during backward (StagedPush).
  std::atomic<int64_t> shard_pushes_during_backward{0};
};

// Times a phase from construction to destruction, less the time between
// Pause and Resume, and records it once into `counters` (none when null).
// Not thread-safe: one per phase on the loop's thread.
class PhaseTimer {
 public:
  PhaseTimer(WorkerCounters* counters, Phase phase)
      : counters_(counters), phase_(phase), started_(absl::Now()) {}
  ~PhaseTimer() {
    if (counters_ == nullptr) return;
    Pause();
    counters_->phases[static_cast<int>(phase_)].Observe(
        absl::ToDoubleSeconds(elapsed_));
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

  void Pause() {
    if (started_ == absl::InfinitePast()) return;
    elapsed_ += absl::Now() - started_;
    started_ = absl::InfinitePast();
  }
  void Resume() {
    if (started_ == absl::InfinitePast()) started_ = absl::Now();
  }

 private:
  WorkerCounters* const counters_;
  const Phase phase_;
  absl::Time started_;  // InfinitePast while paused
  absl::Duration elapsed_;
};

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_WORKER_COUNTERS_H_
