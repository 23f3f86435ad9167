// libFuzzer target: the checkpoint reader (ParseCheckpoint, what
// ReadCheckpoint does with a file's bytes) on the input, and on the input
// with a correct CRC-32 appended (so that mutations of a format-2 file get
// past its CRC). Whatever it accepts must hold only finite values; checked
// against a fixed shard (shard 1 of 2, kWeights weights, kFingerprint),
// what passes must hold exactly that many weights and a version >= 0, and
// its optimizer state must restore into that shard's optimizer or be
// refused with a status, restoring to the same bytes: otherwise the target
// traps.
#include <zlib.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "google/protobuf/stubs/logging.h"
#include "server/checkpoint.h"
#include "server/optimizer.h"

namespace {

// As tests/fuzz/make_seeds.cc writes them.
constexpr uint64_t kFingerprint = 0x0123456789abcdefu;
constexpr int kShard = 1;
constexpr int kNumShards = 2;
constexpr uint64_t kWeights = 27;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

// Every whole float32 of `bytes` finite (a partial one at the end is for
// the size checks to refuse, later).
void CheckFinite(const std::string& bytes) {
  for (size_t i = 0; i + sizeof(float) <= bytes.size(); i += sizeof(float)) {
    float v;
    std::memcpy(&v, bytes.data() + i, sizeof(v));
    Check(std::isfinite(v));
  }
}

void CheckRestores(monsoon::server::Optimizer* optimizer,
                   const std::string& state) {
  if (!optimizer->RestoreState(state).ok()) return;
  Check(optimizer->SaveState() == state);
}

void Read(const std::string& bytes) {
  absl::StatusOr<monsoon::ShardCheckpoint> read =
      monsoon::server::ParseCheckpoint(bytes, "fuzz-input");
  if (!read.ok()) return;
  const monsoon::ShardCheckpoint& checkpoint = *read;
  Check(checkpoint.format_version() == 1 ||
        checkpoint.format_version() ==
            monsoon::server::kCheckpointFormatVersion);
  CheckFinite(checkpoint.weights());
  CheckFinite(checkpoint.optimizer_state());
  if (!monsoon::server::CheckCheckpointMatches(checkpoint, kFingerprint,
                                               kShard, kNumShards, kWeights)
           .ok()) {
    return;
  }
  Check(checkpoint.config_fingerprint() == kFingerprint);
  Check(checkpoint.shard() == kShard && checkpoint.num_shards() == kNumShards);
  Check(checkpoint.weights().size() == kWeights * sizeof(float));
  Check(checkpoint.version() >= 0);
  if (checkpoint.optimizer() == "sgd") {
    monsoon::server::SgdOptimizer sgd(kWeights, 0.5f, 0.9f);
    CheckRestores(&sgd, checkpoint.optimizer_state());
  } else if (checkpoint.optimizer() == "adagrad") {
    monsoon::server::AdagradOptimizer adagrad(kWeights, 0.5f, 0.1f);
    CheckRestores(&adagrad, checkpoint.optimizer_state());
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Protobuf logs every string field that is not UTF-8 it parses: noise
  // here, and slow.
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  Read(bytes);
  // The crc32 field (field 10, fixed32) over every byte before it.
  const uint32_t crc = static_cast<uint32_t>(
      crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(data),
            static_cast<uInt>(size)));
  bytes.push_back(static_cast<char>((10 << 3) | 5));
  for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>(crc >> (8 * i)));
  Read(bytes);
  return 0;
}
