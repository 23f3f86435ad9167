#include "worker/ps_client.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/auth.h"
#include "common/config.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/onebit.h"

namespace monsoon::worker {
namespace {

using Bidi = grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

// What a wait that goes on is logged as: every `every` (zero: never),
// "<who>: waiting <time> for shard(s) <pending> to answer <what>".
struct WaitNote {
  absl::Duration every;
  std::string who;
  std::string what;
};

WaitNote NoteFor(absl::Duration every, int rank, std::string what) {
  return WaitNote{
      every,
      rank >= 0 ? absl::StrCat("worker ", rank) : std::string("evaluator"),
      std::move(what)};
}

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
  void WatchConnections(const std::vector<PsClient::Shard>* shards) {
    shards_ = shards;
  }

  // A shard's call to cancel if the stop notification comes.
  void Cancellable(grpc::ClientContext* context) {
    std::lock_guard<std::mutex> lock(mu_);
    contexts_.push_back(context);
  }

  absl::Status Wait() override {
    if (!waited_) {
      std::unique_lock<std::mutex> lock(mu_);
      bool cancelled = false;
      const absl::Time start = absl::Now();
      absl::Time last_log = start;
      while (pending_ > 0) {
        // Checks the stop notification every 100 ms while calls run.
        done_.wait_for(lock, std::chrono::milliseconds(100));
        if (!cancelled && stop_ != nullptr && stop_->HasBeenNotified()) {
          cancelled = true;
          for (grpc::ClientContext* context : contexts_) context->TryCancel();
        }
        if (!cancelled && shards_ != nullptr && pending_ > 0) {
          for (size_t s = 0; s < answered_.size(); ++s) {
            if (!answered_[s]) continue;
            const grpc_connectivity_state state =
                (*shards_)[s].channel->GetState(/*try_to_connect=*/false);
            if (state == GRPC_CHANNEL_READY) continue;
            cancelled = true;
            lost_ = absl::UnavailableError(absl::StrCat(
                "shard ", s, " at ", (*shards_)[s].address,
                " lost its connection after it answered, while other shards "
                "had not (it may have restarted from a checkpoint without "
                "this step)"));
            for (grpc::ClientContext* context : contexts_) context->TryCancel();
            break;
          }
        }
        const absl::Time now = absl::Now();
        if (pending_ > 0 && note_.every > absl::ZeroDuration() &&
            now - last_log >= note_.every) {
          std::vector<int> pending;
          for (size_t s = 0; s < answered_.size(); ++s) {
            if (!answered_[s]) pending.push_back(static_cast<int>(s));
          }
          common::LogWarning("%s: waiting %.0f s for shard(s) %s to answer %s",
                             note_.who, absl::ToDoubleSeconds(now - start),
                             absl::StrJoin(pending, ","), note_.what);
          last_log = now;
        }
      }
      lock.unlock();
      waited_ = true;
      calls_.clear();  // every reactor has reached OnDone
    }
    if (!lost_.ok()) return lost_;
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
  std::vector<bool> answered_;          // guarded by mu_
  std::mutex mu_;
  std::condition_variable done_;
  int pending_;                                 // guarded by mu_
  std::vector<grpc::ClientContext*> contexts_;  // guarded by mu_
  const absl::Notification* const stop_;
  const WaitNote note_;
  const std::vector<PsClient::Shard>* shards_ = nullptr;
  absl::Status lost_;  // written and read by the waiting thread only
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

// Takes one shard's weights out of PullChunk messages, straight into the
// caller's span; or, where `have` says which version the span holds, 1-bit
// differences from it (pull_compression), decoded and added in place.
class PullReceiver {
 public:
  PullReceiver(absl::Span<float> out, int64_t* version,
               std::atomic<int64_t>* bytes,
               std::optional<int64_t> have = std::nullopt, int bucket_size = 1)
      : out_(out),
        version_(version),
        bytes_(bytes),
        have_(have),
        bucket_size_(bucket_size) {}

  // Copies one message's values into place; `push` (if not null) gets the
  // PushPull answer the first chunk carries.
  absl::Status Take(const grpc::ByteBuffer& message, PushResponse* push) {
    absl::Status parsed = reader_.ParsePullChunk(message, &chunk_);
    bytes_->fetch_add(static_cast<int64_t>(chunk_.message_bytes));
    if (!parsed.ok()) return absl::DataLossError(parsed.message());
    if (chunk_.encoding == ENCODING_ONEBIT) return TakeDelta(push);
    if (chunk_.encoding != ENCODING_FLOAT32) {
      return absl::DataLossError(absl::StrCat("pull chunk in encoding ",
                                              chunk_.encoding,
                                              ", which this worker "
                                              "does not know"));
    }
    if (delta_) {
      return absl::DataLossError("pull mixes float32 and 1-bit chunks");
    }
    const uint64_t n = chunk_.data.size() / sizeof(float);
    if (chunk_.offset != received_ || chunk_.data.size() % 4 != 0 ||
        n > out_.size() - received_) {
      return absl::DataLossError(
          absl::StrCat("malformed pull chunk at offset ", chunk_.offset,
                       " with ", chunk_.data.size(), " bytes (", received_,
                       " of ", out_.size(), " values received)"));
    }
    if (received_ == 0) {
      *version_ = chunk_.version;
      if (push != nullptr) {
        if (!chunk_.has_push) {
          return absl::DataLossError("push-pull answer without the push's");
        }
        *push = chunk_.push;
      }
    } else if (chunk_.version != *version_) {
      return absl::DataLossError("pull chunks of different versions");
    }
    chunk_.data.CopyTo(out_.data() + received_);
    received_ += n;
    reader_.Reset();
    return absl::OkStatus();
  }

  // A 1-bit difference's chunk: whole buckets from received_ on.
  absl::Status TakeDelta(PushResponse* push) {
    if (!have_.has_value()) {
      return absl::DataLossError(
          "a 1-bit pull difference for a pull that holds no weights");
    }
    if (chunk_.base_version != *have_) {
      return absl::DataLossError(absl::StrCat(
          "a 1-bit pull difference from version ", chunk_.base_version,
          " for weights of version ", *have_));
    }
    if (received_ > 0 && !delta_) {
      return absl::DataLossError("pull mixes float32 and 1-bit chunks");
    }
    const uint64_t buckets = chunk_.scales.size() / (2 * sizeof(float));
    const uint64_t left = out_.size() - received_;
    const uint64_t n =
        std::min<uint64_t>(left, buckets * static_cast<uint64_t>(bucket_size_));
    if (chunk_.offset != received_ || buckets == 0 ||
        chunk_.scales.size() % (2 * sizeof(float)) != 0 ||
        common::OneBitBuckets(n, bucket_size_) != buckets) {
      return absl::DataLossError(
          absl::StrCat("malformed 1-bit pull chunk at offset ", chunk_.offset,
                       " with ", chunk_.scales.size(), " bytes of scales (",
                       received_, " of ", out_.size(), " values received)"));
    }
    if (received_ == 0) {
      *version_ = chunk_.version;
      if (push != nullptr) {
        if (!chunk_.has_push) {
          return absl::DataLossError("push-pull answer without the push's");
        }
        *push = chunk_.push;
      }
    } else if (chunk_.version != *version_) {
      return absl::DataLossError("pull chunks of different versions");
    }
    decoded_.resize(n);
    if (absl::Status decoded = common::OneBitDecode(
            chunk_.data.ToString(), chunk_.scales.ToString(), bucket_size_,
            absl::MakeSpan(decoded_));
        !decoded.ok()) {
      return absl::DataLossError(absl::StrCat("1-bit pull chunk at offset ",
                                              chunk_.offset, ": ",
                                              decoded.message()));
    }
    float* w = out_.data() + received_;
    for (uint64_t i = 0; i < n; ++i) w[i] = w[i] + decoded_[i];
    received_ += n;
    delta_ = true;
    reader_.Reset();
    return absl::OkStatus();
  }

  // The status of a stream that ended: DATA_LOSS if it was short.
  absl::Status Complete() const {
    if (received_ == out_.size()) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat("pull ended after ", received_,
                                            " of ", out_.size(), " values"));
  }

 private:
  const absl::Span<float> out_;
  int64_t* const version_;
  std::atomic<int64_t>* const bytes_;
  const std::optional<int64_t> have_;
  const int bucket_size_;
  common::MessageReader reader_;
  common::MessageReader::PullChunkView chunk_;
  uint64_t received_ = 0;
  bool delta_ = false;  // the chunks so far were 1-bit differences
  std::vector<float> decoded_;
};

// Streams one shard's push, built chunk by chunk from borrowed slices; then
// reads the answer (Push) or the weights (PushPull).
class PushCall : public Bidi {
 public:
  PushCall(const PsClient::Shard& shard, ShardCalls* calls, int index,
           PushHeader header, grpc::Slice data, grpc::Slice scales,
           const common::ChunkPlan& plan, absl::Duration timeout,
           PushResponse* response, std::atomic<int64_t>* bytes_pushed,
           const PullTarget* pull, absl::Span<float> pull_out,
           int64_t* pull_version, std::atomic<int64_t>* bytes_pulled,
           std::optional<int64_t> pull_have = std::nullopt, int bucket_size = 1)
      : calls_(calls),
        index_(index),
        address_(shard.address),
        header_(std::move(header)),
        data_(std::move(data)),
        scales_(std::move(scales)),
        plan_(plan),
        response_(response),
        bytes_pushed_(bytes_pushed) {
    if (pull != nullptr) {
      receiver_.emplace(pull_out, pull_version, bytes_pulled, pull_have,
                        bucket_size);
    }
    shard.Prepare(&context_);
    context_.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    calls->Cancellable(&context_);
    shard.streams->PrepareBidiStreamingCall(
        &context_,
        pull != nullptr ? common::kPushPullMethod : common::kPushMethod,
        grpc::StubOptions(), this);
    WriteNext();
    StartRead(&in_);
    StartCall();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return;  // the server ended the call; OnDone has its status
    if (next_ < plan_.size()) WriteNext();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // end of stream; OnDone follows
    if (error_.ok()) {
      if (receiver_.has_value()) {
        error_ = receiver_->Take(in_, response_);
      } else {
        error_ = common::ParseSmallMessage(in_, response_);
      }
      if (!error_.ok()) context_.TryCancel();
    }
    in_.Clear();
    StartRead(&in_);
  }

