#include "worker/shard_streams.h"

#include <grpcpp/client_context.h>
#include <grpcpp/support/client_callback.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <utility>

#include "common/grpc_status.h"
#include "worker/pull_decoder.h"

namespace monsoon::worker {
namespace {

using Bidi = grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

// Streams a push to one shard and reads the answer (Push) or the weights
// (PushPull). A whole push goes out in the chunks of its plan, in order. A
// partial one (float32, values [ready_from, n) final when it starts) goes
// back to front: each chunk ends where the ones before it begin, as far as
// Extend says the values are final, and the stream ends with the chunk
// that reaches value 0. Until then a hold keeps OnDone from running, so
// that Extend may still write; it is let go once the last chunk is
// written, a write fails, the call ends early (the read fails: the
// server's error, the deadline or a cancel) or Cancel() gives up.
class PushCall : public Bidi, public PushStream {
 public:
  PushCall(const ShardConnection& shard, ShardCalls* calls, int index,
           PushHeader header, grpc::Slice data, grpc::Slice scales,
           const common::ChunkPlan& plan, uint64_t ready_from,
           uint64_t max_chunk_values, absl::Duration timeout,
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
        partial_(ready_from > 0),
        max_chunk_values_(std::max<uint64_t>(1, max_chunk_values)),
        response_(response),
        bytes_pushed_(bytes_pushed),
        sent_from_(header_.length()),
        ready_from_(ready_from) {
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
    if (partial_) {
      AddHold();
      writing_ = true;  // nothing else runs before StartCall
      WritePart(NextPart());
    } else {
      WriteNext();
    }
    StartRead(&in_);
    StartCall();
  }

  void Extend(uint64_t from) override {
    Part part;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_from_ = std::min(ready_from_, from);
      if (writing_ || released_ || ready_from_ >= sent_from_) return;
      writing_ = true;
      part = NextPart();
    }
    WritePart(part);
  }

  void Cancel() override {
    bool release = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
      if (!writing_ && !released_) release = released_ = true;
    }
    context_.TryCancel();
    if (release) RemoveHold();
  }

  void OnWriteDone(bool ok) override {
    if (!partial_) {
      if (!ok) return;  // the server ended the call; OnDone has its status
      if (next_ < plan_.size()) WriteNext();
      return;
    }
    Part part;
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (released_) return;  // that was the last chunk
      if (!ok || stopped_) {
        released_ = true;
      } else if (ready_from_ < sent_from_) {
        writing_ = true;
        part = NextPart();
      } else {
        return;  // Extend writes the next chunk
      }
    }
    if (writing_now(part)) {
      WritePart(part);
    } else {
      RemoveHold();
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // End of stream: OnDone follows, once a partial push stops writing.
      if (!partial_) return;
      bool release = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        stopped_ = true;
        if (!writing_ && !released_) release = released_ = true;
      }
      if (release) RemoveHold();
      return;
    }
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
  // A partial push's next chunk: values [begin, end), the stream's last
  // when begin is 0.
  struct Part {
    uint64_t begin = 0;
    uint64_t end = 0;
  };
  static bool writing_now(const Part& part) { return part.end > part.begin; }

  // Under mu_ (or before StartCall), with writing_ set: the chunk below
  // what has been sent, as far down as the values are final.
  Part NextPart() {
    Part part;
    part.end = sent_from_;
    part.begin = std::max(ready_from_, sent_from_ > max_chunk_values_
                                           ? sent_from_ - max_chunk_values_
                                           : uint64_t{0});
    const bool first = sent_from_ == header_.length();
    sent_from_ = part.begin;
    first_part_ = first;
    if (part.begin == 0) released_ = true;  // the hold goes with the last
    return part;
  }

  // Writes a partial push's chunk (by the one thread whose writing_ it is).
  void WritePart(const Part& part) {
    out_ = common::PushChunkMessage(
        first_part_ ? &header_ : nullptr, part.begin,
        data_.sub(part.begin * sizeof(float), part.end * sizeof(float)),
        grpc::Slice());
    bytes_pushed_->fetch_add(static_cast<int64_t>(out_.Length()));
    if (part.begin == 0) {
      StartWriteLast(&out_, grpc::WriteOptions());
      RemoveHold();
    } else {
      StartWrite(&out_);
    }
  }

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
  const bool partial_;
  const uint64_t max_chunk_values_;
  PushResponse* const response_;
  std::atomic<int64_t>* const bytes_pushed_;
  std::optional<PullReceiver> receiver_;
  size_t next_ = 0;  // a whole push's next chunk of plan_
  // A partial push's: values [sent_from_, n) are written or being written,
  // [ready_from_, n) final; one thread writes at a time (writing_); the
  // hold is let go once (released_).
  std::mutex mu_;
  uint64_t sent_from_;
  uint64_t ready_from_;
  bool writing_ = false;
  bool released_ = false;
  bool stopped_ = false;  // the call ended or was given up: no more writes
  bool first_part_ = false;  // the chunk being written carries the header
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

PushStream* StartPushCall(const ShardConnection& shard, ShardCalls* calls,
                          int index, PushHeader header, grpc::Slice data,
                          grpc::Slice scales, const common::ChunkPlan& plan,
                          uint64_t ready_from, uint64_t max_chunk_values,
                          absl::Duration timeout, PushResponse* response,
                          std::atomic<int64_t>* bytes_pushed, bool with_pull,
                          absl::Span<float> pull_out, int64_t* pull_version,
                          std::atomic<int64_t>* bytes_pulled,
                          std::optional<int64_t> pull_have, int bucket_size) {
  return calls->Own(std::make_unique<PushCall>(
      shard, calls, index, std::move(header), std::move(data),
      std::move(scales), plan, ready_from, max_chunk_values, timeout, response,
      bytes_pushed, with_pull, pull_out, pull_version, bytes_pulled, pull_have,
      bucket_size));
}

void StartPullCall(const ShardConnection& shard, ShardCalls* calls, int index,
                   const PullRequest& request, absl::Duration timeout,
                   absl::Span<float> out, std::atomic<int64_t>* bytes,
                   int64_t* version, int bucket_size) {
  calls->Own(std::make_unique<PullCall>(shard, calls, index, request, timeout,
                                        out, bytes, version, bucket_size));
}

}  // namespace monsoon::worker
