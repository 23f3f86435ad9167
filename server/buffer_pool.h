// FloatBufferPool: buffers of one size (a shard's value count), handed out
// and taken back, so that pushes and pulls reuse memory instead of
// allocating (and faulting in) a fresh buffer each. A buffer goes back to
// the pool when its handle is destroyed, also after the pool itself is gone
// (the handle keeps the pool's free list alive). Thread-safe.
#ifndef MONSOON_SERVER_BUFFER_POOL_H_
#define MONSOON_SERVER_BUFFER_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace monsoon::server {

class FloatBufferPool {
 private:
  struct Shared;

 public:
  // Returns a buffer to its pool.
  class Returner {
   public:
    Returner() = default;
    explicit Returner(std::shared_ptr<Shared> pool) : pool_(std::move(pool)) {}
    void operator()(float* buffer) const;

   private:
    std::shared_ptr<Shared> pool_;
  };
  // size() floats, uninitialized when new.
  using Buffer = std::unique_ptr<float[], Returner>;

  explicit FloatBufferPool(size_t size);

  size_t size() const { return size_; }
  // A free buffer, or a new one when none is free.
  Buffer Take();
  // Buffers allocated so far: it stops growing once a run is warm.
  int64_t allocations() const;

 private:
  const size_t size_;
  const std::shared_ptr<Shared> shared_;
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_BUFFER_POOL_H_
