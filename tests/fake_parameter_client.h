// FakeParameterClient: a ParameterClient over in-memory shards for the
// training loops' unit tests, without gRPC. Each shard applies a float32
// push at once with plain SGD (weights -= learning_rate * gradient) and
// becomes the next version, as one worker's sync step or an asynchronous
// push would; a pull answers at once with the weights as they are. It
// records every push, and can be told to end the next pushes with given
// statuses (a lost shard) to test riding out. Thread-safe.
#ifndef MONSOON_TESTS_FAKE_PARAMETER_CLIENT_H_
#define MONSOON_TESTS_FAKE_PARAMETER_CLIENT_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/parameter_client.h"

namespace monsoon::testutil {

class FakeParameterClient : public worker::ParameterClient {
 public:
  // `config` resolved; the weights start at `initial` (all parameters),
  // split over `num_shards` as real shards split them.
  FakeParameterClient(const TrainingConfig& config, int num_shards,
                      std::vector<float> initial);

  struct RecordedPush {
    std::vector<int64_t> base_versions;
    int64_t samples = 0;
    int64_t sample_offset = 0;
    bool repeat = false;   // the first push after a Reconnect
    bool applied = false;  // false: ended with a scripted failure
  };

  // The next pushes end with these statuses, one each, in turn, and change
  // nothing.
  void FailNextPushes(std::vector<absl::Status> statuses);
  // Where this rank's data resumes, as the shards would say at
  // registration.
  void SetAppliedSamples(int64_t applied_samples);
  // What applied_samples() becomes at the next Reconnect.
  void ResumeAtNextReconnect(int64_t applied_samples);

  std::vector<RecordedPush> pushes() const;
  int reconnects() const;
  std::vector<float> weights() const;
  std::vector<int64_t> versions() const;

  // ParameterClient.
  int num_shards() const override { return static_cast<int>(ranges_.size()); }
  const std::vector<common::ShardRange>& ranges() const override {
    return ranges_;
  }
  int64_t applied_samples() const override;
  const TrainingConfig& config() const override { return config_; }
  std::unique_ptr<worker::PendingCall> PullAsync(
      const std::vector<int64_t>& min_versions, absl::Duration timeout,
      absl::Span<float> params, std::vector<int64_t>* versions,
      bool params_hold_versions = false) override;
  using worker::ParameterClient::PullAsync;
  std::unique_ptr<worker::ShardedPush> StartPush(
      const std::vector<int64_t>& base_versions, int64_t samples,
      int64_t sample_offset, common::BufferLease* lease,
      std::vector<PushResponse>* results,
      const worker::PullTarget* pull = nullptr) override;
  absl::Status Reconnect(absl::Duration timeout,
                         absl::Duration log_every) override;
  int64_t bytes_pushed() const override { return 0; }
  int64_t bytes_pulled() const override { return 0; }

 private:
  class Push;
  // Applies a whole push (`gradient` of every parameter) or ends it with
  // the next scripted failure; fills `pull` if given.
  absl::Status Finish(const RecordedPush& push,
                      const std::vector<float>& gradient,
                      std::vector<PushResponse>* results,
                      const worker::PullTarget* pull);
  // Copies the weights and versions into `params` and `versions`.
  void CopyOut(absl::Span<float> params, std::vector<int64_t>* versions) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const TrainingConfig config_;
  const std::vector<common::ShardRange> ranges_;

  mutable absl::Mutex mu_;
  std::vector<float> weights_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> versions_ ABSL_GUARDED_BY(mu_);
  std::vector<RecordedPush> pushes_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::Status> failures_ ABSL_GUARDED_BY(mu_);
  int64_t applied_samples_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t resume_at_ ABSL_GUARDED_BY(mu_) = -1;
  int reconnects_ ABSL_GUARDED_BY(mu_) = 0;
  bool repeat_next_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace monsoon::testutil

#endif  // MONSOON_TESTS_FAKE_PARAMETER_CLIENT_H_
