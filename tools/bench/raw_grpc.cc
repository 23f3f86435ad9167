#include "tools/bench/raw_grpc.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_status.h"
#include "common/socket_buffers.h"

namespace monsoon::tools {
namespace {

constexpr int kMaxMessageBytes = 8 << 20;
constexpr char kPush[] = "/monsoon.bench.Raw/Push";
constexpr char kPull[] = "/monsoon.bench.Raw/Pull";
constexpr char kPushPull[] = "/monsoon.bench.Raw/PushPull";

// A message of `n` bytes at `data`, borrowed (the memory outlives the call).
grpc::ByteBuffer Borrowed(const char* data, size_t n) {
  grpc::Slice slice(data, n, grpc::Slice::STATIC_SLICE);
  return grpc::ByteBuffer(&slice, 1);
}

// The first message of every call: how many bytes the server sends back,
// and in what chunks.
grpc::ByteBuffer Request(uint64_t pull_bytes, uint64_t chunk_bytes) {
  uint64_t fields[2] = {pull_bytes, chunk_bytes};
  grpc::Slice slice(fields, sizeof(fields));  // copied
  return grpc::ByteBuffer(&slice, 1);
}

bool ParseRequest(const grpc::ByteBuffer& buffer, uint64_t* pull_bytes,
                  uint64_t* chunk_bytes) {
  grpc::Slice slice;
  if (!buffer.DumpToSingleSlice(&slice).ok() || slice.size() != 16) {
    return false;
  }
  std::memcpy(pull_bytes, slice.begin(), 8);
  std::memcpy(chunk_bytes, slice.begin() + 8, 8);
  return true;
}

// Reads the request and every pushed message (dropped unread), then streams
// the bytes the request asked for and finishes. Deletes itself.
class RawReactor : public grpc::ServerGenericBidiReactor {
 public:
  RawReactor(const std::vector<char>* payload) : payload_(payload) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (ok) {
      if (first_ && !ParseRequest(in_, &pull_bytes_, &chunk_bytes_)) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request"));
        return;
      }
      if (pull_bytes_ > payload_->size() || chunk_bytes_ == 0) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "size"));
        return;
      }
      first_ = false;
      in_.Clear();
      StartRead(&in_);
      return;
    }
    // The client has sent everything.
    if (pull_bytes_ == 0) {
      out_ = Borrowed(payload_->data(), 8);  // a small answer
      StartWriteAndFinish(&out_, grpc::WriteOptions(), grpc::Status::OK);
      return;
    }
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return;  // cancelled; OnDone follows
    WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    if (sent_ == pull_bytes_) {
      Finish(grpc::Status::OK);
      return;
    }
    const uint64_t n = std::min(chunk_bytes_, pull_bytes_ - sent_);
    out_ = Borrowed(payload_->data() + sent_, n);
    sent_ += n;
    StartWrite(&out_);
  }

  const std::vector<char>* const payload_;
  grpc::ByteBuffer in_;
  grpc::ByteBuffer out_;
  bool first_ = true;
  uint64_t pull_bytes_ = 0;
  uint64_t chunk_bytes_ = 0;
  uint64_t sent_ = 0;
};

