#include "tests/fake_parameter_client.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace monsoon::testutil {
namespace {

std::vector<common::ShardRange> RangesFor(uint64_t params, int shards) {
  std::vector<common::ShardRange> ranges;
  for (int s = 0; s < shards; ++s) {
    ranges.push_back(common::ShardRangeFor(params, shards, s));
  }
  return ranges;
}

class DoneCall : public worker::PendingCall {
 public:
  explicit DoneCall(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait() override { return status_; }

 private:
  const absl::Status status_;
};

}  // namespace

// Collects each shard's float32 payload; Wait applies the whole push.
class FakeParameterClient::Push : public worker::ShardedPush {
 public:
  Push(FakeParameterClient* client, RecordedPush record,
       std::vector<PushResponse>* results, const worker::PullTarget* pull)
      : client_(client),
        record_(std::move(record)),
        results_(results),
        gradient_(client->ranges_.back().end, 0.0f),
        sent_(client->num_shards(), false) {
    if (pull != nullptr) pull_ = *pull;
  }

  void Send(int shard, const worker::ShardPayload& payload) override {
    const common::ShardRange& range = client_->ranges_[shard];
    if (payload.encoding != ENCODING_FLOAT32 ||
        payload.values != range.size() ||
        payload.data.size() != range.size() * sizeof(float)) {
      error_ = absl::InvalidArgumentError(
          absl::StrCat("the fake takes whole float32 payloads; shard ", shard,
                       " got ", payload.values, " values"));
      return;
    }
    std::memcpy(gradient_.data() + range.begin, payload.data.data(),
                payload.data.size());
    sent_[shard] = true;
  }

  // Takes each part's values when it is said to be final, as the real
  // client streams them then; the shard counts as sent once all are.
  void SendFrom(int shard, const worker::ShardPayload& payload,
                uint64_t from) override {
    const common::ShardRange& range = client_->ranges_[shard];
    if (payload.encoding != ENCODING_FLOAT32 ||
        payload.values != range.size() || from == 0 || from >= range.size()) {
      error_ = absl::InvalidArgumentError(absl::StrCat(
          "the fake takes float32 parts from inside the range; shard ", shard,
          " got ", payload.values, " values from ", from));
      return;
    }
    parts_[shard] = {reinterpret_cast<const float*>(payload.data.data()),
                     range.size()};
    Take(shard, from);
  }

  void Extend(int shard, uint64_t from) override {
    if (parts_.count(shard) == 0) {
      error_ = absl::InvalidArgumentError(
          absl::StrCat("Extend of shard ", shard, " without SendFrom"));
      return;
    }
    Take(shard, from);
  }

  absl::Status Wait() override {
    if (!error_.ok()) return error_;
    for (const auto& [shard, part] : parts_) {
      if (part.taken_from != 0) {
        return absl::AbortedError(absl::StrCat(
            "the push to shard ", shard, " was given up before its payload "
            "was final"));
      }
    }
    for (size_t s = 0; s < sent_.size(); ++s) {
      if (!sent_[s]) {
        return absl::FailedPreconditionError(
            absl::StrCat("shard ", s, " was never sent its payload"));
      }
    }
    return client_->Finish(record_, gradient_, results_,
                           pull_.has_value() ? &*pull_ : nullptr);
  }

 private:
  FakeParameterClient* const client_;
  const RecordedPush record_;
  std::vector<PushResponse>* const results_;
  std::optional<worker::PullTarget> pull_;
  std::vector<float> gradient_;
  // A payload sent in parts: its values, and where those taken begin.
  struct Part {
    const float* values = nullptr;
    uint64_t taken_from = 0;
  };
  void Take(int shard, uint64_t from) {
    Part& part = parts_[shard];
    if (from >= part.taken_from) return;
    const uint64_t begin = client_->ranges_[shard].begin;
    std::memcpy(gradient_.data() + begin + from, part.values + from,
                (part.taken_from - from) * sizeof(float));
    part.taken_from = from;
    if (from == 0) sent_[shard] = true;
  }

