#include "tests/blobs.h"

#include <cmath>
#include <vector>

#include "common/model_layout.h"

namespace monsoon::testutil {
namespace {

double Uniform(uint64_t* state) {
  *state = common::SplitMix64(*state);
  return (static_cast<double>(*state >> 11) + 0.5) /
         static_cast<double>(1ull << 53);
}

}  // namespace

worker::Dataset Blobs(int examples, uint64_t noise_seed) {
  std::vector<double> centres(kBlobClasses * kBlobFeatures);
  uint64_t state = 42;
  for (double& c : centres) c = 2 * Uniform(&state) - 1;
  worker::Dataset data;
  data.size = examples;
  data.dim = kBlobFeatures;
  state = noise_seed;
  for (int i = 0; i < examples; ++i) {
    const int label = i % kBlobClasses;
    data.labels.push_back(label);
    for (int f = 0; f < kBlobFeatures; ++f) {
      // Box-Muller.
      const double gaussian = std::sqrt(-2 * std::log(Uniform(&state))) *
                              std::cos(2 * M_PI * Uniform(&state));
      data.images.push_back(static_cast<float>(
          centres[label * kBlobFeatures + f] + 0.5 * gaussian));
    }
  }
  return data;
}

}  // namespace monsoon::testutil
