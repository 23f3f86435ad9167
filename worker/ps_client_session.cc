// PsClient's session with the shards: registering (Connect, and again
// after a lost shard: Reconnect), where a restarted worker resumes, leaving,
// finishing and closing the run.
#include <grpcpp/client_context.h>

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/auth.h"
#include "common/config.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "worker/ps_client.h"

namespace monsoon::worker {
namespace {

// How long this process did not run while it waited for something due by
// `due` that it saw end at `end` (a stopped process, a paused machine): the
// time past `due`, where that is more than a second (a call may end a
// little after its deadline); zero otherwise. Such a time says nothing of
// a shard, so it does not count against the wait for one.
absl::Duration StallPast(absl::Time due, absl::Time end) {
  const absl::Duration late = end - due;
  return late > absl::Seconds(1) ? late : absl::ZeroDuration();
}

}  // namespace

absl::StatusOr<RegisterResponse> PsClient::RegisterWith(
    int s, absl::Time deadline, absl::Duration log_every,
    const std::string& why) {
  const Shard& shard = shards_[s];
  RegisterRequest request;
  request.set_worker_rank(worker_rank_);
  request.set_shard(s);
  request.set_config_fingerprint(fingerprint_);
  request.set_num_workers(num_workers_);
  request.set_num_shards(num_shards());
  request.set_session(session_);
  request.set_replaces_session(replaces_session_);
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
    // With a backup to ask, a primary that cannot be reached now is not
    // waited for.
    // (After a take-over, the range's other process holds its copy once it
    // has come back and been repaired: ParameterService.Repair.)
    const bool can_take_over = replicas_ > 0;
    context.set_wait_for_ready(!can_take_over);
    // Short attempts, so that a stop or a log line is never far off.
    const absl::Time attempt_due =
        std::min(deadline, absl::Now() + absl::Seconds(1));
    context.set_deadline(absl::ToChronoTime(attempt_due));
    grpc::Status status = shard.stub->Register(&context, request, &response);
    if (status.ok()) return response;
    // A failure that lasted far past its own deadline: this process did not
    // run meanwhile, and the attempt is made again, with the wait extended
    // by that time, rather than taken as the shard's silence.
    absl::Time due = attempt_due;  // of the last call made
    if (const absl::Duration stall = StallPast(due, absl::Now());
        stall > absl::ZeroDuration()) {
      NoteStall(s, stall, &deadline);
      continue;
    }
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
      absl::Status refused =
          Annotate(common::ToAbslStatus(status), s, shard.address);
      if (!absl::IsFailedPrecondition(refused)) return refused;
      return WithConfigDifferences(s, std::move(refused));
    }
    if (!can_take_over && replicas_ == 0 && !taken_over_[s] &&
        num_shards() > 1 &&
        (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) &&
        NextHoldsBackup(s)) {
      // Shard s answered no registration yet (the first one lost): the
      // next process says it holds a copy of its range.
      replicas_ = 1;
      continue;
    }
    if (can_take_over &&
        (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)) {
      due = std::min(deadline, absl::Now() + kTakeOverWait);
      absl::StatusOr<RegisterResponse> taken =
          TakeOver(s, request, deadline, status.error_message());
      if (taken.ok()) return taken;
      if (!absl::IsUnavailable(taken.status()) &&
          !absl::IsDeadlineExceeded(taken.status())) {
        return taken.status();
      }
      status = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            absl::StrCat(status.error_message(), "; ",
                                         taken.status().message()));
    }
    const absl::Time now = absl::Now();
    if (const absl::Duration stall = StallPast(due, now);
        stall > absl::ZeroDuration()) {
      NoteStall(s, stall, &deadline);
      continue;
    }
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
    const absl::Time wake = absl::Now() + backoff;
    absl::SleepFor(backoff);
    if (const absl::Duration stall = StallPast(wake, absl::Now());
        stall > absl::ZeroDuration()) {
      NoteStall(s, stall, &deadline);
    }
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

void PsClient::NoteStall(int s, absl::Duration stall, absl::Time* deadline) {
  common::LogWarning(
      "%s %d: this process did not run for %.1f s (stopped, or its machine "
      "paused) while it waited for shard %d at %s; that time does not count "
      "against the wait for the shard",
      worker_rank_ >= 0 ? "worker" : "evaluator", std::max(worker_rank_, 0),
      absl::ToDoubleSeconds(stall), s, shards_[s].address);
  *deadline += stall;
}

