#include "worker/worker_counters.h"

namespace monsoon::worker {

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kCompute:
      return "compute";
    case Phase::kPull:
      return "pull";
    case Phase::kPush:
      return "push";
    case Phase::kPushPull:
      return "push_pull";
    case Phase::kAllreduce:
      return "allreduce";
  }
  return "unknown";
}

}  // namespace monsoon::worker
