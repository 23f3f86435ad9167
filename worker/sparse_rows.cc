#include "worker/sparse_rows.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"

namespace monsoon::worker {

UniqueIds Deduplicate(absl::Span<const uint64_t> ids) {
  UniqueIds unique;
  unique.where.reserve(ids.size());
  absl::flat_hash_map<uint64_t, uint32_t> index;
  index.reserve(ids.size());
  for (uint64_t id : ids) {
    auto [it, added] =
        index.emplace(id, static_cast<uint32_t>(unique.ids.size()));
    if (added) unique.ids.push_back(id);
    unique.where.push_back(it->second);
  }
  return unique;
}

std::vector<float> SumRepeats(const UniqueIds& unique,
                              absl::Span<const float> grads, int dim) {
  std::vector<float> sums(unique.ids.size() * dim, 0.0f);
  for (size_t i = 0; i < unique.where.size(); ++i) {
    float* into = sums.data() + size_t{unique.where[i]} * dim;
    const float* from = grads.data() + i * dim;
    for (int c = 0; c < dim; ++c) into[c] += from[c];
  }
  return sums;
}

std::vector<float> ExpandRows(const UniqueIds& unique,
                              absl::Span<const float> rows, int dim) {
  std::vector<float> out(unique.where.size() * dim);
  for (size_t i = 0; i < unique.where.size(); ++i) {
    const float* from = rows.data() + size_t{unique.where[i]} * dim;
    std::copy(from, from + dim, out.data() + i * dim);
  }
  return out;
}

}  // namespace monsoon::worker
