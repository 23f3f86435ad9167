#include "server/policies/delay_compensation.h"

#include <algorithm>

namespace monsoon::server {

void DelayCompensation::Pulled(int rank, const WeightsPtr& weights) {
  absl::MutexLock lock(&mu_);
  pulled_[rank] = weights;
}

void DelayCompensation::Drop(int rank) {
  absl::MutexLock lock(&mu_);
  pulled_.erase(rank);
}

int DelayCompensation::workers() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(pulled_.size());
}

void DelayCompensation::Compensate(int rank, absl::Span<const float> g,
                                   const float* in, std::vector<float>* out) {
  WeightsPtr pulled;
  {
    absl::MutexLock lock(&mu_);
    auto it = pulled_.find(rank);
    if (it != pulled_.end()) pulled = it->second;
  }
  const size_t n = g.size();
  out->resize(n);
  float* c = out->data();
  if (pulled == nullptr) {
    std::copy(g.begin(), g.end(), c);
    return;
  }
  const float* old = pulled->values().data();
  const float lambda = lambda_;
  for (size_t i = 0; i < n; ++i) {
    c[i] = g[i] + lambda * g[i] * g[i] * (in[i] - old[i]);
  }
}

}  // namespace monsoon::server
