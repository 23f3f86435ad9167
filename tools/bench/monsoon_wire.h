// wire_bench's Monsoon side: one shard served in this process and one
// client of it, both on loopback, through the same code as ps_server and
// ps_worker. Each call is one repetition of a case.
#ifndef MONSOON_TOOLS_BENCH_MONSOON_WIRE_H_
#define MONSOON_TOOLS_BENCH_MONSOON_WIRE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/config.pb.h"
#include "server/shard_server.h"
#include "worker/ps_client.h"

namespace monsoon::tools {

class MonsoonWire {
 public:
  // A shard of `values` parameters (one worker) and its client; 1-bit
  // quantized pushes when `onebit`.
  static absl::StatusOr<std::unique_ptr<MonsoonWire>> Start(
      uint64_t values, Mode mode, bool onebit, uint64_t chunk_bytes);

  absl::Status Push();
  absl::Status Pull();
  // A push, then the weights of the version it made.
  absl::Status PushPull();
  // Bytes of one push's payload on the wire (bits and scales under 1-bit).
  uint64_t push_wire_bytes() const;

 private:
  MonsoonWire() = default;

  TrainingConfig config_;
  std::unique_ptr<server::ShardServer> server_;
  std::unique_ptr<worker::PsClient> client_;
  std::vector<float> grads_;
  std::vector<float> params_;
  std::vector<int64_t> versions_{0};
};

}  // namespace monsoon::tools

#endif  // MONSOON_TOOLS_BENCH_MONSOON_WIRE_H_
