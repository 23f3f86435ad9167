#include "common/model_config.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace monsoon::common {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("config field '", field, "' ", what));
}

Layer Dense(int units) {
  Layer layer;
  Layer::Dense* dense = layer.mutable_dense();
  if (units > 0) dense->set_units(units);
  return layer;
}

Layer Conv(int filters, int kernel, int padding) {
  Layer layer;
  layer.mutable_conv()->set_filters(filters);
  layer.mutable_conv()->set_kernel(kernel);
  layer.mutable_conv()->set_padding(padding);
  return layer;
}

Layer Pool(int size) {
  Layer layer;
  layer.mutable_max_pool()->set_size(size);
  return layer;
}

Layer Relu() {
  Layer layer;
  layer.mutable_relu();
  return layer;
}

// The last layer that is not a Flatten, or null.
const Layer* LastLayer(const google::protobuf::RepeatedPtrField<Layer>& list) {
  for (int i = list.size() - 1; i >= 0; --i) {
    if (!list[i].has_flatten()) return &list[i];
  }
  return nullptr;
}

// The legacy form: layer_sizes describe the whole MLP.
absl::Status ResolveLayerSizes(TrainingConfig* c) {
  if (c->layer_sizes_size() < 2) {
    return Invalid("layer_sizes", "needs at least an input and an output size");
  }
  // The input may have as many values as the same MLP given as layers
  // takes (common/model_layout.cc), so that a model resolves in either
  // form; layers have up to 2^20 units. (The parameter count is the
  // shards' to refuse, by what fits a shard: ShardServer::Start.)
  for (int i = 0; i < c->layer_sizes_size(); ++i) {
    const int size = c->layer_sizes(i);
    if (i == 0 && (size <= 0 || size > (1 << 24))) {
      return Invalid("layer_sizes",
                     absl::StrCat("starts with ", size,
                                  "; the input needs 1 to 16777216 values"));
    }
    if (i > 0 && (size <= 0 || size > (1 << 20))) {
      return Invalid("layer_sizes",
                     absl::StrCat("has size ", size,
                                  "; every layer needs 1 to 1048576 units"));
    }
  }
  const int classes = c->layer_sizes(c->layer_sizes_size() - 1);
  if (classes < 2) {
    return Invalid("layer_sizes", "needs at least 2 classes in the last layer");
  }
  if (c->input_shape_size() > 0) {
    uint64_t values = 1;
    for (int side : c->input_shape()) values *= side < 0 ? 0 : side;
    if (values != static_cast<uint64_t>(c->layer_sizes(0))) {
      return Invalid(
          "input_shape",
          absl::StrCat("has ", values, " values, but layer_sizes starts with ",
                       c->layer_sizes(0), ": keep one of them"));
    }
  }
  if (c->has_num_classes() && c->num_classes() != classes) {
    return Invalid("num_classes", absl::StrCat("is ", c->num_classes(),
                                               " but layer_sizes ends with ",
                                               classes, ": keep one of them"));
  }
  c->clear_input_shape();
  c->clear_num_classes();
  c->clear_model();
  return absl::OkStatus();
}

// Whether `layout` is dense (ReLU dense)*: the MLP that layer_sizes says.
bool IsMlp(const ModelLayout& layout) {
  const std::vector<LayerSpec>& layers = layout.layers();
  if (layers.empty() || layers.size() % 2 == 0) return false;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec::Kind want =
        i % 2 == 0 ? LayerSpec::Kind::kDense : LayerSpec::Kind::kRelu;
    if (layers[i].kind != want) return false;
  }
  return true;
}

// The steps of ResolveModel for a model given as a preset or as layers
// (layer_sizes resolve on their own, above).

// INVALID_ARGUMENT where the config describes the model in two ways (layers
// and layer_sizes, a preset and layers, a preset other than MLP and
// layer_sizes).
absl::Status CheckModelForms(const TrainingConfig& c) {
  const bool has_layers = c.layers_size() > 0;
  const bool has_sizes = c.layer_sizes_size() > 0;
  if (has_layers && has_sizes) {
    return Invalid("layers",
                   "and layer_sizes both describe the model: keep one");
  }
  if (has_layers && c.model() != MODEL_AUTO) {
    return Invalid("model",
                   absl::StrCat("names the preset ", ModelName(c.model()),
                                " and layers are given too: keep one"));
  }
  if (has_sizes && c.model() != MODEL_AUTO && c.model() != MLP) {
    return Invalid("layer_sizes",
                   absl::StrCat("describe an MLP, but model is ",
                                ModelName(c.model()), ": keep one"));
  }
  return absl::OkStatus();
}

