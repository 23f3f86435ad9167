// Accepting connections that survives running out of file descriptors.
//
// gRPC 1.51's listener stops accepting for good at the first accept4()
// that fails with EMFILE or ENFILE: it logs "Failed accept4: Too many open
// files" once and never listens again, even after every connection has
// closed (gRPC fixed this in 1.57). A server with a limit of 1,024 files
// (a container's usual one) was silenced for good by 1,100 idle
// connections.
//
// This file defines accept4() for the whole process: the dynamic linker
// looks a symbol up in the executable before the C library, so gRPC's
// listener (and the metrics endpoint's) call it. Until ArmAcceptGuard() it
// is the C library's. Armed, it never lets the process's descriptors run
// out through accepting, and never fails with EMFILE:
//  - a connection whose descriptor would leave fewer than `reserve` free
//    below the soft limit is closed at once (shed; the client sees the
//    connection reset and retries, as gRPC clients do with backoff), so
//    the server keeps room for its own files, timers and checkpoints;
//  - if the process is out of descriptors anyway (others took the room),
//    the pending connection is taken with a spare descriptor kept for the
//    purpose and closed, so that the backlog drains and the listener's next
//    readiness event is not lost.
// Shed connections are counted and logged at most every 10 s.
//
// Thread-safe.
#ifndef MONSOON_COMMON_ACCEPT_GUARD_H_
#define MONSOON_COMMON_ACCEPT_GUARD_H_

#include <cstdint>

namespace monsoon::common {

// Arms the guard with the process's soft limit on open files as it is now
// (raise it first: TuneProcess does) less `reserve`. Call it once, early
// in main(); later calls re-read the limit.
void ArmAcceptGuard(int reserve = 64);

// Connections closed at once because the process was near or at its limit
// on open files.
int64_t ConnectionsShed();

// Descriptors the process has open (entries of /proc/self/fd), or -1 where
// that cannot be read.
int64_t OpenFileDescriptors();

// The process's soft limit on open files, or -1 if unknown.
int64_t FileDescriptorLimit();

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_ACCEPT_GUARD_H_
