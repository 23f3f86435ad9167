#include "common/auc.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"

namespace monsoon::common {

absl::StatusOr<double> Auc(absl::Span<const float> scores,
                           absl::Span<const float> labels) {
  if (scores.size() != labels.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AUC of ", scores.size(), " scores and ", labels.size(), " labels"));
  }
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Mann-Whitney: the positives' ranks (ties get their mean rank).
  double positive_ranks = 0;
  double positives = 0;
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j < order.size() && scores[order[j]] == scores[order[i]]) ++j;
    const double mean_rank = (static_cast<double>(i) + j - 1) / 2 + 1;
    for (size_t k = i; k < j; ++k) {
      if (labels[order[k]] > 0.5f) {
        positive_ranks += mean_rank;
        positives += 1;
      }
    }
    i = j;
  }
  const double negatives = static_cast<double>(scores.size()) - positives;
  if (positives == 0 || negatives == 0) {
    return absl::InvalidArgumentError(
        "no AUC: the labels hold only one class");
  }
  return (positive_ranks - positives * (positives + 1) / 2) /
         (positives * negatives);
}

absl::StatusOr<double> LogLoss(absl::Span<const float> probabilities,
                               absl::Span<const float> labels) {
  if (probabilities.size() != labels.size() || labels.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("log loss of ", probabilities.size(),
                     " probabilities and ", labels.size(), " labels"));
  }
  double sum = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    const double p =
        std::clamp(static_cast<double>(probabilities[i]), 1e-7, 1 - 1e-7);
    sum -= labels[i] > 0.5f ? std::log(p) : std::log(1 - p);
  }
  return sum / static_cast<double>(labels.size());
}

}  // namespace monsoon::common
