// Metrics of a binary classifier's scores: the area under the ROC curve
// (the chance that a random positive scores above a random negative, ties
// counting half) and the mean log loss. Pure functions; thread-safe.
#ifndef MONSOON_COMMON_AUC_H_
#define MONSOON_COMMON_AUC_H_

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace monsoon::common {

// AUC of `scores` against `labels` (positive: label > 0.5). INVALID_ARGUMENT
// when the sizes differ or one class is missing (no AUC then).
absl::StatusOr<double> Auc(absl::Span<const float> scores,
                           absl::Span<const float> labels);

// Mean of -log(p) for positives and -log(1 - p) for negatives, with p
// clamped to [1e-7, 1 - 1e-7]. INVALID_ARGUMENT when the sizes differ or
// there is nothing to average.
absl::StatusOr<double> LogLoss(absl::Span<const float> probabilities,
                               absl::Span<const float> labels);

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_AUC_H_
