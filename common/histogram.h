// Histogram: counts of observed values in fixed buckets, with their count
// and sum, as Prometheus histograms keep them; observed from any thread
// without a lock (one relaxed atomic add per bucket hit, a compare-and-swap
// for the sum), read as a Snapshot. Thread-safe.
#ifndef MONSOON_COMMON_HISTOGRAM_H_
#define MONSOON_COMMON_HISTOGRAM_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace monsoon::common {

// Upper bounds for durations in seconds: 50 µs to 10 s, about three per
// decade (a shard's apply takes tens of µs, a barrier wait up to seconds).
const std::vector<double>& DurationBuckets();

class Histogram {
 public:
  struct Snapshot {
    std::vector<double> upper_bounds;  // ascending; +Inf is implied
    // cumulative[i]: observations <= upper_bounds[i].
    std::vector<uint64_t> cumulative;
    uint64_t count = 0;  // all of them (+Inf's bucket)
    double sum = 0;
  };

  // `upper_bounds` ascending.
  explicit Histogram(std::vector<double> upper_bounds = DurationBuckets());

  void Observe(double value);

  // The count is the sum of the buckets read, so that +Inf's bucket and the
  // count always agree; an observation in flight may be in the buckets
  // before it is in the sum.
  Snapshot Read() const;

 private:
  const std::vector<double> upper_bounds_;
  // One per bound, plus one for values above the last.
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0};
};

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_HISTOGRAM_H_