  std::vector<bool> sent_;
  std::map<int, Part> parts_;
  absl::Status error_;
};

FakeParameterClient::FakeParameterClient(const TrainingConfig& config,
                                         int num_shards,
                                         std::vector<float> initial)
    : config_(config),
      ranges_(RangesFor(initial.size(), num_shards)),
      weights_(std::move(initial)),
      versions_(num_shards, 0) {}

void FakeParameterClient::FailNextPushes(std::vector<absl::Status> statuses) {
  absl::MutexLock lock(&mu_);
  for (absl::Status& status : statuses) failures_.push_back(std::move(status));
}

void FakeParameterClient::SetAppliedSamples(int64_t applied_samples) {
  absl::MutexLock lock(&mu_);
  applied_samples_ = applied_samples;
}

void FakeParameterClient::ResumeAtNextReconnect(int64_t applied_samples) {
  absl::MutexLock lock(&mu_);
  resume_at_ = applied_samples;
}

std::vector<FakeParameterClient::RecordedPush> FakeParameterClient::pushes()
    const {
  absl::MutexLock lock(&mu_);
  return pushes_;
}

int FakeParameterClient::reconnects() const {
  absl::MutexLock lock(&mu_);
  return reconnects_;
}

std::vector<float> FakeParameterClient::weights() const {
  absl::MutexLock lock(&mu_);
  return weights_;
}

std::vector<int64_t> FakeParameterClient::versions() const {
  absl::MutexLock lock(&mu_);
  return versions_;
}

int64_t FakeParameterClient::applied_samples() const {
  absl::MutexLock lock(&mu_);
  return applied_samples_;
}

void FakeParameterClient::CopyOut(absl::Span<float> params,
                                  std::vector<int64_t>* versions) const {
  std::copy(weights_.begin(), weights_.end(), params.begin());
  *versions = versions_;
}

std::unique_ptr<worker::PendingCall> FakeParameterClient::PullAsync(
    const std::vector<int64_t>& min_versions, absl::Duration /*timeout*/,
    absl::Span<float> params, std::vector<int64_t>* versions,
    bool /*params_hold_versions*/) {
  absl::MutexLock lock(&mu_);
  for (int s = 0; s < num_shards(); ++s) {
    if (min_versions[s] > versions_[s]) {
      // Nothing else would ever advance it: a fake cannot wait.
      return std::make_unique<DoneCall>(absl::DeadlineExceededError(
          absl::StrCat("fake shard ", s, " is at version ", versions_[s],
                       ", not ", min_versions[s])));
    }
  }
  if (params.size() != weights_.size()) {
    return std::make_unique<DoneCall>(
        absl::InvalidArgumentError("pull into a buffer of another size"));
  }
  CopyOut(params, versions);
  return std::make_unique<DoneCall>(absl::OkStatus());
}

std::unique_ptr<worker::ShardedPush> FakeParameterClient::StartPush(
    const std::vector<int64_t>& base_versions, int64_t samples,
    int64_t sample_offset, common::BufferLease* /*lease*/,
    std::vector<PushResponse>* results, const worker::PullTarget* pull) {
  RecordedPush record;
  record.base_versions = base_versions;
  record.samples = samples;
  record.sample_offset = sample_offset;
  {
    absl::MutexLock lock(&mu_);
    record.repeat = repeat_next_;
    repeat_next_ = false;
  }
  return std::make_unique<Push>(this, std::move(record), results, pull);
}

absl::Status FakeParameterClient::Finish(const RecordedPush& push,
                                         const std::vector<float>& gradient,
                                         std::vector<PushResponse>* results,
                                         const worker::PullTarget* pull) {
  absl::MutexLock lock(&mu_);
  RecordedPush recorded = push;
  if (!failures_.empty()) {
    absl::Status failure = std::move(failures_.front());
    failures_.pop_front();
    pushes_.push_back(recorded);
    return failure;
  }
  const float rate = config_.learning_rate();
  for (size_t i = 0; i < weights_.size(); ++i) {
    weights_[i] -= rate * gradient[i];
  }
  if (results != nullptr) results->assign(num_shards(), PushResponse());
  for (int s = 0; s < num_shards(); ++s) {
    ++versions_[s];
    if (results != nullptr) (*results)[s].set_version(versions_[s]);
  }
  applied_samples_ =
      std::max(applied_samples_, push.sample_offset + push.samples);
  recorded.applied = true;
  pushes_.push_back(recorded);
  if (pull != nullptr) CopyOut(pull->params, pull->versions);
  return absl::OkStatus();
}

absl::Status FakeParameterClient::Reconnect(absl::Duration /*timeout*/,
                                            absl::Duration /*log_every*/) {
  absl::MutexLock lock(&mu_);
  ++reconnects_;
  if (resume_at_ >= 0) applied_samples_ = resume_at_;
  resume_at_ = -1;
  repeat_next_ = true;
  return absl::OkStatus();
}

}  // namespace monsoon::testutil
