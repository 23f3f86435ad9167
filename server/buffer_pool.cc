#include "server/buffer_pool.h"

#include <utility>

namespace monsoon::server {

struct FloatBufferPool::Shared {
  absl::Mutex mu;
  std::vector<std::unique_ptr<float[]>> free ABSL_GUARDED_BY(mu);
  int64_t allocations ABSL_GUARDED_BY(mu) = 0;
};

void FloatBufferPool::Returner::operator()(float* buffer) const {
  if (buffer == nullptr) return;
  if (pool_ == nullptr) {
    delete[] buffer;
    return;
  }
  absl::MutexLock lock(&pool_->mu);
  pool_->free.emplace_back(buffer);
}

FloatBufferPool::FloatBufferPool(size_t size)
    : size_(size), shared_(std::make_shared<Shared>()) {}

FloatBufferPool::Buffer FloatBufferPool::Take() {
  {
    absl::MutexLock lock(&shared_->mu);
    if (!shared_->free.empty()) {
      float* buffer = shared_->free.back().release();
      shared_->free.pop_back();
      return Buffer(buffer, Returner(shared_));
    }
    ++shared_->allocations;
  }
  return Buffer(new float[size_], Returner(shared_));
}

int64_t FloatBufferPool::allocations() const {
  absl::MutexLock lock(&shared_->mu);
  return shared_->allocations;
}

}  // namespace monsoon::server
