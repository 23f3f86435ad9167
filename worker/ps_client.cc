#include "worker/ps_client.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/onebit.h"
#include "common/socket_buffers.h"
#include "worker/shard_streams.h"

namespace monsoon::worker {

std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& address, absl::Duration peer_timeout,
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(common::kMaxMessageBytes);
  args.SetMaxSendMessageSize(common::kMaxMessageBytes);
  // A silent shard is pinged after half of peer_timeout and dropped when the
  // other half passes without an answer, also between calls.
  const int half_ms = static_cast<int>(
      std::max<int64_t>(1000, absl::ToInt64Milliseconds(peer_timeout) / 2));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, half_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, half_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Reconnect quickly while the servers start.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  common::SetUnixSocketBuffers(&args);
  return grpc::CreateCustomChannel(
      address,
      credentials != nullptr ? credentials : grpc::InsecureChannelCredentials(),
      args);
}

std::unique_ptr<PendingCall> PsClient::PullAsync(
    const std::vector<int64_t>& min_versions, absl::Duration timeout,
    absl::Span<float> params, std::vector<int64_t>* versions,
    bool params_hold_versions) {
  // What the shards may send differences from (pull_compression).
  std::vector<int64_t> held;
  if (params_hold_versions && pull_onebit() && worker_rank_ >= 0 &&
      versions->size() == static_cast<size_t>(num_shards())) {
    held = *versions;
  }
  auto calls = std::make_unique<ShardCalls>(
      num_shards(), stop_,
      NoteFor(
          log_every_, worker_rank_,
          absl::StrCat(
              "a pull of version ",
              *std::max_element(min_versions.begin(), min_versions.end()),
              config_.mode() == SYNC
                  ? " (the barrier of that step: the shards log the ranks it "
                    "waits for)"
                  : "")));
  if (config_.mode() == SYNC && worker_rank_ >= 0) {
    calls->WatchConnections(&shards_);
  }
  versions->assign(num_shards(), 0);
  for (int s = 0; s < num_shards(); ++s) {
    PullRequest request;
    request.set_worker_rank(worker_rank_);
    request.set_shard(s);
    request.set_min_version(min_versions[s]);
    if (worker_rank_ >= 0) request.set_session(session_);
    if (!held.empty()) request.set_have_version(held[s]);
    StartPullCall(shards_[s], calls.get(), s, request, timeout,
                  params.subspan(ranges_[s].begin, ranges_[s].size()),
                  &bytes_pulled_, &(*versions)[s],
                  config_.onebit_bucket_size());
  }
  return calls;
}

class ShardedPushImpl : public ShardedPush {
 public:
  ShardedPushImpl(PsClient* client, const std::vector<int64_t>& base_versions,
                  int64_t samples, int64_t sample_offset,
                  common::BufferLease* lease,
                  std::vector<PushResponse>* results, const PullTarget* pull)
      : client_(client),
        base_versions_(base_versions),
        samples_(samples),
        sample_offset_(sample_offset),
        lease_(lease),
        results_(results),
        calls_(client->num_shards(), client->stop_,
               NoteFor(
                   client->log_every_, client->worker_rank_,
                   absl::StrCat(
                       "the push of step ",
                       base_versions.empty()
                           ? 0
                           : *std::min_element(base_versions.begin(),
                                               base_versions.end()),
                       client->config_.mode() == SYNC
                           ? " (a sync step closes once every live worker has "
                             "pushed it: the shards log the ranks it waits for)"
                           : ""))),
        sent_(client->num_shards(), false),
        streams_(client->num_shards(), nullptr),
        open_(client->num_shards(), false),
        scratch_(client->num_shards()),
        responses_(client->num_shards(), nullptr),
        repeat_(client->repeat_next_push_.exchange(false)) {
    if (client->config_.mode() == SYNC && client->worker_rank_ >= 0) {
      calls_.WatchConnections(&client->shards_);
    }
    if (results_ != nullptr) {
      results_->assign(client->num_shards(), PushResponse());
    }
    if (pull != nullptr) {
      pull_ = *pull;
      pull_->versions->assign(client->num_shards(), 0);
      if (pull->params.size() != client->ranges_.back().end) {
        misuse_ = absl::InvalidArgumentError(absl::StrCat(
            "push-pull into ", pull->params.size(), " values for a model of ",
            client->ranges_.back().end, " parameters"));
      }
    }
    if (base_versions_.size() != sent_.size()) {
      misuse_ = absl::InvalidArgumentError(
          absl::StrCat("push with ", base_versions_.size(),
                       " base versions for ", sent_.size(), " shards"));
    }
  }

