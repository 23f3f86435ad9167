#include "worker/ring.h"

#include <gloo/allreduce.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <stdexcept>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace monsoon::worker {
namespace {

// A failure of the rendezvous, carried through gloo as an exception and
// turned back into its status by Connect.
class RendezvousFailure : public std::runtime_error {
 public:
  explicit RendezvousFailure(absl::Status status)
      : std::runtime_error(std::string(status.message())),
        status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// gloo's store over a RingRendezvous: gets poll until the key is set or the
// timeout passes.
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(RingRendezvous* rendezvous, absl::Duration timeout)
      : rendezvous_(rendezvous), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status status =
        rendezvous_->Set(key, std::string(data.begin(), data.end()));
    if (!status.ok()) throw RendezvousFailure(status);
  }

  std::vector<char> get(const std::string& key) override {
    std::optional<std::string> value = Await(key, timeout_);
    return std::vector<char>(value->begin(), value->end());
  }

  void wait(const std::vector<std::string>& keys) override {
    wait(keys, absl::ToChronoMilliseconds(timeout_));
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    for (const std::string& key : keys) {
      Await(key, absl::FromChrono(timeout));
    }
  }

 private:
  // The value of `key` once a member has set it; throws after `timeout`.
  std::optional<std::string> Await(const std::string& key,
                                   absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    absl::Duration pause = absl::Milliseconds(5);
    while (true) {
      absl::StatusOr<std::optional<std::string>> value = rendezvous_->Get(key);
      if (!value.ok()) throw RendezvousFailure(value.status());
      if (value->has_value()) return *std::move(value);
      if (absl::Now() >= deadline) {
        throw RendezvousFailure(absl::UnavailableError(absl::StrCat(
            "waited ", absl::FormatDuration(timeout),
            " at the rendezvous for the ring member that publishes '", key,
            "' (keys are PREFIX/RANK): has every worker started, with the "
            "same --num_workers?")));
      }
      absl::SleepFor(pause);
      pause = std::min(pause * 2, absl::Milliseconds(100));
    }
  }

  RingRendezvous* const rendezvous_;
  const absl::Duration timeout_;
};

// A gloo failure as a status: a peer gone or silent is UNAVAILABLE (or
// DEADLINE_EXCEEDED when it timed out), anything else INTERNAL.
absl::Status FromGloo(const std::exception& e, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", e.what());
  if (absl::StrContains(e.what(), "Timed out") ||
      absl::StrContains(e.what(), "timed out")) {
    return absl::DeadlineExceededError(message);
  }
  if (dynamic_cast<const gloo::IoException*>(&e) != nullptr) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Ring>> Ring::Connect(
    const RingOptions& options, RingRendezvous* rendezvous) {
  std::unique_ptr<Ring> ring(new Ring(options));
  if (options.size <= 1) return ring;
  std::shared_ptr<gloo::transport::Device> device;
  try {
    gloo::transport::tcp::attr attr(options.host.c_str());
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot listen for the ring at '", options.host, "' (", e.what(),
        "): give an address of this machine that its peers reach "
        "(ps_worker --ring_host)"));
  }
  StoreAdapter store(rendezvous, options.timeout);
  gloo::rendezvous::PrefixStore prefixed(options.prefix, store);
  auto context =
      std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
  context->setTimeout(absl::ToChronoMilliseconds(options.timeout));
  try {
    context->connectFullMesh(prefixed, device);
  } catch (const RendezvousFailure& failure) {
    return failure.status();
  } catch (const std::exception& e) {
    return FromGloo(e, absl::StrCat("worker ", options.rank,
                                    " could not connect to its ring peers"));
  }
  ring->context_ = std::move(context);
  return ring;
}

Ring::~Ring() = default;

absl::Status Ring::Allreduce(absl::Span<float> values) {
  if (options_.size <= 1 || values.empty()) return absl::OkStatus();
  gloo::AllreduceOptions opts(context_);
  opts.setOutput(values.data(), values.size());
  opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  // A plain sum, element by element: a + b is the same bits as b + a, and
  // every member receives the same reduced segments.
  opts.setReduceFunction(
      [](void* out, const void* a, const void* b, size_t n) {
        float* o = static_cast<float*>(out);
        const float* x = static_cast<const float*>(a);
        const float* y = static_cast<const float*>(b);
        for (size_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
      });
  opts.setTag(static_cast<uint32_t>(calls_++));
  opts.setTimeout(absl::ToChronoMilliseconds(options_.timeout));
  try {
    gloo::allreduce(opts);
  } catch (const std::exception& e) {
    return FromGloo(
        e, absl::StrCat("the ring's all-reduce of ", values.size(),
                        " values failed at worker ", options_.rank, " of ",
                        options_.size,
                        " (a worker that stops breaks the ring: the run "
                        "cannot go on without it)"));
  }
  const int64_t n = options_.size;
  const int64_t bytes = static_cast<int64_t>(values.size() * sizeof(float));
  bytes_sent_ += 2 * (n - 1) * ((bytes + n - 1) / n);
  return absl::OkStatus();
}

}  // namespace monsoon::worker
