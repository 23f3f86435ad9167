#include "worker/ps_client.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "common/config.h"
#include "common/float_bytes.h"
#include "common/grpc_status.h"
#include "common/onebit.h"

namespace monsoon::worker {
namespace {

constexpr int kMaxMessageBytes = 8 << 20;

// Collects one status per shard and wakes Wait() when all are in.
class ShardCalls : public PendingCall {
 public:
  explicit ShardCalls(int shards) : statuses_(shards), pending_(shards) {}

  // Called once per shard, from any thread.
  void Done(int shard, absl::Status status) {
    statuses_[shard] = std::move(status);
    pending_.DecrementCount();
  }

  absl::Status Wait() override {
    if (!waited_) {
      pending_.Wait();
      waited_ = true;
      calls_.clear();  // every reactor has reached OnDone
    }
    for (const absl::Status& status : statuses_) {
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }

  // Keeps a shard's reactor alive until Wait().
  template <typename T>
  T* Own(std::unique_ptr<T> call) {
    T* raw = call.get();
    calls_.push_back(std::shared_ptr<void>(std::move(call)));
    return raw;
  }

  ~ShardCalls() override { Wait().IgnoreError(); }

 private:
  std::vector<absl::Status> statuses_;  // slot s written by shard s's call
  absl::BlockingCounter pending_;
  bool waited_ = false;
  std::vector<std::shared_ptr<void>> calls_;
};

absl::Status Annotate(const absl::Status& status, int shard,
                      const std::string& address) {
  if (status.ok()) return status;
  return absl::Status(
      status.code(),
      absl::StrCat("shard ", shard, " at ", address, ": ", status.message()));
}

// Streams one shard's push, already cut into chunks.
class PushCall : public grpc::ClientWriteReactor<PushChunk> {
 public:
  PushCall(ParameterService::Stub* stub, ShardCalls* calls, int shard,
           const std::string& address, std::vector<PushChunk> chunks,
           PushResponse* response)
      : calls_(calls),
        shard_(shard),
        address_(address),
        chunks_(std::move(chunks)),
        response_(response) {
    stub->async()->Push(&context_, response_, this);
    StartWrite(&chunks_[0]);
    StartCall();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return;  // the server ended the call; OnDone has its status
    if (++next_ < chunks_.size()) {
      StartWrite(&chunks_[next_]);
    } else {
      StartWritesDone();
    }
  }

  void OnDone(const grpc::Status& status) override {
    calls_->Done(shard_,
                 Annotate(common::ToAbslStatus(status), shard_, address_));
  }

 private:
  grpc::ClientContext context_;
  ShardCalls* const calls_;
  const int shard_;
  const std::string address_;
  const std::vector<PushChunk> chunks_;  // never empty
  PushResponse* const response_;
  size_t next_ = 0;
};

// Receives one shard's slice of the weights.
class PullCall : public grpc::ClientReadReactor<PullChunk> {
 public:
  PullCall(ParameterService::Stub* stub, ShardCalls* calls, int shard,
           const std::string& address, const PullRequest& request,
           absl::Duration timeout, absl::Span<float> out,
           std::atomic<int64_t>* bytes, int64_t* version)
      : calls_(calls),
        shard_(shard),
        address_(address),
        request_(request),
        out_(out),
        bytes_(bytes),
        version_(version) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    stub->async()->Pull(&context_, &request_, this);
    StartRead(&chunk_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // end of stream; OnDone follows
    if (error_.ok()) error_ = Take();
    if (!error_.ok()) context_.TryCancel();
    StartRead(&chunk_);
  }

  void OnDone(const grpc::Status& status) override {
    absl::Status result = error_;
    if (result.ok()) result = common::ToAbslStatus(status);
    if (result.ok() && received_ != out_.size()) {
      result = absl::DataLossError(absl::StrCat(
          "pull ended after ", received_, " of ", out_.size(), " values"));
    }
    calls_->Done(shard_, Annotate(result, shard_, address_));
  }

 private:
  absl::Status Take() {
    bytes_->fetch_add(static_cast<int64_t>(chunk_.ByteSizeLong()));
    if (chunk_.offset() != received_ || chunk_.data().size() % 4 != 0 ||
        chunk_.data().size() / 4 > out_.size() - received_) {
      return absl::DataLossError(
          absl::StrCat("malformed pull chunk at offset ", chunk_.offset(),
                       " with ", chunk_.data().size(), " bytes (", received_,
                       " of ", out_.size(), " values received)"));
    }
    if (received_ == 0) {
      *version_ = chunk_.version();
    } else if (chunk_.version() != *version_) {
      return absl::DataLossError("pull chunks of different versions");
    }
    common::CopyBytesToFloats(chunk_.data(), out_.data() + received_);
    received_ += chunk_.data().size() / 4;
    return absl::OkStatus();
  }