  ~ShardedPushImpl() override { Wait().IgnoreError(); }

  void Send(int shard, const ShardPayload& payload) override {
    Start(shard, payload, 0);
  }

  void SendFrom(int shard, const ShardPayload& payload,
                uint64_t from) override {
    if (payload.encoding != ENCODING_FLOAT32 || from == 0 ||
        from >= payload.values) {
      if (!Claim(shard)) return;
      return Fail(shard, absl::InvalidArgumentError(absl::StrCat(
                             "a push to shard ", shard, " of ",
                             payload.values, " values in ",
                             PushEncoding_Name(payload.encoding),
                             " sent from value ", from,
                             ": only float32 payloads go in parts, from a "
                             "value inside them")));
    }
    Start(shard, payload, from);
  }

  void Extend(int shard, uint64_t from) override {
    if (shard < 0 || static_cast<size_t>(shard) >= streams_.size() ||
        streams_[shard] == nullptr || !open_[shard]) {
      if (misuse_.ok()) {
        misuse_ = absl::InvalidArgumentError(absl::StrCat(
            "Extend of shard ", shard, ", which has no unfinished payload"));
      }
      return;
    }
    if (from == 0) open_[shard] = false;
    streams_[shard]->Extend(from);
  }

  absl::Status Wait() override {
    bool given_up = false;
    // A payload never finished: the shard must not take it.
    for (size_t s = 0; s < open_.size(); ++s) {
      if (!open_[s]) continue;
      open_[s] = false;
      streams_[s]->Cancel();
      given_up = true;
      if (misuse_.ok()) {
        misuse_ = absl::AbortedError(absl::StrCat(
            "the push to shard ", s, " was given up before its payload was "
            "final; the shard took none of it"));
      }
    }
    for (size_t s = 0; s < sent_.size(); ++s) {
      if (!sent_[s]) {
        given_up = true;
        sent_[s] = true;
        calls_.Done(static_cast<int>(s),
                    absl::FailedPreconditionError(absl::StrCat(
                        "push ended without a payload for shard ", s)));
      }
    }
    // A repeated step given up: the next push repeats it in its place.
    if (given_up && repeat_ && !waited_) {
      client_->repeat_next_push_.store(true);
    }
    absl::Status status = calls_.Wait();
    if (!waited_ && client_->worker_rank_ >= 0) {
      waited_ = true;
      for (size_t s = 0; s < responses_.size(); ++s) {
        // A stale answer (a sync step closed without the push) applied
        // nothing and holds nothing of it.
        if (responses_[s] != nullptr && !responses_[s]->stale() &&
            calls_.status(static_cast<int>(s)).ok()) {
          client_->NoteAcknowledged(static_cast<int>(s),
                                    sample_offset_ + samples_,
                                    responses_[s]->duplicate());
        }
      }
    }
    return misuse_.ok() ? status : misuse_;
  }

