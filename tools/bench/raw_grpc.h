// The reference that wire_bench holds Monsoon's tensor streams against: a
// minimal gRPC service and client that move raw bytes, with no Monsoon code
// on their path. Messages are ByteBuffers made of static slices of one
// preallocated buffer (no copy before the socket), and received messages are
// dropped unread, so a transfer costs what gRPC and loopback TCP cost.
//
// Three methods, each one call: Push streams `bytes` in messages of
// `chunk_bytes` to the server, which answers with one small message; Pull
// asks the server for `bytes` and receives them in such messages; PushPull
// does both in one call (the server answers once the push has arrived).
#ifndef MONSOON_TOOLS_BENCH_RAW_GRPC_H_
#define MONSOON_TOOLS_BENCH_RAW_GRPC_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/server.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace monsoon::tools {

class RawGrpcServer {
 public:
  // Listens on `listen` (host:port, port 0 a free one, or unix:PATH);
  // serves transfers of up to max_bytes.
  static absl::StatusOr<std::unique_ptr<RawGrpcServer>> Start(
      uint64_t max_bytes, const std::string& listen = "127.0.0.1:0");
  ~RawGrpcServer();

  // Where a client reaches it.
  const std::string& address() const { return address_; }

 private:
  class Service;
  RawGrpcServer() = default;
  std::vector<char> payload_;  // what pulls send
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

class RawGrpcClient {
 public:
  // Sends at most max_bytes per transfer.
  RawGrpcClient(const std::string& address, uint64_t max_bytes);

  absl::Status Push(uint64_t bytes, uint64_t chunk_bytes);
  absl::Status Pull(uint64_t bytes, uint64_t chunk_bytes);
  absl::Status PushPull(uint64_t bytes, uint64_t chunk_bytes);

 private:
  // Writes `push_bytes` (after a request naming `pull_bytes`), then reads
  // until the server ends the call; checks that pull_bytes arrived.
  absl::Status Call(const std::string& method, uint64_t push_bytes,
                    uint64_t pull_bytes, uint64_t chunk_bytes);

  std::vector<char> payload_;  // what pushes send
  grpc::GenericStub stub_;
};

}  // namespace monsoon::tools

#endif  // MONSOON_TOOLS_BENCH_RAW_GRPC_H_
