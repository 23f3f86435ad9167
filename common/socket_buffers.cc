#include "common/socket_buffers.h"

#include <grpc/support/sync.h>
#include <sys/socket.h>

#include <memory>
#include <string>
#include <vector>

// gRPC's public API takes a socket mutator (ChannelArguments::
// SetSocketMutator, GRPC_ARG_SOCKET_MUTATOR) whose definition is in its
// src/core/lib/iomgr/socket_mutator.h, which is not installed with the
// library's headers. These are its declarations as of gRPC 1.51 (unchanged
// since 1.38, when mutate_fd_2 came); the functions are exported by
// libgrpc.
typedef enum {
  GRPC_FD_CLIENT_CONNECTION_USAGE,
  GRPC_FD_SERVER_LISTENER_USAGE,
  GRPC_FD_SERVER_CONNECTION_USAGE,
} grpc_fd_usage;

typedef struct {
  int fd;
  grpc_fd_usage usage;
} grpc_mutate_socket_info;

struct grpc_socket_mutator_vtable {
  bool (*mutate_fd)(int fd, grpc_socket_mutator* mutator);
  int (*compare)(grpc_socket_mutator* a, grpc_socket_mutator* b);
  void (*destroy)(grpc_socket_mutator* mutator);
  bool (*mutate_fd_2)(const grpc_mutate_socket_info* info,
                      grpc_socket_mutator* mutator);
};

struct grpc_socket_mutator {
  const grpc_socket_mutator_vtable* vtable;
  gpr_refcount refcount;
};

void grpc_socket_mutator_init(grpc_socket_mutator* mutator,
                              const grpc_socket_mutator_vtable* vtable);

namespace monsoon::common {
namespace {

bool SetBuffers(int fd) {
  sockaddr_storage address = {};
  socklen_t length = sizeof(address);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0 ||
      address.ss_family != AF_UNIX) {
    return true;  // TCP: the kernel tunes its buffers itself
  }
  // A failure leaves the kernel's defaults: slower, not wrong.
  const int bytes = kUnixSocketBufferBytes;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
  return true;
}

bool MutateFd(int fd, grpc_socket_mutator* /*mutator*/) {
  return SetBuffers(fd);
}

// Also called for the server's accepted connections, which gRPC hands
// only to mutate_fd_2.
bool MutateFd2(const grpc_mutate_socket_info* info,
               grpc_socket_mutator* /*mutator*/) {
  return SetBuffers(info->fd);
}

// Every such mutator does the same: equal, so that channels to one
// address may share a connection.
int Compare(grpc_socket_mutator* /*a*/, grpc_socket_mutator* /*b*/) {
  return 0;
}

void Destroy(grpc_socket_mutator* mutator) { delete mutator; }

constexpr grpc_socket_mutator_vtable kVtable = {MutateFd, Compare, Destroy,
                                                MutateFd2};

// A new mutator holding one reference, which SetSocketMutator takes over.
grpc_socket_mutator* NewMutator() {
  auto* mutator = new grpc_socket_mutator;
  grpc_socket_mutator_init(mutator, &kVtable);
  return mutator;
}

class BufferOption : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments* args) override {
    SetUnixSocketBuffers(args);
  }
  void UpdatePlugins(
      std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* /*plugins*/)
      override {}
};

}  // namespace

void SetUnixSocketBuffers(grpc::ChannelArguments* args) {
  args->SetSocketMutator(NewMutator());
}

void SetUnixSocketBuffers(grpc::ServerBuilder* builder) {
  builder->SetOption(std::make_unique<BufferOption>());
}

}  // namespace monsoon::common
