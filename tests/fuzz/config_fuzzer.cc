// libFuzzer target: the config parser. Any text either is refused with a
// status or parses; a parsed config either resolves or is refused; a
// resolved config printed and parsed again resolves to the same config
// (the same fingerprint): otherwise the target traps.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "common/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<monsoon::TrainingConfig> parsed =
      monsoon::common::ParseConfigText(text);
  if (!parsed.ok()) return 0;
  absl::StatusOr<monsoon::TrainingConfig> resolved =
      monsoon::common::ResolveConfig(*parsed);
  if (!resolved.ok()) return 0;
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
