// wire_bench's Monsoon side: one shard served in this process and one
// client of it, both on loopback (or a Unix domain socket), through the same
// code as ps_server and ps_worker: pushes leave through a GradientPusher over
// the CPU backend, as a CPU worker's do. Each call is one repetition of a case.
#ifndef MONSOON_TOOLS_BENCH_MONSOON_WIRE_H_
#define MONSOON_TOOLS_BENCH_MONSOON_WIRE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/config.pb.h"
#include "server/shard_server.h"
#include "worker/compute_backend.h"
#include "worker/gradient_pusher.h"
#include "worker/ps_client.h"

namespace monsoon::tools {

class MonsoonWire {
 public:
  ~MonsoonWire();
  // A shard of `values` parameters (one worker) listening on `listen`, and
  // its client; 1-bit quantized pushes when `onebit`.
  static absl::StatusOr<std::unique_ptr<MonsoonWire>> Start(
      uint64_t values, Mode mode, bool onebit, uint64_t chunk_bytes,
      const std::string& listen = "127.0.0.1:0");

  absl::Status Push();
  absl::Status Pull();
  // A push and the weights of the version it made, in one round trip.
  absl::Status PushPull();
  // Bytes of one push's payload on the wire (bits and scales under 1-bit).
  uint64_t push_wire_bytes() const;
  // Seconds the shard has spent writing updates into its weights so far
  // (ShardState::apply_seconds: the rule's pass, not the copy or checks of
  // a push).
  double update_seconds() const;

 private:
  MonsoonWire() = default;
  absl::Status Push(const worker::PullTarget* pull);

  TrainingConfig config_;
  std::unique_ptr<server::ShardServer> server_;
  std::unique_ptr<worker::PsClient> client_;
  std::unique_ptr<worker::ComputeBackend> backend_;
  std::unique_ptr<worker::GradientPusher> pusher_;
  float* grads_ = nullptr;  // in the backend's memory
  uint64_t values_ = 0;
  std::vector<float> params_;
  std::vector<int64_t> versions_{0};
  int64_t next_offset_ = 0;  // the pushes' sample offsets
};

// A shard holding one sparse table (row-wise Adagrad, rows of `dim`, up to
// `rows`, none made yet) and its client: each call pushes or pulls the rows
// of `batch` ids drawn at random from [0, rows) through PsClient's sparse
// calls, as a worker of a click model would.
class SparseWire {
 public:
  static absl::StatusOr<std::unique_ptr<SparseWire>> Start(int dim,
                                                           int64_t rows,
                                                           int batch);
  // The next batch's ids: a push of their row gradients, or a pull.
  absl::Status Push();
  absl::Status Pull();
  // The serialized bytes the client sent (push) or received (pull) in its
  // last call of each.
  uint64_t push_bytes() const { return push_bytes_; }
  uint64_t pull_bytes() const { return pull_bytes_; }

 private:
  SparseWire() = default;
  void NextIds();

  std::unique_ptr<server::ShardServer> server_;
  std::unique_ptr<worker::PsClient> client_;
  int dim_ = 0;
  int64_t rows_ = 0;
  uint64_t draws_ = 0;
  std::vector<uint64_t> ids_;
  std::vector<float> grads_, pulled_;
  uint64_t push_bytes_ = 0, pull_bytes_ = 0;
};

}  // namespace monsoon::tools

#endif  // MONSOON_TOOLS_BENCH_MONSOON_WIRE_H_