// The examples' shape: the config's input_shape, which must be a valid
// shape and agree with `data`'s where both are there, else `data`'s.
// INVALID_ARGUMENT when neither says it.
absl::StatusOr<Shape> InputShape(const TrainingConfig& c,
                                 const DataShape* data) {
  if (c.input_shape_size() == 0) {
    if (data != nullptr) return data->example;
    return Invalid("input_shape",
                   "is unset and the data was not read to take it from: set "
                   "input_shape and num_classes, or resolve the config where "
                   "data_dir's training files can be read");
  }
  if (c.input_shape_size() != 3) {
    return Invalid("input_shape",
                   absl::StrCat("has ", c.input_shape_size(),
                                " values; give [height, width, channels] "
                                "(channels 1 for greyscale), or leave it "
                                "unset to take it from the data"));
  }
  for (int side : c.input_shape()) {
    if (side < 1 || side > (1 << 15)) {
      return Invalid(
          "input_shape",
          absl::StrCat("has ", side, "; each side must be from 1 to 32768"));
    }
  }
  const Shape input = {c.input_shape(0), c.input_shape(1), c.input_shape(2)};
  if (data != nullptr && data->example != input) {
    return Invalid(
        "input_shape",
        absl::StrCat("is ", ShapeString(input),
                     " but the data's examples "
                     "are ",
                     ShapeString(data->example),
                     ": remove input_shape to take it from the data, or "
                     "point data_dir at the data the model was made for"));
  }
  return input;
}

// The model's layers without Flatten (the config's, or its preset's), the
// output layer last: a dense layer, the only one that may leave its units
// to the classes. INVALID_ARGUMENT otherwise.
absl::StatusOr<std::vector<Layer>> ModelLayers(const TrainingConfig& c) {
  std::vector<Layer> layers;
  if (c.layers_size() > 0) {
    for (const Layer& layer : c.layers()) {
      if (!layer.has_flatten()) layers.push_back(layer);
    }
  } else {
    layers = PresetLayers(c.model());
  }
  if (layers.empty() || !layers.back().has_dense()) {
    return Invalid("layers",
                   "must end with a dense layer: the output layer, whose "
                   "units (left unset: num_classes) feed the softmax");
  }
  for (size_t i = 0; i + 1 < layers.size(); ++i) {
    if (layers[i].has_dense() && !layers[i].dense().has_units()) {
      return Invalid("layers",
                     absl::StrCat("layer ", i + 1,
                                  " is a dense layer without units; only the "
                                  "output layer may leave them to "
                                  "num_classes"));
    }
  }
  return layers;
}

// The number of classes: the config's num_classes, else the output layer's
// units, else `data`'s. INVALID_ARGUMENT when none says it, when it is out
// of range, when the output layer has other units, or when the training
// labels go beyond it.
absl::StatusOr<int> Classes(const TrainingConfig& c, const Layer::Dense& output,
                            const DataShape* data) {
  int classes = 0;
  if (c.has_num_classes()) {
    classes = c.num_classes();
  } else if (output.has_units()) {
    classes = output.units();
  } else if (data != nullptr) {
    classes = data->num_classes;
  } else {
    return Invalid("num_classes",
                   "is unset and the data was not read to take it from: set "
                   "num_classes, or resolve the config where data_dir's "
                   "training labels can be read");
  }
  if (classes < 2 || classes > (1 << 20)) {
    return Invalid("num_classes",
                   absl::StrCat("is ", classes, "; must be from 2 to 1048576"));
  }
  if (output.has_units() && output.units() != classes) {
    return Invalid("layers",
                   absl::StrCat("end with a dense layer of ", output.units(),
                                " units, but the model has ", classes,
                                " classes: the output layer needs one unit "
                                "per class (leave its units unset)"));
  }
  if (data != nullptr && data->num_classes > classes) {
    if (c.has_num_classes()) {
      return Invalid(
          "num_classes",
          absl::StrCat("is ", classes, " but the training labels go up to ",
                       data->num_classes - 1,
                       ": remove num_classes to take it from the data"));
    }
    return Invalid("layers",
                   absl::StrCat("end with a dense layer of ", classes,
                                " units, but the training labels go up to ",
                                data->num_classes - 1,
                                ": leave the output layer's units unset to "
                                "take the classes from the data"));
  }
  return classes;
}

// Sets every field of the conv and pooling layers explicitly, so that equal
// models have equal fingerprints.
void SpellOutLayerDefaults(std::vector<Layer>* layers) {
  for (Layer& layer : *layers) {
    if (layer.has_conv()) {
      Layer::Conv* conv = layer.mutable_conv();
      conv->set_kernel(conv->kernel());
      conv->set_stride(conv->stride());
      conv->set_padding(conv->padding());
    } else if (layer.has_max_pool()) {
      Layer::MaxPool* pool = layer.mutable_max_pool();
      pool->set_size(pool->size());
      if (!pool->has_stride()) pool->set_stride(pool->size());
    }
  }
}