 private:
  // Send and SendFrom: shard's stream, with values [ready_from, n) final.
  void Start(int shard, const ShardPayload& payload, uint64_t ready_from) {
    if (!Claim(shard)) return;
    const TrainingConfig& config = client_->config_;
    const uint64_t n = client_->ranges_[shard].size();
    const int bucket = config.onebit_bucket_size();
    const PushEncoding encoding = common::PushEncodingFor(config);
    if (payload.encoding != encoding) {
      return Fail(shard,
                  absl::InvalidArgumentError(absl::StrCat(
                      "a push encoded as ", PushEncoding_Name(payload.encoding),
                      " from a client whose config pushes ",
                      PushEncoding_Name(encoding))));
    }
    const common::PayloadBytes bytes =
        common::PayloadBytesFor(encoding, n, bucket);
    if (payload.values != n || payload.data.size() != bytes.data ||
        payload.scales.size() != bytes.scales) {
      return Fail(
          shard,
          absl::InvalidArgumentError(absl::StrCat(
              "push to shard ", shard, " of ", payload.values, " values with ",
              payload.data.size(), " bytes of data and ", payload.scales.size(),
              " of scales; the shard holds ", n, " values, which need ",
              bytes.data, " and ", bytes.scales, " in ",
              PushEncoding_Name(encoding))));
    }
    PushHeader header;
    header.set_worker_rank(client_->worker_rank_);
    header.set_shard(shard);
    header.set_base_version(base_versions_[shard]);
    header.set_length(n);
    header.set_samples(samples_);
    header.set_sample_offset(sample_offset_);
    header.set_session(client_->session_);
    header.set_repeat(repeat_);
    if (repeat_) header.set_resume_point(client_->applied_samples_);
    header.set_encoding(encoding);
    if (encoding == ENCODING_ONEBIT) header.set_bucket_size(bucket);
    // The weights the answer may be a difference from (pull_compression).
    std::optional<int64_t> have;
    if (pull_.has_value() && pull_->holds_base_versions &&
        client_->pull_onebit()) {
      have = base_versions_[shard];
      header.set_have_version(*have);
    }
    // A response slot per shard; a scratch one when the caller wants none.
    // (The push keeps it: the ledger reads it after the calls are done.)
    PushResponse* response =
        results_ != nullptr ? &(*results_)[shard] : &scratch_[shard];
    responses_[shard] = response;
    const common::ShardRange range = client_->ranges_[shard];
    streams_[shard] = StartPushCall(
        client_->shards_[shard], &calls_, shard, std::move(header),
        Borrow(payload.data), Borrow(payload.scales),
        common::ChunkPlan(encoding, n, bucket,
                          static_cast<uint64_t>(config.chunk_bytes())),
        ready_from, common::Float32ChunkValues(config),
        pull_.has_value() ? pull_->timeout
                          : absl::Seconds(config.call_timeout_s()),
        response, &client_->bytes_pushed_, pull_.has_value(),
        pull_.has_value() ? pull_->params.subspan(range.begin, range.size())
                          : absl::Span<float>(),
        pull_.has_value() ? &(*pull_->versions)[shard] : nullptr,
        &client_->bytes_pulled_, have, bucket);
    open_[shard] = ready_from > 0;
  }

  // False (and the push fails) for a shard out of range or sent before.
  bool Claim(int shard) {
    if (shard < 0 || static_cast<size_t>(shard) >= sent_.size() ||
        sent_[shard]) {
      if (misuse_.ok()) {
        misuse_ = absl::InvalidArgumentError(
            absl::StrCat("shard ", shard, " is out of range or sent twice"));
      }
      return false;
    }
    sent_[shard] = true;
    if (!misuse_.ok()) {
      calls_.Done(shard, misuse_);
      return false;
    }
    return true;
  }

  void Fail(int shard, absl::Status status) { calls_.Done(shard, status); }

  grpc::Slice Borrow(absl::Span<const uint8_t> bytes) {
    if (bytes.empty()) return grpc::Slice();
    return lease_->Borrow(bytes.data(), bytes.size());
  }

  PsClient* const client_;
  const std::vector<int64_t> base_versions_;
  const int64_t samples_;
  const int64_t sample_offset_;
  common::BufferLease* const lease_;
  std::vector<PushResponse>* const results_;
  std::optional<PullTarget> pull_;
  ShardCalls calls_;
  std::vector<bool> sent_;
  // Each shard's stream, once sent; open_[s] while its payload is not all
  // final (SendFrom, until Extend from 0).
  std::vector<PushStream*> streams_;
  std::vector<bool> open_;
  // Each shard's answer when the caller wants none, and where each shard's
  // answer is, once sent; counted in the client's ledger once.
  std::vector<PushResponse> scratch_;
  std::vector<PushResponse*> responses_;
  bool waited_ = false;
  const bool repeat_;  // PushHeader.repeat
  absl::Status misuse_;
};

std::unique_ptr<ShardedPush> PsClient::StartPush(
    const std::vector<int64_t>& base_versions, int64_t samples,
    int64_t sample_offset, common::BufferLease* lease,
    std::vector<PushResponse>* results, const PullTarget* pull) {
  return std::make_unique<ShardedPushImpl>(this, base_versions, samples,
                                           sample_offset, lease, results, pull);
}

