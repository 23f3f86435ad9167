// What a worker does with a batch's sparse ids before they reach the
// shards: repeats pulled once and pushed once, their gradients summed
// (ps-lite, Persia and TorchRec do the same), so that a batch in which a
// popular id appears a hundred times costs one row each way.
// Pure functions; thread-safe.
#ifndef MONSOON_WORKER_SPARSE_ROWS_H_
#define MONSOON_WORKER_SPARSE_ROWS_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace monsoon::worker {

struct UniqueIds {
  std::vector<uint64_t> ids;    // each once, in order of first appearance
  std::vector<uint32_t> where;  // per input id: its index in `ids`
};

// The distinct ids of `ids`.
UniqueIds Deduplicate(absl::Span<const uint64_t> ids);

// Row gradients (`dim` values per input id) summed per distinct id, in the
// order of `unique.ids`.
std::vector<float> SumRepeats(const UniqueIds& unique,
                              absl::Span<const float> grads, int dim);

// Rows pulled for `unique.ids` (`dim` values each) spread back to every
// input id, in the input's order.
std::vector<float> ExpandRows(const UniqueIds& unique,
                              absl::Span<const float> rows, int dim);

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_SPARSE_ROWS_H_