PsClient::Shard PsClient::Connection(const std::string& address) const {
  std::shared_ptr<grpc::Channel> channel =
      MakeChannel(address, peer_timeout_, credentials_);
  Shard shard;
  shard.authorization = authorization_;
  shard.address = address;
  shard.channel = channel;
  shard.stub = ParameterService::NewStub(channel);
  shard.streams = std::make_unique<grpc::GenericStub>(channel);
  return shard;
}

bool PsClient::NextHoldsBackup(int s) {
  Shard next = Connection(addresses_[(s + 1) % num_shards()]);
  grpc::ClientContext context;
  next.Prepare(&context);
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  StatsRequest request;
  request.set_shard(s);
  StatsResponse stats;
  return next.stub->Stats(&context, request, &stats).ok() &&
         stats.shard() == s &&
         stats.replica_role() != StatsResponse::UNREPLICATED;
}

absl::Status PsClient::WithConfigDifferences(int s, absl::Status refused) {
  grpc::ClientContext context;
  shards_[s].Prepare(&context);
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  StatsRequest request;
  request.set_with_config(true);
  StatsResponse stats;
  if (!shards_[s].stub->Stats(&context, request, &stats).ok() ||
      !stats.has_config()) {
    return refused;  // a shard that does not say: the refusal as it is
  }
  const std::string differences =
      common::ConfigDifferences(stats.config(), config_);
  if (differences.empty()) return refused;
  return absl::Status(
      refused.code(),
      absl::StrCat(refused.message(), "; shard ", s,
                   "'s config -> this daemon's: ",
                   absl::StrReplaceAll(differences, {{"\n", "; "}})));
}

absl::StatusOr<RegisterResponse> PsClient::TakeOver(
    int s, const RegisterRequest& request, absl::Time deadline,
    const std::string& why) {
  const int n = num_shards();
  // The range's two processes: shard s's and the next one. Its copy is in
  // whichever does not serve it now.
  const bool home = taken_over_[s];
  Shard backup = Connection(addresses_[home ? s : (s + 1) % n]);
  if (!home) backup.range = absl::StrCat(s);
  RegisterRequest ask = request;
  ask.set_take_over(true);
  grpc::ClientContext context;
  backup.Prepare(&context);
  // The backup asks the primary itself first (within half a second).
  context.set_deadline(
      absl::ToChronoTime(std::min(deadline, absl::Now() + kTakeOverWait)));
  RegisterResponse response;
  grpc::Status status = backup.stub->Register(&context, ask, &response);
  if (!status.ok()) {
    return Annotate(common::ToAbslStatus(status), s, backup.address);
  }
  // Said in the words of shard s's process: lost (a connection refused, no
  // answer), or back but no longer serving its range (a take-over before
  // this client came, or while it was away).
  common::LogWarning(
      "%s %d: shard %d at %s does not serve its range (%s); the range's other "
      "copy, at %s, serves it (epoch %d), and this client's calls go there "
      "from now on",
      worker_rank_ >= 0 ? "worker" : "evaluator", std::max(worker_rank_, 0), s,
      shards_[s].address, why, backup.address, response.range_epoch());
  shards_[s] = std::move(backup);
  taken_over_[s] = !home;
  {
    absl::MutexLock lock(&ledger_mu_);
    ++ledger_.take_overs;
  }
  return response;
}