  void OnDone(const grpc::Status& status) override {
    absl::Status result = error_;
    if (result.ok()) result = common::ToAbslStatus(status);
    if (result.ok() && receiver_.has_value()) result = receiver_->Complete();
    calls_->Done(index_, Annotate(result, index_, address_));
  }

 private:
  void WriteNext() {
    const common::ChunkRange chunk = plan_[next_];
    out_ = common::PushChunkMessage(
        next_ == 0 ? &header_ : nullptr, chunk.first_value,
        chunk.data_bytes > 0
            ? data_.sub(chunk.data_offset, chunk.data_offset + chunk.data_bytes)
            : grpc::Slice(),
        chunk.scales_bytes > 0
            ? scales_.sub(chunk.scales_offset,
                          chunk.scales_offset + chunk.scales_bytes)
            : grpc::Slice());
    bytes_pushed_->fetch_add(static_cast<int64_t>(out_.Length()));
    ++next_;
    if (next_ == plan_.size()) {
      StartWriteLast(&out_, grpc::WriteOptions());
    } else {
      StartWrite(&out_);
    }
  }

  grpc::ClientContext context_;
  ShardCalls* const calls_;
  const int index_;
  const std::string address_;
  const PushHeader header_;
  const grpc::Slice data_;
  const grpc::Slice scales_;
  const common::ChunkPlan plan_;
  PushResponse* const response_;
  std::atomic<int64_t>* const bytes_pushed_;
  std::optional<PullReceiver> receiver_;
  size_t next_ = 0;
  grpc::ByteBuffer out_;
  grpc::ByteBuffer in_;
  absl::Status error_;
};

// Receives one shard's slice of the weights.
class PullCall : public Bidi {
 public:
  PullCall(const PsClient::Shard& shard, ShardCalls* calls, int index,
           const PullRequest& request, absl::Duration timeout,
           absl::Span<float> out, std::atomic<int64_t>* bytes, int64_t* version,
           int bucket_size)
      : calls_(calls),
        index_(index),
        address_(shard.address),
        receiver_(out, version, bytes,
                  request.has_have_version()
                      ? std::optional<int64_t>(request.have_version())
                      : std::nullopt,
                  bucket_size) {
    shard.Prepare(&context_);
    context_.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    calls->Cancellable(&context_);
    shard.streams->PrepareBidiStreamingCall(&context_, common::kPullMethod,
                                            grpc::StubOptions(), this);
    out_ = common::SmallMessage(request);
    StartWriteLast(&out_, grpc::WriteOptions());
    StartRead(&in_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // end of stream; OnDone follows
    if (error_.ok()) {
      error_ = receiver_.Take(in_, nullptr);
      if (!error_.ok()) context_.TryCancel();
    }
    in_.Clear();
    StartRead(&in_);
  }

  void OnDone(const grpc::Status& status) override {
    absl::Status result = error_;
    if (result.ok()) result = common::ToAbslStatus(status);
    if (result.ok()) result = receiver_.Complete();
    calls_->Done(index_, Annotate(result, index_, address_));
  }

 private:
  grpc::ClientContext context_;
  ShardCalls* const calls_;
  const int index_;
  const std::string address_;
  PullReceiver receiver_;
  grpc::ByteBuffer out_;
  grpc::ByteBuffer in_;
  absl::Status error_;
};

}  // namespace

void PsClient::Shard::Prepare(grpc::ClientContext* context) const {
  if (!authorization.empty()) {
    context->AddMetadata(common::kAuthMetadataKey, authorization);
  }
}

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
  return grpc::CreateCustomChannel(
      address,
      credentials != nullptr ? credentials : grpc::InsecureChannelCredentials(),
      args);
}

absl::StatusOr<RegisterResponse> PsClient::RegisterWith(
    int s, absl::Time deadline, absl::Duration log_every,
    const std::string& why) {
  const Shard& shard = shards_[s];
  RegisterRequest request;
  request.set_worker_rank(worker_rank_);
  request.set_shard(s);
  request.set_config_fingerprint(common::ConfigFingerprint(config_));
  request.set_num_workers(num_workers_);
  request.set_num_shards(num_shards());
  request.set_session(session_);
  RegisterResponse response;
  const absl::Time start = absl::Now();
  absl::Time last_log = start;
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    if (stop_ != nullptr && stop_->HasBeenNotified()) {
      return absl::CancelledError("stopped while waiting for a shard");
    }
    grpc::ClientContext context;
    shard.Prepare(&context);
    context.set_wait_for_ready(true);
    // Short attempts, so that a stop or a log line is never far off.
    context.set_deadline(
        absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(1))));
    grpc::Status status = shard.stub->Register(&context, request, &response);
    if (status.ok()) return response;
    // ALREADY_EXISTS: another worker holds this rank; if it has died (this
    // is its restart), its lease runs out soon. CANCELLED (this client's
    // stop was checked above): the call reached a shard that is shutting
    // down, as the shard that was just lost may still be; its successor
    // comes up on the same address.
    const bool transport =
        status.error_code() == grpc::StatusCode::UNAVAILABLE ||
        status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
        status.error_code() == grpc::StatusCode::ALREADY_EXISTS ||
        status.error_code() == grpc::StatusCode::CANCELLED;
    if (!transport) {
      return Annotate(common::ToAbslStatus(status), s, shard.address);
    }
    const absl::Time now = absl::Now();
    if (now + backoff >= deadline &&
        status.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
      return Annotate(common::ToAbslStatus(status), s, shard.address);
    }
    if (now + backoff >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "could not reach parameter server shard ", s, " at ", shard.address,
          " within ",
          absl::FormatDuration(absl::Trunc(deadline - start, absl::Seconds(1))),
          " (", status.error_message(), "): ", why));
    }
    if (log_every > absl::ZeroDuration() && now - last_log >= log_every) {
      common::Log("%s %d: waiting for shard %d at %s for %.0f s (%s)",
                  worker_rank_ >= 0 ? "worker" : "evaluator",
                  std::max(worker_rank_, 0), s, shard.address,
                  absl::ToDoubleSeconds(now - start), status.error_message());
      last_log = now;
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
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
  client->num_workers_ = options.num_workers;
  client->stop_ = options.stop;
  client->log_every_ = options.log_every;
  std::random_device random;
  client->session_ = (static_cast<uint64_t>(random()) << 32 | random()) | 1;
  const int shards = static_cast<int>(options.server_addresses.size());
  for (const std::string& address : options.server_addresses) {
    std::shared_ptr<grpc::Channel> channel =
        MakeChannel(address, options.peer_timeout, options.credentials);
    Shard& shard = client->shards_.emplace_back();
    if (!options.auth_token.empty()) {
      shard.authorization = common::BearerValue(options.auth_token);
    }
    shard.address = address;
    shard.channel = channel;
    shard.stub = ParameterService::NewStub(channel);
    shard.streams = std::make_unique<grpc::GenericStub>(channel);
  }
  const uint64_t params =
      common::ModelLayout::FromConfig(options.config).num_params();
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  for (int s = 0; s < shards; ++s) {
    absl::StatusOr<RegisterResponse> response = client->RegisterWith(
        s, deadline, options.log_every,
        "is ps_server running there, and --servers in shard order?");
    if (!response.ok()) return response.status();
    const std::string& address = options.server_addresses[s];
    const common::ShardRange expected =
        common::ShardRangeFor(params, shards, s);
    if (response->num_shards() != shards ||
        response->offset() != expected.begin ||
        response->length() != expected.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", s, " at ", address, " serves [", response->offset(), ", ",
          response->offset() + response->length(), ") of ",
          response->num_shards(), " shards, but this worker expects [",
          expected.begin, ", ", expected.end, ") of ", shards,
          ": check --servers and the servers' --num_shards"));
    }
    client->ranges_.push_back(expected);
    client->initial_versions_.push_back(response->version());
    client->applied_samples_ =
        s == 0 ? response->samples_applied()
               : client->ResumePoint(client->applied_samples_,
                                     response->samples_applied());
  }
  client->next_sample_offset_ = client->applied_samples_;
  return client;
}

