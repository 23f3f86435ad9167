#include "worker/shard_streams.h"

#include <grpcpp/client_context.h>
#include <grpcpp/support/client_callback.h>

#include <memory>
#include <utility>

#include "common/grpc_status.h"
#include "worker/pull_decoder.h"

namespace monsoon::worker {
namespace {

using Bidi = grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

// reads the answer (Push) or the weights (PushPull).
class PushCall : public Bidi {
 public:
  PushCall(const ShardConnection& shard, ShardCalls* calls, int index,
           PushHeader header, grpc::Slice data, grpc::Slice scales,
           const common::ChunkPlan& plan, absl::Duration timeout,
           PushResponse* response, std::atomic<int64_t>* bytes_pushed,
           bool with_pull, absl::Span<float> pull_out, int64_t* pull_version,
           std::atomic<int64_t>* bytes_pulled,
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
    if (with_pull) {
      receiver_.emplace(pull_out, pull_version, bytes_pulled, pull_have,
                        bucket_size);
    }
    shard.Prepare(&context_);
    context_.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    calls->Cancellable(&context_);
    shard.streams->PrepareBidiStreamingCall(
        &context_, with_pull ? common::kPushPullMethod : common::kPushMethod,
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
  PullCall(const ShardConnection& shard, ShardCalls* calls, int index,
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

void StartPushCall(const ShardConnection& shard, ShardCalls* calls, int index,
                   PushHeader header, grpc::Slice data, grpc::Slice scales,
                   const common::ChunkPlan& plan, absl::Duration timeout,
                   PushResponse* response, std::atomic<int64_t>* bytes_pushed,
                   bool with_pull, absl::Span<float> pull_out,
                   int64_t* pull_version, std::atomic<int64_t>* bytes_pulled,
                   std::optional<int64_t> pull_have, int bucket_size) {
  calls->Own(std::make_unique<PushCall>(
      shard, calls, index, std::move(header), std::move(data),
      std::move(scales), plan, timeout, response, bytes_pushed, with_pull,
      pull_out, pull_version, bytes_pulled, pull_have, bucket_size));
}

void StartPullCall(const ShardConnection& shard, ShardCalls* calls, int index,
                   const PullRequest& request, absl::Duration timeout,
                   absl::Span<float> out, std::atomic<int64_t>* bytes,
                   int64_t* version, int bucket_size) {
  calls->Own(std::make_unique<PullCall>(shard, calls, index, request, timeout,
                                        out, bytes, version, bucket_size));
}

}  // namespace monsoon::worker