uint64_t DrawSession() {
  std::random_device random;
  return (static_cast<uint64_t>(random()) << 32 | random()) | 1;
}

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Connect(
    const PsClientOptions& options) {
  if (options.server_addresses.empty()) {
    return absl::InvalidArgumentError(
        "no parameter servers given (--servers=host:port,...)");
  }
  std::unique_ptr<PsClient> client(new PsClient());
  client->config_ = options.config;
  client->fingerprint_ = common::ConfigFingerprint(client->config_);
  client->worker_rank_ = options.worker_rank;
  client->num_workers_ = options.num_workers;
  client->stop_ = options.stop;
  client->log_every_ = options.log_every;
  client->session_ = options.session != 0 ? options.session : DrawSession();
  client->replaces_session_ = options.replaces_session;
  const int shards = static_cast<int>(options.server_addresses.size());
  client->addresses_ = options.server_addresses;
  client->peer_timeout_ = options.peer_timeout;
  client->credentials_ = options.credentials;
  if (!options.auth_token.empty()) {
    client->authorization_ = common::BearerValue(options.auth_token);
  }
  client->taken_over_.assign(shards, false);
  for (const std::string& address : options.server_addresses) {
    client->shards_.push_back(client->Connection(address));
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
    client->replicas_ = std::max(client->replicas_, response->replicas());
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
  return EndSession(worker_rank_, session_, timeout, finished);
}

absl::Status PsClient::EndSessionOf(int rank, uint64_t session,
                                    absl::Duration timeout) {
  if (worker_rank_ != -1) {
    return absl::FailedPreconditionError(
        "only a client of rank -1 (a launcher) ends another process's session");
  }
  return EndSession(rank, session, timeout, /*finished=*/false);
}

absl::Status PsClient::EndSession(int rank, uint64_t session,
                                  absl::Duration timeout, bool finished) {
  LeaveRequest request;
  request.set_worker_rank(rank);
  request.set_config_fingerprint(fingerprint_);
  request.set_session(session);
  return CallEverywhere(timeout, [&](int s, grpc::ClientContext* context) {
    request.set_shard(s);
    LeaveResponse response;
    return finished ? shards_[s].stub->FinishRank(context, request, &response)
                    : shards_[s].stub->Leave(context, request, &response);
  });
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
  CloseRunRequest request;
  request.set_config_fingerprint(fingerprint_);
  return CallEverywhere(timeout, [&](int s, grpc::ClientContext* context) {
    request.set_shard(s);
    CloseRunResponse response;
    // A replicated range taken over while this client made no call that
    // would have followed it: the process here holds only its backup, or
    // is gone. The
    // copy that serves it closes the run (it checks that every worker
    // finished) and forwards the close to this one, whose process then
    // stops; this client does not call it.
    StatsRequest asked;
    asked.set_shard(s);
    StatsResponse here;
    grpc::ClientContext stats_context;
    shards_[s].Prepare(&stats_context);
    stats_context.set_deadline(context->deadline());
    const grpc::Status asked_here =
        shards_[s].stub->Stats(&stats_context, asked, &here);
    // Or the process is gone, and was not started again: the copy that
    // took its range over closes it (a copy that does not serve the range
    // answers UNAVAILABLE, saying where it is).
    const bool gone = replicas_ > 0 &&
                      asked_here.error_code() == grpc::StatusCode::UNAVAILABLE;
    if ((asked_here.ok() && OnlyBacksUp(here)) || gone) {
      Shard other = OtherProcessOf(s);
      grpc::ClientContext first;
      other.Prepare(&first);
      first.set_deadline(context->deadline());
      return other.stub->CloseRun(&first, request, &response);
    }
    return shards_[s].stub->CloseRun(context, request, &response);
  });
}

bool PsClient::OnlyBacksUp(const StatsResponse& stats) {
  return stats.replica_role() == StatsResponse::BACKUP ||
         stats.replica_role() == StatsResponse::FENCED;
}

PsClient::Shard PsClient::OtherProcessOf(int s) const {
  const int n = num_shards();
  return Connection(addresses_[taken_over_[s] ? s : (s + 1) % n]);
}

absl::Status PsClient::CallEverywhere(
    absl::Duration timeout,
    const std::function<grpc::Status(int s, grpc::ClientContext* context)>&
        call) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status first;
  for (int s = 0; s < num_shards(); ++s) {
    grpc::ClientContext context;
    shards_[s].Prepare(&context);
    context.set_deadline(absl::ToChronoTime(deadline));
    grpc::Status status = call(s, &context);
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
  // Two passes: the first waits for every shard to answer; the second
  // reads where each shard is once all are back. A shard that stayed up
  // may have closed a step after the first pass read it (a push of this
  // worker still in flight when the connection was lost), and a repeated
  // step that a restarted shard lost is recognized by the position of the
  // shards that did not go back (PushHeader.resume_point).
  for (int pass = 0; pass < 2; ++pass) {
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
      if (pass == 0 && worker_rank_ >= 0) {
        NoteResumed(s, response->samples_applied());
      }
      applied_samples_ =
          s == 0 ? response->samples_applied()
                 : ResumePoint(applied_samples_, response->samples_applied());
    }
  }
  // The loop repeats its step now, on the weights as the shards have them
  // (and Push's examples follow on from where the shards are).
  repeat_next_push_ = true;
  next_sample_offset_ = applied_samples_;
  return absl::OkStatus();
}

}  // namespace monsoon::worker