absl::Status PsClient::Leave(absl::Duration timeout, bool finished) {
  if (worker_rank_ < 0) return absl::OkStatus();
  RegisterRequest request;
  request.set_worker_rank(worker_rank_);
  request.set_config_fingerprint(common::ConfigFingerprint(config_));
  request.set_num_workers(num_workers_);
  request.set_num_shards(num_shards());
  request.set_session(session_);
  request.set_leaving(true);
  request.set_finished(finished);
  return RegisterEverywhere(request, timeout);
}

absl::StatusOr<bool> PsClient::RankFinished(absl::Duration timeout) {
  absl::StatusOr<std::vector<StatsResponse>> stats = Stats(timeout);
  if (!stats.ok()) return stats.status();
  return !stats->empty() &&
         std::all_of(
             stats->begin(), stats->end(), [this](const StatsResponse& shard) {
               return std::find(shard.finished_ranks().begin(),
                                shard.finished_ranks().end(),
                                worker_rank_) != shard.finished_ranks().end();
             });
}

absl::Status PsClient::CloseRun(absl::Duration timeout) {
  if (worker_rank_ != -1) {
    return absl::FailedPreconditionError(
        "only a client of rank -1 (the run's finisher) closes the run");
  }
  RegisterRequest request;
  request.set_worker_rank(-1);
  request.set_config_fingerprint(common::ConfigFingerprint(config_));
  request.set_num_shards(num_shards());
  request.set_session(session_);
  request.set_leaving(true);
  request.set_finished(true);
  return RegisterEverywhere(request, timeout);
}