  grpc::ClientContext context_;
  ShardCalls* const calls_;
  const int shard_;
  const std::string address_;
  const PullRequest request_;
  const absl::Span<float> out_;
  std::atomic<int64_t>* const bytes_;
  int64_t* const version_;
  PullChunk chunk_;
  size_t received_ = 0;
  absl::Status error_;
};

}  // namespace

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Reconnect quickly while the servers start.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   args);
}

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Connect(
    const PsClientOptions& options) {
  if (options.server_addresses.empty()) {
    return absl::InvalidArgumentError(
        "no parameter servers given (--servers=host:port,...)");
  }
  std::unique_ptr<PsClient> client(new PsClient());
  client->config_ = options.config;
  client->worker_rank_ = options.worker_rank;
  client->chunk_values_ =
      static_cast<size_t>(options.config.chunk_bytes()) / sizeof(float);
  client->addresses_ = options.server_addresses;
  const int shards = static_cast<int>(options.server_addresses.size());
  const uint64_t params =
      common::ModelLayout::FromConfig(options.config).num_params();
  const uint64_t fingerprint = common::ConfigFingerprint(options.config);
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  for (int s = 0; s < shards; ++s) {
    const std::string& address = options.server_addresses[s];
    client->stubs_.push_back(ParameterService::NewStub(MakeChannel(address)));
    RegisterRequest request;
    request.set_worker_rank(options.worker_rank);
    request.set_shard(s);
    request.set_config_fingerprint(fingerprint);
    RegisterResponse response;
    absl::Duration backoff = absl::Milliseconds(100);
    while (true) {
      grpc::ClientContext context;
      context.set_wait_for_ready(true);
      context.set_deadline(absl::ToChronoTime(deadline));
      grpc::Status status =
          client->stubs_[s]->Register(&context, request, &response);
      if (status.ok()) break;
      const bool retry = status.error_code() == grpc::StatusCode::UNAVAILABLE &&
                         absl::Now() + backoff < deadline;
      if (!retry) {
        if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
            status.error_code() == grpc::StatusCode::UNAVAILABLE) {
          return absl::UnavailableError(absl::StrCat(
              "could not reach parameter server shard ", s, " at ", address,
              " within ", absl::FormatDuration(options.connect_timeout), " (",
              status.error_message(),
              "): is ps_server running there, and --servers in shard order?"));
        }
        return Annotate(common::ToAbslStatus(status), s, address);
      }
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Seconds(2));
    }
    const common::ShardRange expected =
        common::ShardRangeFor(params, shards, s);
    if (response.num_shards() != shards ||
        response.offset() != expected.begin ||
        response.length() != expected.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", s, " at ", address, " serves [", response.offset(), ", ",
          response.offset() + response.length(), ") of ", response.num_shards(),
          " shards, but this worker expects [", expected.begin, ", ",
          expected.end, ") of ", shards,
          ": check --servers and the servers' --num_shards"));
    }
    client->ranges_.push_back(expected);
    client->initial_versions_.push_back(response.version());
    client->applied_samples_ =
        s == 0 ? response.samples_applied()
               : std::min(client->applied_samples_, response.samples_applied());
  }
  return client;
}

std::unique_ptr<PendingCall> PsClient::PullAsync(
    int64_t min_version, absl::Duration timeout, absl::Span<float> params,
    std::vector<int64_t>* versions) {
  auto calls = std::make_unique<ShardCalls>(num_shards());
  versions->assign(num_shards(), 0);
  for (int s = 0; s < num_shards(); ++s) {
    PullRequest request;
    request.set_worker_rank(worker_rank_);
    request.set_shard(s);
    request.set_min_version(min_version);
    calls->Own(std::make_unique<PullCall>(
        stubs_[s].get(), calls.get(), s, addresses_[s], request, timeout,
        params.subspan(ranges_[s].begin, ranges_[s].size()), &bytes_pulled_,
        &(*versions)[s]));
  }
  return calls;
}

absl::Status PsClient::Pull(int64_t min_version, absl::Duration timeout,
                            absl::Span<float> params,
                            std::vector<int64_t>* versions) {
  return PullAsync(min_version, timeout, params, versions)->Wait();
}

