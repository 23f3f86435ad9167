// Socket buffers for Unix domain sockets (ps_server --listen=unix:PATH).
// A Unix stream socket holds at most its sender's SO_SNDBUF in flight, by
// default net.core.wmem_default (212,992 bytes on most kernels): a 1 MiB
// chunk then crosses in five writes, each waiting for the reader to drain
// the last, and on busy cores every wait is a context switch. Measured
// here (train_bench, the MLP, 1 shard, 2 workers): the sockets with the
// default buffers trained slower than TCP on loopback (downpour 61-64k
// samples/s against 80k), and with 4 MiB buffers as fast or faster
// (81k; sync 75k against 61-70k).
//
// So every socket gRPC makes for Monsoon, as client or server, gets a
// mutator that sets SO_SNDBUF and SO_RCVBUF of a Unix domain socket to
// kUnixSocketBufferBytes; the kernel caps the value at net.core.wmem_max
// and rmem_max (raise those for the full effect). TCP sockets are left to
// the kernel's own tuning. Thread-safe.
#ifndef MONSOON_COMMON_SOCKET_BUFFERS_H_
#define MONSOON_COMMON_SOCKET_BUFFERS_H_

#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

namespace monsoon::common {

inline constexpr int kUnixSocketBufferBytes = 4 << 20;

// Sets the mutator on a client's channel arguments.
void SetUnixSocketBuffers(grpc::ChannelArguments* args);

// Sets it on a server's connections.
void SetUnixSocketBuffers(grpc::ServerBuilder* builder);

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_SOCKET_BUFFERS_H_
