#include "common/machine_memory.h"

#include <unistd.h>

#include <cstdio>
#include <initializer_list>

namespace monsoon::common {
namespace {

// The first number in `path` (a cgroup's memory limit), or 0 when the file
// is missing or says "max".
uint64_t LimitInFile(const char* path) {
  std::FILE* file = std::fopen(path, "r");
  if (file == nullptr) return 0;
  unsigned long long value = 0;
  const int read = std::fscanf(file, "%llu", &value);
  std::fclose(file);
  return read == 1 ? static_cast<uint64_t>(value) : 0;
}

}  // namespace

uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

uint64_t MemoryLimitBytes() {
  uint64_t limit = PhysicalMemoryBytes();
  // cgroup v2, then v1 (whose "no limit" is a huge number, above the RAM).
  for (const char* path : {"/sys/fs/cgroup/memory.max",
                           "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const uint64_t cgroup = LimitInFile(path);
    if (cgroup > 0 && (limit == 0 || cgroup < limit)) limit = cgroup;
  }
  return limit;
}

}  // namespace monsoon::common