absl::Status PsClient::RegisterEverywhere(RegisterRequest request,
                                          absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status first;
  for (int s = 0; s < num_shards(); ++s) {
    request.set_shard(s);
    grpc::ClientContext context;
    shards_[s].Prepare(&context);
    context.set_deadline(absl::ToChronoTime(deadline));
    RegisterResponse response;
    grpc::Status status =
        shards_[s].stub->Register(&context, request, &response);
    if (!status.ok() && first.ok()) {
      first = Annotate(common::ToAbslStatus(status), s, shards_[s].address);
    }
  }
  return first;
}

int64_t PsClient::ResumePoint(int64_t a, int64_t b) const {
  // Sync: where the barrier is, the furthest shard (a shard restarted from
  // an older checkpoint lost its steps since; the workers that lived on are
  // at the others' step, and a worker resuming behind them would hold every
  // barrier up). The others: the nearest, so that no shard misses a batch
  // (those that hold it answer its repeat as a duplicate).
  return config_.mode() == SYNC ? std::max(a, b) : std::min(a, b);
}

absl::Status PsClient::Reconnect(absl::Duration timeout,
                                 absl::Duration log_every) {
  const absl::Time deadline = absl::Now() + timeout;
  for (int s = 0; s < num_shards(); ++s) {
    absl::StatusOr<RegisterResponse> response = RegisterWith(
        s, deadline, log_every,
        "the shard did not come back (raise --shard_lost_timeout_s to wait "
        "longer)");
    if (!response.ok()) return response.status();
    if (response->num_shards() != num_shards() ||
        response->offset() != ranges_[s].begin ||
        response->length() != ranges_[s].size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", s, " at ", shards_[s].address,
                       " came back serving another part of the model"));
    }
    initial_versions_[s] = response->version();
    applied_samples_ =
        s == 0 ? response->samples_applied()
               : ResumePoint(applied_samples_, response->samples_applied());
  }
  // The loop repeats its step now, on the weights as the shards have them.
  repeat_next_push_ = true;
  return absl::OkStatus();
}