// One client call: a request, then `push_bytes` in chunks, then reads until
// the server finishes.
class RawCall
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  RawCall(grpc::GenericStub* stub, const std::string& method,
          const std::vector<char>& payload, uint64_t push_bytes,
          uint64_t pull_bytes, uint64_t chunk_bytes)
      : payload_(payload), push_bytes_(push_bytes), chunk_bytes_(chunk_bytes) {
    stub->PrepareBidiStreamingCall(&context_, method, grpc::StubOptions(),
                                   this);
    out_ = Request(pull_bytes, chunk_bytes);
    if (push_bytes_ == 0) {
      StartWriteLast(&out_, grpc::WriteOptions());
    } else {
      StartWrite(&out_);
    }
    StartRead(&in_);
    StartCall();
  }

  void OnWriteDone(bool ok) override {
    if (!ok || sent_ == push_bytes_) return;
    const uint64_t n = std::min(chunk_bytes_, push_bytes_ - sent_);
    out_ = Borrowed(payload_.data() + sent_, n);
    sent_ += n;
    if (sent_ == push_bytes_) {
      StartWriteLast(&out_, grpc::WriteOptions());
    } else {
      StartWrite(&out_);
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    received_ += in_.Length();
    in_.Clear();
    StartRead(&in_);
  }

  void OnDone(const grpc::Status& status) override {
    status_ = common::ToAbslStatus(status);
    done_.Notify();
  }

  absl::Status Wait(uint64_t* received) {
    done_.WaitForNotification();
    *received = received_;
    return status_;
  }

 private:
  grpc::ClientContext context_;
  const std::vector<char>& payload_;
  const uint64_t push_bytes_;
  const uint64_t chunk_bytes_;
  uint64_t sent_ = 0;
  uint64_t received_ = 0;
  grpc::ByteBuffer out_;
  grpc::ByteBuffer in_;
  absl::Status status_;
  absl::Notification done_;
};

}  // namespace

class RawGrpcServer::Service : public grpc::CallbackGenericService {
 public:
  explicit Service(const std::vector<char>* payload) : payload_(payload) {}
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* /*context*/) override {
    return new RawReactor(payload_);
  }

 private:
  const std::vector<char>* const payload_;
};

absl::StatusOr<std::unique_ptr<RawGrpcServer>> RawGrpcServer::Start(
    uint64_t max_bytes, const std::string& listen) {
  std::unique_ptr<RawGrpcServer> server(new RawGrpcServer());
  server->payload_.assign(max_bytes, 1);
  server->service_ = std::make_unique<Service>(&server->payload_);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  // The buffers Monsoon's own sockets get, for a like-for-like reference
  // over Unix domain sockets.
  common::SetUnixSocketBuffers(&builder);
  builder.RegisterCallbackGenericService(server->service_.get());
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("the raw gRPC server could not listen on ", listen));
  }
  server->address_ =
      absl::StartsWith(listen, "unix:")
          ? listen
          : absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
  return server;
}

RawGrpcServer::~RawGrpcServer() {
  if (server_ != nullptr) server_->Shutdown();
}

namespace {

std::shared_ptr<grpc::Channel> RawChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  common::SetUnixSocketBuffers(&args);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   args);
}

}  // namespace

RawGrpcClient::RawGrpcClient(const std::string& address, uint64_t max_bytes)
    : payload_(max_bytes, 2), stub_(RawChannel(address)) {}

absl::Status RawGrpcClient::Call(const std::string& method, uint64_t push_bytes,
                                 uint64_t pull_bytes, uint64_t chunk_bytes) {
  if (push_bytes > payload_.size()) {
    return absl::InvalidArgumentError("push larger than the client's buffer");
  }
  RawCall call(&stub_, method, payload_, push_bytes, pull_bytes, chunk_bytes);
  uint64_t received = 0;
  absl::Status status = call.Wait(&received);
  if (!status.ok()) return status;
  const uint64_t expected = pull_bytes == 0 ? 8 : pull_bytes;
  if (received != expected) {
    return absl::DataLossError(
        absl::StrCat("received ", received, " bytes, expected ", expected));
  }
  return absl::OkStatus();
}

absl::Status RawGrpcClient::Push(uint64_t bytes, uint64_t chunk_bytes) {
  return Call(kPush, bytes, 0, chunk_bytes);
}

absl::Status RawGrpcClient::Pull(uint64_t bytes, uint64_t chunk_bytes) {
  return Call(kPull, 0, bytes, chunk_bytes);
}

absl::Status RawGrpcClient::PushPull(uint64_t bytes, uint64_t chunk_bytes) {
  return Call(kPushPull, bytes, bytes, chunk_bytes);
}

}  // namespace monsoon::tools
