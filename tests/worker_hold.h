// HoldAtStep and AtEachStep: make an in-process worker stop at the end of
// one of its steps (or of any) until a test says it may go on, so that a
// test that injects a fault (a shard killed, a worker joining) cannot be
// overtaken by workers that finish first on a fast or busy machine.
// Test-only.
#ifndef MONSOON_TESTS_WORKER_HOLD_H_
#define MONSOON_TESTS_WORKER_HOLD_H_

#include <functional>
#include <memory>

#include "absl/time/time.h"
#include "worker/training_loop.h"

namespace monsoon::testutil {

// At the end of each of the worker's steps, `at_step` runs on its thread
// with the step's number (from 1); the worker goes on when it returns (a
// wait in it should have a deadline and report a failure at it). It hangs
// on the step's slowdown wait, called once a step: the context's slowdown
// becomes 2, and the wait is given to the hook, which does not sleep it.
inline void AtEachStep(worker::WorkerContext* context,
                       std::function<void(int step)> at_step) {
  context->slowdown = 2;
  auto steps = std::make_shared<int>(0);
  context->sleep = [steps, at_step = std::move(at_step)](absl::Duration) {
    at_step(++*steps);
  };
}

// At the end of the worker's `step`th step (from 1), `wait` runs on its
// thread, as AtEachStep's hook.
inline void HoldAtStep(worker::WorkerContext* context, int step,
                       std::function<void()> wait) {
  AtEachStep(context, [step, wait = std::move(wait)](int at) {
    if (at == step) wait();
  });
}

}  // namespace monsoon::testutil

#endif  // MONSOON_TESTS_WORKER_HOLD_H_
