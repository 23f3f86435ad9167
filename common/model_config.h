// The model part of a training config: presets, legacy layer_sizes, the
// input shape and classes taken from the data, and the one canonical form a
// resolved config keeps (proto/config.proto, TrainingConfig.model).
// ResolveConfig (common/config.h) calls ResolveModel; the rest is for
// daemons and tools that read data or name models. Stateless; thread-safe.
#ifndef MONSOON_COMMON_MODEL_CONFIG_H_
#define MONSOON_COMMON_MODEL_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/data_shape.h"
#include "common/model_layout.h"
#include "proto/config.pb.h"

namespace monsoon::common {

// SPARSE_LR's dense tensor, of kSparseLrDenseValues values (the bias, then
// the weights of feature ids 0 to kSparseLrDenseValues - 2, held densely:
// the dense features of click data), and its table of one-value rows (every
// other id).
inline constexpr char kSparseLrDense[] = "dense";
inline constexpr int kSparseLrDenseValues = 64;
inline constexpr char kSparseLrTable[] = "weights";
// The rate and first accumulator of the table SPARSE_LR makes (row-wise
// Adagrad, one value a row): the same in every mode (the run's
// learning_rate differs by mode). A row's gradient is a batch mean, about
// 1/batch_size of an example's: a first accumulator of 0.1 (the default)
// would dwarf it for the whole run and keep rows from moving (test AUC
// 0.742 after an epoch of a million generated examples, against 0.756).
inline constexpr float kSparseLrRowRate = 0.1f;
inline constexpr float kSparseLrRowAccumulator = 1e-4f;

// The layers of a preset (MODEL_AUTO is MLP's), the output layer's units
// left to the classes.
std::vector<Layer> PresetLayers(Model model);

// "mlp", "lenet", "sparse_lr" and back; ParseModel accepts either case and refuses
// "model_auto".
std::string ModelName(Model model);
absl::StatusOr<Model> ParseModel(absl::string_view name);

// Whether resolving `config` needs the data's shape: its model leaves the
// input shape or the number of classes to the data.
bool ModelNeedsData(const TrainingConfig& config);

// Resolves config->model, layers, layer_sizes, input_shape and num_classes
// into the canonical form (an MLP as layer_sizes, SPARSE_LR as its bias
// in `tensors` and its table with the model kept, any other model as
// layers plus input_shape and num_classes; model cleared), taking what the
// config leaves open from `data` (null: nothing was read). Where the
// config and `data` both say something, they must agree. INVALID_ARGUMENT
// says which field is wrong and what to do.
absl::Status ResolveModel(const DataShape* data, TrainingConfig* config);

// OK where the resolved config's model is one the C++ worker and evaluator
// run (a preset, SPARSE_LR, layers or layer_sizes); INVALID_ARGUMENT for an external
// model (`tensors`), saying that a script with the monsoon Python package
// trains and evaluates it.
absl::Status CheckBuiltInModel(const TrainingConfig& resolved);

// Whether examples of shape `example` with labels below `classes` fit the
// resolved config's model: the same shape (for an MLP, the same number of
// values), and no more classes than the model's. INVALID_ARGUMENT says
// what differs and what to do.
absl::Status CheckDataFitsModel(const TrainingConfig& resolved,
                                const Shape& example, int classes);

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_MODEL_CONFIG_H_
