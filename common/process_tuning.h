// Settings every Monsoon daemon and benchmark applies at the start of
// main(), before threads start:
//  - glibc's malloc keeps the large buffers that gRPC allocates and frees
//    for every message (its socket reads, ~1 MiB each here) instead of
//    returning them to the kernel, which faulted fresh zeroed pages in
//    again for every message: on a sync shard with 2 workers that was half
//    of its kernel time (sys 1.03 s against 0.56 s, user time unchanged).
//    It costs at most the trim threshold of free memory per malloc arena. A
//    MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ in the environment
//    wins.
//  - Abseil's mutex deadlock detection is off (it is on in Debian's build
//    and looks every lock up in a graph; the tests keep it).
//  - The soft limit on open files is raised to the hard one, and accepting
//    connections is bounded below it (common/accept_guard.h), so that idle
//    connections can neither use up a server's descriptors nor stop its
//    listener for good.
#ifndef MONSOON_COMMON_PROCESS_TUNING_H_
#define MONSOON_COMMON_PROCESS_TUNING_H_

namespace monsoon::common {

void TuneProcess();

// The first of TuneProcess' settings alone (glibc's malloc keeps large
// freed blocks), for a process Monsoon does not start: a PyTorch script
// whose monsoon.torch.init() makes it a worker. There, PyTorch's tensors of
// each step were mapped and faulted in afresh: two LeNet workers trained at
// 16,942 samples/s against 22,552 with this.
void KeepFreedMemory();

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_PROCESS_TUNING_H_
