// What memory this process has: the machine's, and the limit a container
// (cgroup) puts on it. Read when a shard starts, to refuse what would not
// fit rather than be killed by the kernel later. Stateless.
#ifndef MONSOON_COMMON_MACHINE_MEMORY_H_
#define MONSOON_COMMON_MACHINE_MEMORY_H_

#include <cstdint>

namespace monsoon::common {

// The machine's physical memory, or 0 if unknown.
uint64_t PhysicalMemoryBytes();

// The memory this process may use: the machine's, or its cgroup's limit
// where that is lower (a container's, a Kubernetes pod's); 0 if unknown.
uint64_t MemoryLimitBytes();

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_MACHINE_MEMORY_H_