std::vector<PushChunk> PsClient::Seal(std::vector<PushChunk> chunks,
                                      PushHeader header) {
  *chunks[0].mutable_header() = std::move(header);
  for (const PushChunk& chunk : chunks) {
    bytes_pushed_.fetch_add(static_cast<int64_t>(chunk.ByteSizeLong()));
  }
  return chunks;
}

PushHeader PsClient::Header(int shard, int64_t base_version,
                            int64_t samples) const {
  PushHeader header;
  header.set_worker_rank(worker_rank_);
  header.set_shard(shard);
  header.set_base_version(base_version);
  header.set_length(ranges_[shard].size());
  header.set_samples(samples);
  if (config_.compression() == COMPRESSION_ONEBIT) {
    header.set_encoding(ENCODING_ONEBIT);
    header.set_bucket_size(config_.onebit_bucket_size());
  }
  return header;
}

std::vector<PushChunk> PsClient::EncodeShard(int shard,
                                             absl::Span<const float> values,
                                             PushHeader header) {
  if (header.encoding() != ENCODING_FLOAT32) {
    // Quantize v = g + residual, bucket by bucket within this shard's slice.
    const common::ShardRange range = ranges_[shard];
    // Allocated on first use: a worker whose backend quantizes on the
    // device (GradientPusher) never needs it.
    if (residual_.empty()) residual_.assign(ranges_.back().end, 0.0f);
    common::OneBitEncoded encoded;
    common::OneBitEncode(
        values, absl::MakeSpan(residual_).subspan(range.begin, range.size()),
        config_.onebit_bucket_size(), &encoded);
    return ChunkOneBit(values.size(), encoded, std::move(header));
  }
  std::vector<PushChunk> chunks;
  for (size_t sent = 0; sent < values.size() || chunks.empty();) {
    const size_t n = std::min(chunk_values_, values.size() - sent);
    PushChunk& chunk = chunks.emplace_back();
    chunk.set_offset(sent);
    common::AppendFloatBytes(values.subspan(sent, n), chunk.mutable_data());
    sent += n;
  }
  return Seal(std::move(chunks), std::move(header));
}

std::vector<PushChunk> PsClient::ChunkOneBit(
    uint64_t n, const common::OneBitEncoded& encoded, PushHeader header) {
  const int bucket = config_.onebit_bucket_size();
  const uint64_t bucket_bytes = (bucket + 7) / 8 + 2 * sizeof(float);
  const uint64_t per_chunk = std::max<uint64_t>(
      1, static_cast<uint64_t>(config_.chunk_bytes()) / bucket_bytes);
  const uint64_t buckets = common::OneBitBuckets(n, bucket);
  std::vector<PushChunk> chunks;
  size_t bits_at = 0;
  for (uint64_t b = 0; b < buckets || chunks.empty(); b += per_chunk) {
    const uint64_t count = std::min(per_chunk, buckets - b);
    const uint64_t first = b * bucket;
    const uint64_t values = std::min<uint64_t>(n - first, count * bucket);
    const uint64_t bits = common::OneBitBitsBytes(values, bucket);
    PushChunk& chunk = chunks.emplace_back();
    chunk.set_offset(first);
    chunk.set_data(encoded.bits.substr(bits_at, bits));
    chunk.set_scales(encoded.scales.substr(b * 2 * sizeof(float),
                                           count * 2 * sizeof(float)));
    bits_at += bits;
  }
  return Seal(std::move(chunks), std::move(header));
}

class ShardedPushImpl : public ShardedPush {
 public:
  ShardedPushImpl(PsClient* client, const std::vector<int64_t>& base_versions,
                  int64_t samples, std::vector<PushResponse>* results)
      : client_(client),
        base_versions_(base_versions),
        samples_(samples),
        results_(results),
        calls_(client->num_shards()),
        sent_(client->num_shards(), false) {
    if (results_ != nullptr) {
      results_->assign(client->num_shards(), PushResponse());
    }
    if (base_versions_.size() != sent_.size()) {
      misuse_ = absl::InvalidArgumentError(
          absl::StrCat("push with ", base_versions_.size(),
                       " base versions for ", sent_.size(), " shards"));
    }
  }

  ~ShardedPushImpl() override { Wait().IgnoreError(); }

  void Send(int shard, absl::Span<const float> slice) override {
    if (!Claim(shard)) return;
    if (slice.size() != client_->ranges_[shard].size()) {
      Fail(shard, absl::InvalidArgumentError(absl::StrCat(
                      "push of ", slice.size(), " values to shard ", shard,
                      ", which holds ", client_->ranges_[shard].size())));
      return;
    }
    Start(shard, client_->EncodeShard(shard, slice, Header(shard)));
  }

