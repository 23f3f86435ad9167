// libFuzzer target: the config parser. Any text either is refused with a
// status or parses; a parsed config either resolves (the model's shape
// taken, where the config leaves it open, from a Fashion-MNIST-like data set)
// or is refused; a resolved config has a model with parameters (made of
// layers: with at least 2 classes, fitting a batch; or a script's tensors,
// which sparse_lr resolves to: no layers, so no classes), and printed and
// parsed again resolves, with no data, to the same config (the same
// fingerprint): otherwise the target traps.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "common/config.h"
#include "common/data_shape.h"
#include "common/model_config.h"
#include "common/model_layout.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<monsoon::TrainingConfig> parsed =
      monsoon::common::ParseConfigText(text);
  if (!parsed.ok()) return 0;
  monsoon::common::DataShape shape;
  shape.example = {28, 28, 1};
  shape.num_classes = 10;
  absl::StatusOr<monsoon::TrainingConfig> resolved =
      monsoon::common::ResolveConfig(
          *parsed, monsoon::common::ModelNeedsData(*parsed) ? &shape : nullptr);
  if (!resolved.ok()) return 0;
  const monsoon::common::ModelLayout layout =
      monsoon::common::ModelLayout::FromConfig(*resolved);
  if (layout.num_params() == 0) __builtin_trap();
  if (resolved->tensors_size() == 0 &&
      (layout.num_classes() < 2 ||
       layout.LargestBufferPerExample() * resolved->batch_size() >=
           (uint64_t{1} << 31))) {
    __builtin_trap();
  }
  const std::string printed = monsoon::common::ConfigToText(*resolved);
  absl::StatusOr<monsoon::TrainingConfig> again =
      monsoon::common::ParseConfigText(printed);
  if (!again.ok()) __builtin_trap();
  absl::StatusOr<monsoon::TrainingConfig> again_resolved =
      monsoon::common::ResolveConfig(*again);
  if (!again_resolved.ok()) __builtin_trap();
  if (monsoon::common::ConfigFingerprint(*again_resolved) !=
      monsoon::common::ConfigFingerprint(*resolved)) {
    __builtin_trap();
  }
  return 0;
}
