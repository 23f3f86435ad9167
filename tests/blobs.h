// A small synthetic classification set for tests that train: 10 Gaussian
// blobs in 20 dimensions (kBlobFeatures, kBlobClasses), learnable in a few
// epochs by a small MLP.
#ifndef MONSOON_TESTS_BLOBS_H_
#define MONSOON_TESTS_BLOBS_H_

#include <cstdint>

#include "worker/dataset.h"

namespace monsoon::testutil {

inline constexpr int kBlobFeatures = 20;
inline constexpr int kBlobClasses = 10;

// `examples` examples: centres uniform in [-1, 1]^20 (the same for every
// split), noise of standard deviation 0.5 drawn from `noise_seed`, labels
// i % 10.
worker::Dataset Blobs(int examples, uint64_t noise_seed);

}  // namespace monsoon::testutil

#endif  // MONSOON_TESTS_BLOBS_H_
