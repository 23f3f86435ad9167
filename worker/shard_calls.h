// The pieces of a call to every shard that PsClient's requests share: one
// shard's connection, the collector that waits for every shard's answer
// (watching the connections and the stop while it waits), and the message
// annotation that names the shard. Internal to the client.
//
// ShardCalls: Done() may be called from any thread; Wait() from one.
#ifndef MONSOON_WORKER_SHARD_CALLS_H_
#define MONSOON_WORKER_SHARD_CALLS_H_

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/generic/generic_stub.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "proto/service.grpc.pb.h"
#include "worker/parameter_client.h"

namespace monsoon::worker {

// One shard's connection.
struct ShardConnection {
  std::string address;
  // Sets the metadata every call to this shard carries (the run's token,
  // and the range after a take-over).
  void Prepare(grpc::ClientContext* context) const;
  std::string authorization;                     // "Bearer <token>", or empty
  // After the range's backup took it over: the shard's index, which tells
  // the process there (which also serves its own range) which range a
  // stream call is for (common::kRangeMetadataKey). Empty before.
  std::string range;
  std::shared_ptr<grpc::Channel> channel;        // watched during waits
  std::unique_ptr<ParameterService::Stub> stub;  // Register, Stats
  std::unique_ptr<grpc::GenericStub> streams;    // Push, Pull, PushPull
};

// What a wait that goes on is logged as: every `every` (zero: never),
// "<who>: waiting <time> for shard(s) <pending> to answer <what>".
struct WaitNote {
  absl::Duration every;
  std::string who;
  std::string what;
};

WaitNote NoteFor(absl::Duration every, int rank, std::string what);

// Collects one status per shard and wakes Wait() when all are in. With a
// stop notification, Wait() cancels the shards' calls once it is notified.
// (A std::mutex and condition variable: ThreadSanitizer follows them.)
class ShardCalls : public PendingCall {
 public:
  ShardCalls(int shards, const absl::Notification* stop, WaitNote note = {})
      : statuses_(shards),
        answered_(shards, false),
        pending_(shards),
        stop_(stop),
        note_(std::move(note)) {}

  // Called once per shard, from any thread.
  void Done(int shard, absl::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    statuses_[shard] = std::move(status);
    answered_[shard] = true;
    --pending_;
    // Under the lock: once pending_ reaches 0 the waiter may return and
    // destroy this object, condition variable included, as soon as it can
    // take the lock.
    done_.notify_all();
  }

  // Watches the shards' connections while others have not answered: a
  // shard that answered and then lost its connection has most likely died
  // and will come back from a checkpoint without what it just took, while
  // this client waits on the others (in sync, on a barrier that needs
  // another worker, who may in turn be waiting for this one at the lost
  // shard). Wait() then cancels the calls still running and returns
  // UNAVAILABLE, so that the caller rides the loss out as if its own call
  // had failed. Call before Wait(); `shards` outlive it.
  void WatchConnections(const std::vector<ShardConnection>* shards) {
    shards_ = shards;
  }

  // A shard's call to cancel if the stop notification comes.
  void Cancellable(grpc::ClientContext* context) {
    std::lock_guard<std::mutex> lock(mu_);
    contexts_.push_back(context);
  }

  absl::Status Wait() override;

  // Keeps a shard's reactor alive until Wait().
  template <typename T>
  T* Own(std::unique_ptr<T> call) {
    T* raw = call.get();
    calls_.push_back(std::shared_ptr<void>(std::move(call)));
    return raw;
  }

  ~ShardCalls() override { Wait().IgnoreError(); }

  // Shard `shard`'s outcome, once Wait() has returned.
  const absl::Status& status(int shard) const { return statuses_[shard]; }

 private:
  std::vector<absl::Status> statuses_;  // slot s written by shard s's call
  std::vector<bool> answered_;          // guarded by mu_
  std::mutex mu_;
  std::condition_variable done_;
  int pending_;                                 // guarded by mu_
  std::vector<grpc::ClientContext*> contexts_;  // guarded by mu_
  const absl::Notification* const stop_;
  const WaitNote note_;
  const std::vector<ShardConnection>* shards_ = nullptr;
  absl::Status lost_;  // written and read by the waiting thread only
  bool waited_ = false;
  std::vector<std::shared_ptr<void>> calls_;
};

// `status` with "shard S at ADDRESS: " before its message (OK unchanged).
absl::Status Annotate(const absl::Status& status, int shard,
                      const std::string& address);

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_SHARD_CALLS_H_