// Replaces the config's model fields with the one form a resolved config
// keeps: an MLP as layer_sizes, any other model as its layers plus
// input_shape and num_classes.
void KeepCanonicalModel(const Shape& input, int classes,
                        const ModelLayout& layout, std::vector<Layer> layers,
                        TrainingConfig* c) {
  c->clear_model();
  c->clear_layers();
  c->clear_input_shape();
  c->clear_num_classes();
  if (IsMlp(layout)) {
    // The form configs had before layers, so that an MLP keeps its
    // fingerprint however it was written.
    c->add_layer_sizes(static_cast<int>(input.size()));
    for (const LayerSpec& layer : layout.layers()) {
      if (layer.kind == LayerSpec::Kind::kDense) {
        c->add_layer_sizes(layer.out.channels);
      }
    }
    return;
  }
  for (Layer& layer : layers) *c->add_layers() = std::move(layer);
  c->add_input_shape(input.height);
  c->add_input_shape(input.width);
  c->add_input_shape(input.channels);
  c->set_num_classes(classes);
}

}  // namespace

std::vector<Layer> PresetLayers(Model model) {
  if (model == LENET) {
    return {Conv(6, 5, 2), Relu(), Pool(2),   Conv(16, 5, 0), Relu(),  Pool(2),
            Dense(120),    Relu(), Dense(84), Relu(),         Dense(0)};
  }
  return {Dense(256), Relu(), Dense(128), Relu(), Dense(0)};
}

std::string ModelName(Model model) {
  return absl::AsciiStrToLower(Model_Name(model));
}

absl::StatusOr<Model> ParseModel(absl::string_view name) {
  Model model;
  if (!Model_Parse(absl::AsciiStrToUpper(name), &model) ||
      model == MODEL_AUTO) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown model '", name,
                     "'; use mlp, lenet or sparse_lr"));
  }
  return model;
}

namespace {

// A model given as `tensors` (proto/config.proto): nothing else may
// describe the model, and every tensor needs a name of its own and a shape
// of positive sides; the whole model below 2^40 parameters.
absl::Status ResolveExternalModel(TrainingConfig* config) {
  const TrainingConfig& c = *config;
  if (c.layers_size() > 0 || c.layer_sizes_size() > 0 ||
      c.model() != MODEL_AUTO || c.input_shape_size() > 0) {
    return Invalid("tensors",
                   "describe an external model, but model, layers, "
                   "layer_sizes or input_shape is set too: keep only tensors");
  }
  absl::flat_hash_set<std::string> names;
  uint64_t total = 0;
  for (int i = 0; i < c.tensors_size(); ++i) {
    const ExternalTensor& t = c.tensors(i);
    const std::string which = absl::StrCat("tensors[", i, "]");
    if (t.name().empty()) return Invalid(which, "has no name");
    if (!names.insert(t.name()).second) {
      return Invalid(which, absl::StrCat("repeats the name '", t.name(),
                                         "': each parameter needs its own"));
    }
    uint64_t size = 1;
    for (int64_t side : t.dims()) {
      if (side < 1 || side > (int64_t{1} << 40)) {
        return Invalid(which, absl::StrCat("('", t.name(), "') has a side of ",
                                           side, "; sides must be from 1 to "
                                           "2^40"));
      }
      size *= static_cast<uint64_t>(side);
      if (size > (uint64_t{1} << 40)) break;
    }
    total += size;
    if (size > (uint64_t{1} << 40) || total > (uint64_t{1} << 40)) {
      return Invalid(which, "makes the model larger than 2^40 parameters");
    }
  }
  return absl::OkStatus();
}

// SPARSE_LR: the bias and the low ids' weights as the one dense tensor,
// the rows in the table
// "weights" (made with defaults when the config does not list it). A
// resolved config (model, the bias and the table) resolves to itself.
absl::Status ResolveSparseLr(TrainingConfig* config) {
  TrainingConfig& c = *config;
  if (c.layers_size() > 0 || c.layer_sizes_size() > 0 ||
      c.input_shape_size() > 0 || c.has_num_classes() ||
      c.has_initial_weights()) {
    return Invalid("model",
                   "SPARSE_LR has a row per feature id and a bias; remove "
                   "layers, layer_sizes, input_shape, num_classes and "
                   "initial_weights");
  }
  if (c.tensors_size() > 0) {
    if (c.tensors_size() != 1 || c.tensors(0).name() != kSparseLrDense ||
        c.tensors(0).dims_size() != 1 ||
        c.tensors(0).dims(0) != kSparseLrDenseValues) {
      return Invalid("tensors",
                     "are set with model SPARSE_LR, whose dense parameters "
                     "are its own: remove tensors");
    }
  } else {
    ExternalTensor* dense = c.add_tensors();
    dense->set_name(kSparseLrDense);
    dense->add_dims(kSparseLrDenseValues);
  }
  for (const SparseTableConfig& table : c.sparse_tables()) {
    if (table.name() != kSparseLrTable) continue;
    if (table.dim() != 1) {
      return Invalid("sparse_tables",
                     absl::StrCat("'", kSparseLrTable, "' has dim ",
                                  table.dim(),
                                  "; SPARSE_LR's rows hold one weight: "
                                  "dim 1"));
    }
    return absl::OkStatus();
  }
  SparseTableConfig* table = c.add_sparse_tables();
  table->set_name(kSparseLrTable);
  table->set_dim(1);
  table->set_optimizer(SparseTableConfig::SPARSE_ROWWISE_ADAGRAD);
  table->set_init_scale(0);
  table->set_learning_rate(kSparseLrRowRate);
  table->set_adagrad_initial_accumulator(kSparseLrRowAccumulator);
  table->set_max_rows(int64_t{1} << 25);
  return absl::OkStatus();
}

}  // namespace