  void SendOneBit(int shard, const common::OneBitEncoded& encoded) override {
    if (!Claim(shard)) return;
    const TrainingConfig& config = client_->config_;
    const uint64_t n = client_->ranges_[shard].size();
    const int bucket = config.onebit_bucket_size();
    if (config.compression() != COMPRESSION_ONEBIT) {
      Fail(shard, absl::InvalidArgumentError(
                      "a 1-bit push from a client whose config does not use "
                      "1-bit compression"));
      return;
    }
    if (encoded.bits.size() != common::OneBitBitsBytes(n, bucket) ||
        encoded.scales.size() !=
            common::OneBitBuckets(n, bucket) * 2 * sizeof(float)) {
      Fail(shard, absl::InvalidArgumentError(absl::StrCat(
                      "1-bit push to shard ", shard, " of ", n,
                      " values in buckets of ", bucket, " needs ",
                      common::OneBitBitsBytes(n, bucket), " bytes of bits and ",
                      common::OneBitBuckets(n, bucket) * 2 * sizeof(float),
                      " of scales, got ", encoded.bits.size(), " and ",
                      encoded.scales.size())));
      return;
    }
    Start(shard, client_->ChunkOneBit(n, encoded, Header(shard)));
  }

  // Fails every shard not yet sent with `status`, sending nothing more.
  void FailAll(absl::Status status) {
    if (misuse_.ok()) misuse_ = std::move(status);
  }

  absl::Status Wait() override {
    for (size_t s = 0; s < sent_.size(); ++s) {
      if (!sent_[s]) {
        sent_[s] = true;
        calls_.Done(static_cast<int>(s),
                    absl::FailedPreconditionError(absl::StrCat(
                        "push ended without a slice for shard ", s)));
      }
    }
    absl::Status status = calls_.Wait();
    return misuse_.ok() ? status : misuse_;
  }

 private:
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

  PushHeader Header(int shard) const {
    return client_->Header(shard, base_versions_[shard], samples_);
  }

  void Start(int shard, std::vector<PushChunk> chunks) {
    // A response slot per shard; a scratch one when the caller wants none.
    PushResponse* response = results_ != nullptr
                                 ? &(*results_)[shard]
                                 : calls_.Own(std::make_unique<PushResponse>());
    calls_.Own(std::make_unique<PushCall>(client_->stubs_[shard].get(), &calls_,
                                          shard, client_->addresses_[shard],
                                          std::move(chunks), response));
  }

  PsClient* const client_;
  const std::vector<int64_t> base_versions_;
  const int64_t samples_;
  std::vector<PushResponse>* const results_;
  ShardCalls calls_;
  std::vector<bool> sent_;
  absl::Status misuse_;
};

std::unique_ptr<ShardedPush> PsClient::StartPush(
    const std::vector<int64_t>& base_versions, int64_t samples,
    std::vector<PushResponse>* results) {
  return std::make_unique<ShardedPushImpl>(this, base_versions, samples,
                                           results);
}

std::unique_ptr<PendingCall> PsClient::PushAsync(
    absl::Span<const float> grads, const std::vector<int64_t>& base_versions,
    int64_t samples, std::vector<PushResponse>* results) {
  auto push =
      std::make_unique<ShardedPushImpl>(this, base_versions, samples, results);
  if (grads.size() != ranges_.back().end) {
    push->FailAll(absl::InvalidArgumentError(
        absl::StrCat("push of ", grads.size(), " values to a model of ",
                     ranges_.back().end, " parameters")));
    return push;
  }
  for (int s = 0; s < num_shards(); ++s) {
    push->Send(s, grads.subspan(ranges_[s].begin, ranges_[s].size()));
  }
  return push;
}

absl::Status PsClient::Push(absl::Span<const float> grads,
                            const std::vector<int64_t>& base_versions,
                            int64_t samples,
                            std::vector<PushResponse>* results) {
  return PushAsync(grads, base_versions, samples, results)->Wait();
}

absl::StatusOr<std::vector<StatsResponse>> PsClient::Stats(
    absl::Duration timeout) {
  std::vector<StatsResponse> stats(num_shards());
  for (int s = 0; s < num_shards(); ++s) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    grpc::Status status = stubs_[s]->Stats(&context, StatsRequest(), &stats[s]);
    if (!status.ok()) {
      return Annotate(common::ToAbslStatus(status), s, addresses_[s]);
    }
  }
  return stats;
}

}  // namespace monsoon::worker