std::unique_ptr<PendingCall> PsClient::PullAsync(
    int64_t min_version, absl::Duration timeout, absl::Span<float> params,
    std::vector<int64_t>* versions) {
  return PullAsync(std::vector<int64_t>(num_shards(), min_version), timeout,
                   params, versions);
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
    calls->Own(std::make_unique<PullCall>(
        shards_[s], calls.get(), s, request, timeout,
        params.subspan(ranges_[s].begin, ranges_[s].size()), &bytes_pulled_,
        &(*versions)[s], config_.onebit_bucket_size()));
  }
  return calls;
}

absl::Status PsClient::Pull(int64_t min_version, absl::Duration timeout,
                            absl::Span<float> params,
                            std::vector<int64_t>* versions,
                            bool params_hold_versions) {
  return PullAsync(std::vector<int64_t>(num_shards(), min_version), timeout,
                   params, versions, params_hold_versions)
      ->Wait();
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
    PushResponse* response = results_ != nullptr
                                 ? &(*results_)[shard]
                                 : calls_.Own(std::make_unique<PushResponse>());
    const common::ShardRange range = client_->ranges_[shard];
    calls_.Own(std::make_unique<PushCall>(
        client_->shards_[shard], &calls_, shard, std::move(header),
        Borrow(payload.data), Borrow(payload.scales),
        common::ChunkPlan(encoding, n, bucket,
                          static_cast<uint64_t>(config.chunk_bytes())),
        pull_.has_value() ? pull_->timeout
                          : absl::Seconds(config.sync_timeout_s()),
        response, &client_->bytes_pushed_,
        pull_.has_value() ? &*pull_ : nullptr,
        pull_.has_value() ? pull_->params.subspan(range.begin, range.size())
                          : absl::Span<float>(),
        pull_.has_value() ? &(*pull_->versions)[shard] : nullptr,
        &client_->bytes_pulled_, have, bucket));
  }

  absl::Status Wait() override {
    for (size_t s = 0; s < sent_.size(); ++s) {
      if (!sent_[s]) {
        sent_[s] = true;
        calls_.Done(static_cast<int>(s),
                    absl::FailedPreconditionError(absl::StrCat(
                        "push ended without a payload for shard ", s)));
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

absl::StatusOr<std::vector<StatsResponse>> PsClient::Stats(
    absl::Duration timeout) {
  std::vector<StatsResponse> stats(num_shards());
  for (int s = 0; s < num_shards(); ++s) {
    grpc::ClientContext context;
    shards_[s].Prepare(&context);
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    grpc::Status status =
        shards_[s].stub->Stats(&context, StatsRequest(), &stats[s]);
    if (!status.ok()) {
      return Annotate(common::ToAbslStatus(status), s, shards_[s].address);
    }
  }
  return stats;
}

}  // namespace monsoon::worker
