// The staleness-aware learning rate (Zhang et al. 2016; config.proto
// staleness_lr): the rate of a push of staleness s is divided by max(1, s).
// Used by the downpour (and onebit) and hogwild rules. Immutable;
// thread-safe.
#ifndef MONSOON_SERVER_POLICIES_STALENESS_RATE_H_
#define MONSOON_SERVER_POLICIES_STALENESS_RATE_H_

#include <algorithm>
#include <cstdint>

namespace monsoon::server {

class StalenessAwareRate {
 public:
  explicit StalenessAwareRate(bool on) : on_(on) {}

  bool on() const { return on_; }

  // The factor on the optimizer's rate for a push of `staleness`: 1 / max(1,
  // staleness), or 1 when off.
  float Scale(int64_t staleness) const {
    return on_ ? 1.0f / Divisor(staleness) : 1.0f;
  }

  // `rate` for a push of `staleness`: rate / max(1, staleness), or `rate`
  // when off (divided, not scaled, so that it rounds as one division).
  float Rate(float rate, int64_t staleness) const {
    return on_ ? rate / Divisor(staleness) : rate;
  }

 private:
  static float Divisor(int64_t staleness) {
    return static_cast<float>(std::max<int64_t>(1, staleness));
  }

  bool on_;
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_POLICIES_STALENESS_RATE_H_
