// libFuzzer target: the checkpoint reader, on a file holding the input.
// Whatever it accepts must hold finite weights and optimizer state; checking it against a shard must not fail otherwise than
// with a status: otherwise the target traps.
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "server/checkpoint.h"

namespace {

std::string* path = nullptr;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

// Every whole float32 of `bytes` finite (a partial one at the end is the
// length checks' to refuse, later: CheckCheckpointMatches, RestoreState).
void CheckFloats(const std::string& bytes) {
  for (size_t i = 0; i + sizeof(float) <= bytes.size(); i += sizeof(float)) {
    float v;
    std::memcpy(&v, bytes.data() + i, sizeof(v));
    Check(std::isfinite(v));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char name[] = "/tmp/checkpoint_fuzzer.XXXXXX";
  const int fd = mkstemp(name);
  if (fd < 0) std::abort();
  close(fd);
  path = new std::string(name);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FILE* out = std::fopen(path->c_str(), "wb");
  if (out == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, out) != size) std::abort();
  std::fclose(out);
  auto read = monsoon::server::ReadCheckpoint(*path);
  if (!read.ok() || !read->has_value()) return 0;
  const monsoon::ShardCheckpoint& checkpoint = **read;
  CheckFloats(checkpoint.weights());
  CheckFloats(checkpoint.optimizer_state());
  (void)monsoon::server::CheckCheckpointMatches(
      checkpoint, checkpoint.config_fingerprint(), checkpoint.shard(),
      checkpoint.num_shards(), checkpoint.weights().size() / sizeof(float));
  return 0;
}
