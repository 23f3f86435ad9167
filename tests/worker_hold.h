// HoldAtStep: makes an in-process worker stop at the end of one of its
// steps until a test says it may go on, so that a test that injects a
// fault (a shard killed, a worker joining) cannot be overtaken by workers
// that finish first on a fast or busy machine. Test-only.
#ifndef MONSOON_TESTS_WORKER_HOLD_H_
#define MONSOON_TESTS_WORKER_HOLD_H_

#include <functional>
#include <memory>

#include "absl/time/time.h"
#include "worker/training_loop.h"

namespace monsoon::testutil {

// At the end of the worker's `step`th step (from 1), `wait` runs on its
// thread; the worker goes on when it returns (it should have a deadline
// and report a failure at it). The hold hangs on the step's slowdown wait,
// called once a step: the context's slowdown becomes 2, and the wait is
// given to the hook, which does not sleep it.
inline void HoldAtStep(worker::WorkerContext* context, int step,
                       std::function<void()> wait) {
  context->slowdown = 2;
  auto steps = std::make_shared<int>(0);
  context->sleep = [steps, step, wait = std::move(wait)](absl::Duration) {
    if (++*steps == step) wait();
  };
}

}  // namespace monsoon::testutil

#endif  // MONSOON_TESTS_WORKER_HOLD_H_