absl::Status PsClient::Push(absl::Span<const float> grads,
                            const std::vector<int64_t>& base_versions,
                            int64_t samples,
                            std::vector<PushResponse>* results) {
  if (grads.size() != ranges_.back().end) {
    return absl::InvalidArgumentError(
        absl::StrCat("push of ", grads.size(), " values to a model of ",
                     ranges_.back().end, " parameters"));
  }
  if (common::PushEncodingFor(config_) != ENCODING_FLOAT32) {
    return absl::InvalidArgumentError(
        "PsClient::Push sends float32; this config pushes 1-bit payloads, "
        "which GradientPusher prepares");
  }
  common::BufferLease lease;
  absl::Status status;
  {
    std::unique_ptr<ShardedPush> push =
        StartPush(base_versions, samples, next_sample_offset_, &lease, results);
    next_sample_offset_ += samples;
    for (int s = 0; s < num_shards(); ++s) {
      const absl::Span<const float> slice =
          grads.subspan(ranges_[s].begin, ranges_[s].size());
      ShardPayload payload;
      payload.values = slice.size();
      payload.data =
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(slice.data()),
                              slice.size() * sizeof(float));
      push->Send(s, payload);
    }
    status = push->Wait();
  }
  if (!lease.AwaitReleased(absl::Seconds(60))) {
    // gRPC still holds the caller's memory: returning would let it go.
    return absl::InternalError(
        "gRPC still held the pushed values 60 s after the push ended");
  }
  return status;
}

void PsClient::NoteAcknowledged(int s, int64_t end, bool duplicate) {
  absl::MutexLock lock(&ledger_mu_);
  if (acknowledged_end_.size() != shards_.size()) {
    acknowledged_end_.assign(shards_.size(), 0);
    acknowledged_pushes_.assign(shards_.size(), {});
  }
  acknowledged_end_[s] = std::max(acknowledged_end_[s], end);
  if (duplicate) {
    ++ledger_.updates_answered_as_duplicate;
    return;
  }
  ++ledger_.updates_acknowledged;
  std::deque<int64_t>& pushes = acknowledged_pushes_[s];
  pushes.push_back(end);
  if (pushes.size() > kLedgerPushes) pushes.pop_front();
}

void PsClient::NoteResumed(int s, int64_t position) {
  int64_t examples = 0;
  int64_t updates = 0;
  int64_t acknowledged_end = 0;
  {
    absl::MutexLock lock(&ledger_mu_);
    if (static_cast<size_t>(s) >= acknowledged_end_.size()) return;
    acknowledged_end = acknowledged_end_[s];
    if (acknowledged_end_[s] > position) {
      examples = acknowledged_end_[s] - position;
      ledger_.examples_lost += examples;
      acknowledged_end_[s] = position;
    }
    std::deque<int64_t>& pushes = acknowledged_pushes_[s];
    while (!pushes.empty() && pushes.back() > position) {
      ++updates;
      pushes.pop_back();
    }
    ledger_.updates_lost += updates;
  }
  if (updates > 0 || examples > 0) {
    // Not silent: what the shard had acknowledged and no longer has.
    common::LogError(
        "%s %d: shard %d at %s no longer has %d update(s) it acknowledged "
        "(this rank's examples %d to %d): it went back to an older copy (a "
        "restart from its checkpoint, or both copies of a replicated range "
        "lost); they are lost, and training goes on from there",
        worker_rank_ >= 0 ? "worker" : "evaluator", std::max(worker_rank_, 0),
        s, shards_[s].address, updates, position, acknowledged_end);
  }
}

ReplicaLedger PsClient::ledger() const {
  absl::MutexLock lock(&ledger_mu_);
  return ledger_;
}

absl::StatusOr<std::vector<StatsResponse>> PsClient::Stats(
    absl::Duration timeout) {
  std::vector<StatsResponse> stats(num_shards());
  for (int s = 0; s < num_shards(); ++s) {
    grpc::ClientContext context;
    shards_[s].Prepare(&context);
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    StatsRequest request;
    request.set_shard(s);  // the process may hold a second range
    grpc::Status status = shards_[s].stub->Stats(&context, request, &stats[s]);
    if (!status.ok()) {
      return Annotate(common::ToAbslStatus(status), s, shards_[s].address);
    }
    if (!OnlyBacksUp(stats[s])) continue;
    // That process no longer serves the range (it was taken over while
    // this client made no call that would have followed it): the range's
    // other process does, whose figures these are.
    Shard other = OtherProcessOf(s);
    grpc::ClientContext asked;
    other.Prepare(&asked);
    asked.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    StatsResponse served;
    if (other.stub->Stats(&asked, request, &served).ok() &&
        served.shard() == s &&
        (served.replica_role() == StatsResponse::PRIMARY ||
         served.replica_role() == StatsResponse::DEGRADED)) {
      stats[s] = std::move(served);
    }
  }
  return stats;
}

}  // namespace monsoon::worker
