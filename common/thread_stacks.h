// Thread stacks that hold the process's static TLS as well as the stack
// their creator asked for.
//
// glibc carves a thread's static TLS (the thread_local storage of the
// executable and of every library loaded at start) out of the thread's
// stack, and pthread_create fails with EINVAL when the stack asked for
// cannot hold it. Libraries that ask for small stacks then fail in
// processes with large TLS: civetweb (behind the Prometheus exporter) asks
// for 100 KiB, while OpenBLAS alone holds 61 KiB of TLS and the CUDA
// libraries (cuBLASLt, cuBLAS, the runtime) another 110 KiB, so in a CUDA
// build the workers' metrics exporter could not start ("null context when
// constructing CivetServer").
//
// Linking this library defines pthread_attr_setstacksize() for the process
// (the executable's definition comes before the C library's, as with
// accept_guard): a requested size is raised by the static TLS size, so the
// caller gets the stack it asked for. Sizes of 0 and the C library's errors
// pass through unchanged. Thread-safe.
#ifndef MONSOON_COMMON_THREAD_STACKS_H_
#define MONSOON_COMMON_THREAD_STACKS_H_

#include <cstddef>

namespace monsoon::common {

// The bytes of static TLS of the modules loaded now (the sum of their
// PT_TLS segments, each rounded up to its alignment), which glibc takes
// out of every thread's stack.
size_t StaticTlsBytes();

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_THREAD_STACKS_H_