bool ModelNeedsData(const TrainingConfig& c) {
  if (c.model() == SPARSE_LR) return false;
  if (c.layer_sizes_size() > 0 || c.tensors_size() > 0) return false;
  if (c.input_shape_size() == 0) return true;
  if (c.has_num_classes()) return false;
  const Layer* last = LastLayer(c.layers());
  return last == nullptr || !last->has_dense() || !last->dense().has_units();
}

absl::Status ResolveModel(const DataShape* data, TrainingConfig* config) {
  TrainingConfig& c = *config;
  if (c.model() == SPARSE_LR) return ResolveSparseLr(config);
  if (c.tensors_size() > 0) return ResolveExternalModel(config);
  if (c.has_initial_weights()) {
    return Invalid("initial_weights",
                   "is only for a model given as `tensors` (an external "
                   "model); remove it");
  }
  if (absl::Status forms = CheckModelForms(c); !forms.ok()) return forms;
  if (c.layer_sizes_size() > 0) return ResolveLayerSizes(config);
  absl::StatusOr<Shape> input = InputShape(c, data);
  if (!input.ok()) return input.status();
  absl::StatusOr<std::vector<Layer>> layers = ModelLayers(c);
  if (!layers.ok()) return layers.status();
  Layer::Dense* output = layers->back().mutable_dense();
  absl::StatusOr<int> classes = Classes(c, *output, data);
  if (!classes.ok()) return classes.status();
  output->set_units(*classes);
  SpellOutLayerDefaults(&*layers);
  std::vector<const Layer*> pointers;
  for (const Layer& layer : *layers) pointers.push_back(&layer);
  absl::StatusOr<ModelLayout> layout = ModelLayout::Create(*input, pointers);
  if (!layout.ok()) {
    return Invalid(c.layers_size() > 0 ? "layers" : "model",
                   absl::StrCat("does not fit ", ShapeString(*input),
                                " examples: ", layout.status().message()));
  }
  KeepCanonicalModel(*input, *classes, *layout, *std::move(layers), config);
  return absl::OkStatus();
}

absl::Status CheckBuiltInModel(const TrainingConfig& resolved) {
  if (resolved.tensors_size() == 0 || resolved.model() == SPARSE_LR) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "the config's model is an external one (", resolved.tensors_size(),
      " tensors, first '", resolved.tensors(0).name(),
      "'): ps_worker and ps_evaluator run only Monsoon's own models; run the "
      "model's script with the monsoon Python package instead (README "
      "\"Bring your own model\")"));
}

absl::Status CheckDataFitsModel(const TrainingConfig& resolved,
                                const Shape& example, int classes) {
  const ModelLayout layout = ModelLayout::FromConfig(resolved);
  if (resolved.layer_sizes_size() > 0) {
    if (example.size() != layout.input().size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the data has ", example.size(), " values per example (",
          ShapeString(example), ") but the model's input layer has ",
          layout.input().size(),
          ": fix layer_sizes in the config, or leave the model's sizes to "
          "the data (model: MLP without layer_sizes)"));
    }
  } else if (example != layout.input()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the data's examples are ", ShapeString(example),
        " but the model's input_shape is ", ShapeString(layout.input()),
        ": remove input_shape from the config to take it from the data, or "
        "point data_dir at the data the model was made for"));
  }
  if (classes > layout.num_classes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the data's labels go up to ", classes - 1, " but the model has ",
        layout.num_classes(),
        " classes: remove num_classes (or the last layer size) from the "
        "config to take it from the data"));
  }
  return absl::OkStatus();
}

}  // namespace monsoon::common
