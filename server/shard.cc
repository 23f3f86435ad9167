#include "server/shard.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/log.h"
#include "server/checkpoint.h"

namespace monsoon::server {

Shard::Shard(const TrainingConfig& resolved, int num_workers, ShardState* state,
             UpdateRule* rule, absl::Duration max_wait,
             ShardSparseTables* sparse, Replication* replication)
    : config_(resolved),
      fingerprint_(common::ConfigFingerprint(resolved)),
      num_workers_(num_workers),
      state_(state),
      rule_(rule),
      max_wait_(max_wait),
      mode_(resolved.mode()),
      sparse_(sparse),
      replication_(replication) {
  // The backup applies what this copy applied (Shard::ForwardOf).
  if (replication_ != nullptr) rule_->HandOutAppliedGradients();
  if (replication_ != nullptr && mode_ == SYNC) {
    // A sync step is forwarded once it has closed (the summed update, once
    // per step), on one thread: in order, off gRPC's threads.
    publisher_ = std::make_unique<TaskThreads>(1);
    rule_->PublishStepsThrough([this](std::shared_ptr<const SyncStep> step) {
      publisher_->Run([this, step = std::move(step)] { PublishStep(step); });
    });
  }
}

absl::StatusOr<RepairResponse> Shard::Repair(const RepairRequest& request) {
  if (request.config_fingerprint() != fingerprint_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "a copy of shard %d's range was asked for by a process of another "
        "config (fingerprint %016x, this one's %016x)",
        state_->shard(), request.config_fingerprint(), fingerprint_));
  }
  if (replication_ == nullptr || request.shard() != state_->shard()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this process holds no replicated copy of shard ", request.shard(),
        "'s range"));
  }
  absl::StatusOr<int64_t> epoch = replication_->AttachBackup();
  if (!epoch.ok()) return OfThisShard(epoch.status());
  // Taken after the forwards began: every update the copy lacks is
  // forwarded (those it has, the backup answers as done).
  const RuleState saved = rule_->SaveState();
  replication_->CopiedAt(saved.version);
  RepairResponse response;
  response.set_range_epoch(*epoch);
  ShardCheckpoint copy = CheckpointOf(saved, *state_, config_);
  // The rows after the weights, as a checkpoint takes them: a row push
  // applied meanwhile is in the copy or, after it, forwarded.
  if (sparse_ != nullptr) sparse_->SaveTo(&copy);
  copy.SerializeToString(response.mutable_checkpoint());
  response.mutable_pull_residual()->Add(saved.pull_residual.begin(),
                                        saved.pull_residual.end());
  common::Log("shard %d: its range copied at version %d for its backup",
              state_->shard(), saved.version);
  return response;
}

void Shard::PublishStep(const std::shared_ptr<const SyncStep>& step) {
  PushData forward;
  forward.base_version = step->version - 1;
  forward.values = absl::MakeConstSpan(step->mean.get(), state_->size());
  forward.step = step;
  if (absl::Status forwarded = replication_->Forward(forward, step->version);
      !forwarded.ok()) {
    common::LogWarning(
        "shard %d: step %d is not acknowledged (%s); the workers waiting for "
        "it are told to go to the range's backup",
        state_->shard(), step->version - 1, forwarded.message());
    state_->ExpireWaiters(absl::InfiniteFuture());
    return;
  }
  state_->RunWaiters(state_->AdvanceVersion(step->version));
}

absl::Status Shard::CheckServing() const {
  if (replication_ == nullptr) return absl::OkStatus();
  return OfThisShard(replication_->CheckServing());
}

absl::Status Shard::CheckCaller(uint64_t fingerprint, int shard) const {
  if (fingerprint != fingerprint_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("config fingerprint %016x differs from shard %d's "
                        "%016x: every daemon of a run must read the same "
                        "config (data_dir aside)",
                        fingerprint, state_->shard(), fingerprint_));
  }
  if (shard != state_->shard()) {
    return absl::InvalidArgumentError(
        absl::StrCat("this is shard ", state_->shard(), ", not shard ", shard,
                     ": list --servers in shard order"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RegisterResponse> Shard::Register(
    const RegisterRequest& request) {
  if (absl::Status caller =
          CheckCaller(request.config_fingerprint(), request.shard());
      !caller.ok()) {
    return caller;
  }
  // The counts are not in the config (nor its fingerprint): a worker told
  // another worker count would train on the wrong part of the data.
  if (request.num_workers() != 0 && request.num_workers() != num_workers_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this worker was started with --num_workers=", request.num_workers(),
        " but shard ", state_->shard(), " with --num_workers=", num_workers_,
        ": every daemon of a run must be given the same worker count"));
  }
  if (request.num_shards() != 0 &&
      request.num_shards() != state_->num_shards()) {
    return absl::FailedPreconditionError(
        absl::StrCat("this client lists ", request.num_shards(),
                     " shards in --servers but shard ", state_->shard(),
                     " was started with --num_shards=", state_->num_shards(),
                     ": list every shard, in shard order"));
  }
  if (request.worker_rank() < -1 || request.worker_rank() >= num_workers_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker rank ", request.worker_rank(), " is outside [0, ", num_workers_,
        ") (-1 for an evaluator): check --num_workers"));
  }
  if (request.leaving() || request.finished()) {
    // A client of an older build, which left through Register: taken as a
    // registration, its leave would bind the rank again.
    return absl::FailedPreconditionError(
        "leaving, finishing a rank and closing the run are their own calls "
        "(Leave, FinishRank, CloseRun): this client is of an older build "
        "than the shard; run one build of Monsoon for every daemon");
  }
  if (replication_ != nullptr) {
    bool took_over = false;
    absl::Status serving = request.take_over()
                               ? replication_->TakeOver(&took_over)
                               : replication_->CheckServing();
    if (!serving.ok()) return OfThisShard(serving);
    if (took_over) AdoptRanks();
  } else if (request.take_over()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", state_->shard(),
        " was asked to take over a range, but this process runs without "
        "--replicas: give every ps_server of the run the same --replicas"));
  }
  if (request.worker_rank() >= 0 && state_->elastic() &&
      state_->WorkersFinished()) {
    // OUT_OF_RANGE, as for reading past the end: nothing is left to train
    // (ps_worker exits 0 on it).
    return absl::OutOfRangeError(absl::StrCat(
        "shard ", state_->shard(), ": rank ", request.worker_rank(),
        " cannot join: the run's data is all trained and its workers have "
        "finished"));
  }
  if (request.worker_rank() >= 0) {
    // Another process held the rank (its lease ran out): what it had in
    // hand of the data goes back to the queue.
    const bool replaces =
        !state_->CheckSession(request.worker_rank(), request.session()).ok();
    if (absl::Status session =
            state_->OpenSession(request.worker_rank(), request.session(),
                                request.replaces_session());
        !session.ok()) {
      common::LogWarning("shard %d: refused a registration: %s",
                         state_->shard(), session.ToString());
      return session;
    }
    if (replaces && state_->ReleaseData(request.worker_rank())) {
      common::Log(
          "shard %d: rank %d's unfinished data shard went back to the "
          "queue (a new process holds the rank)",
          state_->shard(), request.worker_rank());
    }
    common::Log(
        "shard %d: rank %d registered (its data resumes at example "
        "%d)",
        state_->shard(), request.worker_rank(),
        state_->SamplePosition(request.worker_rank()));
  }
  RegisterResponse response;
  response.set_shard(state_->shard());
  response.set_num_shards(state_->num_shards());
  response.set_offset(state_->range().begin);
  response.set_length(state_->size());
  response.set_version(state_->version());
  if (replication_ != nullptr) {
    response.set_replicas(1);
    response.set_range_epoch(replication_->epoch());
  }
  if (request.worker_rank() >= 0) {
    response.set_samples_applied(state_->SamplePosition(request.worker_rank()));
  }
  return response;
}

absl::Status Shard::EndSession(const LeaveRequest& request, const char* what) {
  if (absl::Status caller =
          CheckCaller(request.config_fingerprint(), request.shard());
      !caller.ok()) {
    return caller;
  }
  if (request.worker_rank() < 0 || request.worker_rank() >= num_workers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker rank ", request.worker_rank(), " is outside [0, ",
                     num_workers_, "): check --num_workers"));
  }
  if (request.from_primary()) {
    // The range's primary ended the session (Replication::ForwardSessionEnd):
    // this copy, the range's backup, takes it at the primary's epoch.
    if (absl::Status accepted = AcceptFromPrimary(
            request.replica_epoch(), absl::StrCat("a rank's ", what));
        !accepted.ok()) {
      return accepted;
    }
    state_->EndSessionAsPrimaryDid(request.worker_rank(), request.session());
    rule_->DropWorker(request.worker_rank());
    return absl::OkStatus();
  }
  if (absl::Status serving = CheckServing(); !serving.ok()) return serving;
  // Only the rank's holder (or a worker of a rank this shard has not seen
  // register, as after the shard's restart) may end it or finish it.
  if (absl::Status held =
          state_->CheckSession(request.worker_rank(), request.session());
      !held.ok()) {
    common::LogWarning("shard %d: refused a %s: %s", state_->shard(), what,
                       held.ToString());
    return held;
  }
  state_->EndSession(request.worker_rank(), request.session());
  rule_->DropWorker(request.worker_rank());
  if (state_->ReleaseData(request.worker_rank())) {
    common::Log("shard %d: rank %d's unfinished data shard went back to the "
                "queue",
                state_->shard(), request.worker_rank());
  }
  return absl::OkStatus();
}

absl::StatusOr<TakeDataResponse> Shard::TakeData(
    const TakeDataRequest& request) {
  if (absl::Status caller =
          CheckCaller(request.config_fingerprint(), request.shard());
      !caller.ok()) {
    return caller;
  }
  const int rank = request.worker_rank();
  if (rank < 0 || rank >= num_workers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker rank ", rank, " is outside [0, ", num_workers_,
                     "): check --num_workers"));
  }
  if (absl::Status serving = CheckServing(); !serving.ok()) return serving;
  DataQueue* queue = state_->data_queue();
  if (queue == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", state_->shard(),
        state_->elastic() ? " does not keep the data queue (shard 0 does)"
                          : " runs a config without elastic: its workers "
                            "split the data by rank"));
  }
  if (absl::Status held = state_->CheckSession(rank, request.session());
      !held.ok()) {
    return held;
  }
  // A rank that left to wait for data outside the barrier (sync) may ask;
  // its call does not bring it back (Touch ignores a rank that left).
  state_->Touch(rank);  // renews the rank's lease
  std::optional<DataShard> done;
  if (request.has_done()) {
    done = DataShard{request.done().epoch(), request.done().index(), 0, 0};
  }
  absl::StatusOr<DataQueue::Answer> answer = queue->Take(
      rank, done, request.next_offset(), request.examples_per_epoch());
  if (!answer.ok()) return answer.status();
  TakeDataResponse response;
  switch (answer->kind) {
    case DataQueue::Kind::kShard:
      response.set_kind(TakeDataResponse::SHARD);
      response.mutable_shard()->set_epoch(answer->shard.epoch);
      response.mutable_shard()->set_index(answer->shard.index);
      response.set_first_batch(answer->shard.first_batch);
      response.set_batches(answer->shard.batches);
      break;
    case DataQueue::Kind::kWait:
      response.set_kind(TakeDataResponse::WAIT);
      break;
    case DataQueue::Kind::kFinished:
      response.set_kind(TakeDataResponse::FINISHED);
      break;
  }
  response.set_batches_per_epoch(queue->counts().batches_per_epoch);
  return response;
}

absl::Status Shard::Leave(const LeaveRequest& request) {
  if (absl::Status ended = EndSession(request, "leave"); !ended.ok()) {
    return ended;
  }
  if (request.from_primary()) return absl::OkStatus();
  common::Log("shard %d: rank %d left (stopping)", state_->shard(),
              request.worker_rank());
  TellBackupOfSessionEnd(request, /*finished=*/false);
  return absl::OkStatus();
}

absl::Status Shard::FinishRank(const LeaveRequest& request) {
  if (absl::Status ended = EndSession(request, "finish"); !ended.ok()) {
    return ended;
  }
  const bool last = state_->FinishRank(request.worker_rank());
  if (request.from_primary()) return absl::OkStatus();
  common::Log("shard %d: rank %d finished its training%s", state_->shard(),
              request.worker_rank(), last ? "; every worker has finished" : "");
  TellBackupOfSessionEnd(request, /*finished=*/true);
  return absl::OkStatus();
}

void Shard::TellBackupOfSessionEnd(const LeaveRequest& request, bool finished) {
  if (replication_ == nullptr) return;
  // The rank is done here whatever the backup answers: a backup that did
  // not take it gives the rank a lease if it takes the range over
  // (AdoptRanks), and a finish it missed holds that copy's close.
  if (absl::Status told = replication_->ForwardSessionEnd(request, finished);
      !told.ok()) {
    common::LogWarning("shard %d: %s", state_->shard(), told.ToString());
  }
}

absl::Status Shard::CloseRun(const CloseRunRequest& request) {
  if (absl::Status caller =
          CheckCaller(request.config_fingerprint(), request.shard());
      !caller.ok()) {
    return caller;
  }
  // A close forwarded by the range's primary (Replication::ForwardClose):
  // the primary saw every worker finish; this copy, the range's backup,
  // ends too, so that its process saves its final checkpoint and stops.
  if (request.from_primary()) {
    if (absl::Status accepted =
            AcceptFromPrimary(request.replica_epoch(), "a close");
        !accepted.ok()) {
      return accepted;
    }
    if (absl::Status closed = state_->CloseRun(/*closed_by_primary=*/true);
        !closed.ok()) {
      return closed;
    }
    common::Log(
        "shard %d: the run is closed; this process holds the range's "
        "backup, and its primary closed it",
        state_->shard());
    return absl::OkStatus();
  }
  if (absl::Status serving = CheckServing(); !serving.ok()) return serving;
  // The finisher: the results are collected, the run is over.
  if (absl::Status closed = state_->CloseRun(); !closed.ok()) {
    common::LogWarning("shard %d: refused to close the run: %s",
                       state_->shard(), closed.ToString());
    return closed;
  }
  common::Log("shard %d: the run is closed (results collected)",
              state_->shard());
  if (replication_ == nullptr) return absl::OkStatus();
  return replication_->ForwardClose(request);
}

absl::Status Shard::AdmitPull(const PullRequest& request) {
  if (request.shard() != state_->shard()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pull for shard ", request.shard(), " reached shard ",
                     state_->shard()));
  }
  if (request.worker_rank() < -1 || request.worker_rank() >= num_workers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker rank ", request.worker_rank(), " is outside [-1, ",
                     num_workers_, ")"));
  }
  if (request.min_version() < 0) {
    return absl::InvalidArgumentError("min_version must not be negative");
  }
  if (absl::Status serving = CheckServing(); !serving.ok()) return serving;
  if (request.worker_rank() >= 0) {
    if (absl::Status held =
            state_->CheckSession(request.worker_rank(), request.session());
        !held.ok()) {
      return held;
    }
    state_->Touch(request.worker_rank());
  }
  return absl::OkStatus();
}

absl::Status Shard::CheckPushSession(int rank, uint64_t session,
                                     bool forwarded) {
  absl::Status held;
  if (forwarded) {
    if (replication_ == nullptr) {
      held = absl::InvalidArgumentError(absl::StrCat(
          "shard ", state_->shard(),
          " got a forwarded (replicated) push, but this process holds no "
          "backup of the range: give every ps_server of the run the same "
          "--replicas"));
    }
  } else {
    held = CheckServing();
    if (held.ok()) held = state_->CheckSession(rank, session);
  }
  if (!held.ok()) RejectPush(held);
  return held;
}

absl::Status Shard::CheckSparseCaller(const SparseCaller& caller, bool push) {
  if (absl::Status s = CheckCaller(caller.config_fingerprint(), caller.shard());
      !s.ok()) {
    return s;
  }
  if (sparse_ == nullptr || sparse_->empty()) {
    return absl::FailedPreconditionError(
        "this run has no sparse tables (TrainingConfig.sparse_tables)");
  }
  if (absl::Status serving = CheckServing(); !serving.ok()) return serving;
  const int rank = caller.worker_rank();
  if (rank < (push ? 0 : -1) || rank >= num_workers_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker rank ", rank, " is outside [", push ? 0 : -1, ", ",
        num_workers_, "): check --num_workers"));
  }
  if (rank == -1) return absl::OkStatus();
  if (push) {
    if (absl::Status held = CheckPushSession(rank, caller.session());
        !held.ok()) {
      return held;
    }
    state_->Touch(rank);  // renews the rank's lease
    return absl::OkStatus();
  }
  return state_->CheckSession(rank, caller.session());
}

absl::Status Shard::CheckRendezvousCaller(const SparseCaller& caller) {
  if (absl::Status s = CheckCaller(caller.config_fingerprint(), caller.shard());
      !s.ok()) {
    return s;
  }
  if (mode_ != ALLREDUCE || state_->shard() != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", state_->shard(), " serves no rendezvous: only shard 0 of a "
        "run in mode allreduce does (this run's mode is ",
        common::ModeName(mode_), ")"));
  }
  const int rank = caller.worker_rank();
  if (rank < 0 || rank >= num_workers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker rank ", rank, " is outside [0, ", num_workers_,
                     "): check --num_workers"));
  }
  if (absl::Status held = state_->CheckSession(rank, caller.session());
      !held.ok()) {
    return held;
  }
  state_->Touch(rank);  // renews the rank's lease
  return absl::OkStatus();
}

absl::Status Shard::RendezvousSet(const RendezvousSetRequest& request) {
  if (absl::Status s = CheckRendezvousCaller(request.caller()); !s.ok()) {
    return s;
  }
  return rendezvous_.Set(request.key(), request.value(),
                         request.caller().worker_rank(),
                         request.caller().session());
}

absl::StatusOr<RendezvousGetResponse> Shard::RendezvousGet(
    const RendezvousGetRequest& request) {
  if (absl::Status s = CheckRendezvousCaller(request.caller()); !s.ok()) {
    return s;
  }
  RendezvousGetResponse response;
  std::optional<Rendezvous::Value> value = rendezvous_.Get(request.key());
  // A value whose process has left, or whose rank another process holds
  // now, reads as unset: its address is gone.
  if (value.has_value() && !state_->HasLeft(value->rank) &&
      state_->CheckSession(value->rank, value->session).ok()) {
    response.set_found(true);
    response.set_value(std::move(value->value));
  }
  return response;
}

StatsResponse Shard::Stats() const {
  StatsResponse stats = state_->Stats();
  if (replication_ != nullptr) {
    stats.set_range_epoch(replication_->epoch());
    stats.set_replica_role(replication_->role_for_stats());
    stats.set_replicated_updates(replication_->replicated_updates());
    stats.set_take_overs(replication_->take_overs());
  }
  if (sparse_ != nullptr) {
    stats.set_row_pushes(sparse_->row_pushes());
    for (const auto& table : sparse_->tables()) {
      const SparseTableStats table_stats = table->stats();
      (*stats.mutable_sparse_rows())[table->config().name()] = table_stats.rows;
      (*stats.mutable_sparse_row_updates())[table->config().name()] =
          table_stats.row_updates;
      (*stats.mutable_sparse_rows_evicted())[table->config().name()] =
          table_stats.evicted;
    }
  }
  return stats;
}

absl::StatusOr<SparsePullResponse> Shard::SparsePull(
    const SparsePullRequest& request) {
  if (absl::Status s = CheckSparseCaller(request.caller(), /*push=*/false);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<SparsePullResponse> response = sparse_->Pull(request);
  // Workers' rows count as pulled bytes (the evaluator's do not, as for
  // the dense vector).
  if (response.ok() && request.caller().worker_rank() >= 0) {
    state_->RecordPulledBytes(static_cast<int64_t>(response->ByteSizeLong()));
  }
  return response;
}

absl::StatusOr<SparsePushResponse> Shard::SparsePush(
    const SparsePushRequest& request) {
  if (request.from_primary()) return SparsePushFromPrimary(request);
  if (absl::Status s = CheckSparseCaller(request.caller(), /*push=*/true);
      !s.ok()) {
    return s;
  }
  ShardSparseTables::Forward forward;
  if (replication_ != nullptr) {
    forward = [this, &request](int64_t seq, int64_t step) {
      return OfThisShard(replication_->ForwardRows(request, seq, step));
    };
  }
  absl::StatusOr<SparsePushResponse> response =
      sparse_->Push(request, state_->version(), forward);
  if (response.ok()) {
    state_->RecordSparsePushBytes(
        static_cast<int64_t>(request.ByteSizeLong()));
  }
  return response;
}

absl::StatusOr<SparsePushResponse> Shard::SparsePushFromPrimary(
    const SparsePushRequest& request) {
  if (absl::Status s = CheckCaller(request.caller().config_fingerprint(),
                                   request.caller().shard());
      !s.ok()) {
    return s;
  }
  if (replication_ == nullptr || sparse_ == nullptr || sparse_->empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a row push forwarded by a primary, but this process holds no "
        "replicated copy of shard ",
        state_->shard(), "'s tables"));
  }
  if (absl::Status accepted =
          replication_->AcceptRowsFromPrimary(request.replica_epoch());
      !accepted.ok()) {
    return accepted;
  }
  absl::Status applied = sparse_->ApplyForwarded(request);
  if (applied.code() == absl::StatusCode::kDataLoss) {
    replication_->RowsDiverged(std::string(applied.message()));
  }
  if (!applied.ok()) return applied;
  return SparsePushResponse();
}

void Shard::RejectPush(const absl::Status& status) {
  const int64_t rejected = state_->RecordRejectedPush(status.code());
  if (rejected <= 10 || (rejected & (rejected - 1)) == 0) {
    common::LogWarning("shard %d: refused a push (%d so far): %s",
                       state_->shard(), rejected, status.ToString());
  }
}

void Shard::ApplyForwarded(
    const PushData& push,
    std::function<void(absl::StatusOr<AppliedPush>)> done) {
  if (replication_ == nullptr) {
    done(CheckPushSession(push.worker_rank, push.session, /*forwarded=*/true));
    return;
  }
  auto applied = std::make_shared<AppliedPush>();
  applied->base_version = push.base_version;
  replication_->ApplyInOrder(
      push.replica_seq, push.replica_epoch,
      [this, &push, applied]() -> absl::Status {
        absl::StatusOr<PushResult> result = push.step != nullptr
                                                ? rule_->ApplyStep(push)
                                                : rule_->Apply(push);
        if (!result.ok()) return result.status();
        applied->result = *result;
        return absl::OkStatus();
      },
      [this, applied, done = std::move(done)](absl::Status status) {
        if (!status.ok()) {
          if (!absl::IsCancelled(status)) RejectPush(status);
          done(status);
          return;
        }
        done(*applied);
      });
}

void Shard::AbandonForwarded(int64_t seq) {
  if (replication_ != nullptr) replication_->Abandon(seq);
}

absl::Status Shard::Replicate(const PushData& push,
                              const AppliedPush& applied) {
  if (replication_ == nullptr) return absl::OkStatus();
  // A repeat is acknowledged once the backup has every update up to now:
  // its first acknowledgement may have been lost with the forward of the
  // update that applied it. A sync push is forwarded with its step, once
  // the step has closed (PublishStep), and acknowledged by the step's
  // version.
  if (mode_ == SYNC && !applied.result.duplicate) return absl::OkStatus();
  absl::Status forwarded =
      applied.result.duplicate
          ? replication_->AwaitForwarded(applied.result.version)
          : replication_->Forward(ForwardOf(push, applied),
                                  applied.result.version);
  return OfThisShard(forwarded);
}

PushData Shard::ForwardOf(const PushData& push, const AppliedPush& applied) {
  if (applied.result.applied_gradient == nullptr) return push;
  PushData forward = push;
  forward.values = *applied.result.applied_gradient;
  forward.encoding = ENCODING_FLOAT32;
  forward.onebit_bits = {};
  forward.onebit_scales = {};
  forward.max_abs = std::numeric_limits<float>::infinity();
  forward.buffer = nullptr;
  return forward;
}

void Shard::AdoptRanks() {
  // This copy has seen no worker's call: every rank would count as live
  // for good ("still starting"), and a rank whose process died before the
  // take-over, and that no process comes back for, would hold sync's
  // barrier and the staleness bound forever. A rank whose examples the
  // range has applied gets a lease from now instead: its process
  // registers again within it, or the run goes on without it.
  std::vector<int> adopted;
  for (int rank = 0; rank < num_workers_; ++rank) {
    if (state_->SamplePosition(rank) > 0) {
      state_->Touch(rank);
      adopted.push_back(rank);
    }
  }
  if (adopted.empty()) return;
  common::Log(
      "shard %d: ranks %s had trained on this range: each counts as live "
      "for a lease (%s) from the take-over, and as gone after it unless its "
      "process registers here",
      state_->shard(), absl::StrJoin(adopted, ","),
      absl::FormatDuration(state_->lease()));
}

absl::Status Shard::AcceptFromPrimary(int64_t epoch,
                                      const std::string& what) const {
  if (replication_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", state_->shard(), ": ", what,
        " forwarded by a primary, but this range is not replicated here "
        "(every ps_server of a run needs the same --replicas)"));
  }
  return replication_->AcceptFromPrimary(epoch);
}

absl::Status Shard::OfThisShard(const absl::Status& status) const {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("shard ", state_->shard(),
                                                  ": ", status.message()));
}

void Shard::ReplicateThen(const PushData& push, const AppliedPush& applied,
                          std::shared_ptr<const void> owner, TaskThreads* tasks,
                          std::function<void(absl::Status)> done) {
  if (replication_ == nullptr || (mode_ == SYNC && !applied.result.duplicate)) {
    return done(absl::OkStatus());  // see Replicate
  }
  if (applied.result.duplicate || owner == nullptr) {
    // A repeat waits for the forwards before it (AwaitForwarded), blocking.
    tasks->Run([this, push, applied, done = std::move(done)] {
      done(Replicate(push, applied));
    });
    return;
  }
  if (applied.result.applied_gradient != nullptr) {
    owner = applied.result.applied_gradient;  // what ForwardOf sends
  }
  replication_->ForwardThen(
      ForwardOf(push, applied), applied.result.version, std::move(owner),
      [this, done = std::move(done)](const absl::Status& forwarded) {
        done(OfThisShard(forwarded));
      });
}

absl::StatusOr<AppliedPush> Shard::ApplyPush(const PushData& push,
                                             bool answer_repeats) {
  if (push.replica_seq > 0) {
    return absl::InvalidArgumentError(
        "a forwarded push goes to Shard::ApplyForwarded");
  }
  if (absl::Status held = CheckPushSession(push.worker_rank, push.session);
      !held.ok()) {
    return held;
  }
  state_->Touch(push.worker_rank);  // renews the rank's lease
  AppliedPush applied;
  applied.base_version = push.base_version;
  absl::StatusOr<PushResult> result = rule_->Apply(push);
  if (result.ok()) {
    applied.result = *result;
    applied.replicate = replication_ != nullptr;
    return applied;
  }
  const absl::StatusCode code = result.status().code();
  if (answer_repeats && (code == absl::StatusCode::kAlreadyExists ||
                         code == absl::StatusCode::kAborted)) {
    applied.result.version = push.base_version;
    applied.result.duplicate = code == absl::StatusCode::kAlreadyExists;
    applied.result.stale = !applied.result.duplicate;
    applied.repeat_in_step = applied.result.duplicate;
    return applied;
  }
  RejectPush(result.status());
  return result.status();
}

int64_t Shard::VersionToAwait(const AppliedPush& push) {
  if (push.result.stale || (push.result.duplicate && !push.repeat_in_step)) {
    return 0;
  }
  if (push.result.await_version > 0) return push.result.await_version;
  return std::max(push.result.version, push.base_version + 1);
}

UpdateRule::PullAnswer Shard::Pull(int rank,
                                   std::optional<int64_t> have_version) {
  UpdateRule::PullAnswer answer = rule_->PullFrom(rank, have_version);
  rule_->Pulled(rank, answer.weights);
  return answer;
}

absl::Status Shard::WaitExpired(const char* what, int64_t min_version) const {
  // A primary fenced while the wait went on (replication): the range is
  // served elsewhere now.
  if (absl::Status serving = CheckServing(); !serving.ok()) return serving;
  if (state_->has_staleness_bound()) {
    const std::vector<std::string> waits =
        state_->DescribeClockWaits(absl::Now());
    return absl::DeadlineExceededError(absl::StrCat(
        what, " waited ", absl::FormatDuration(max_wait_),
        " (the shard's --max_wait_s) at shard ", state_->shard(),
        " for the slowest worker (bounded staleness: max_staleness)",
        waits.empty() ? "" : ": ", absl::StrJoin(waits, "; "),
        "; has a worker stopped without leaving?"));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      what, " waited ", absl::FormatDuration(max_wait_), " for version ",
      min_version, " of shard ", state_->shard(), ", which is at version ",
      state_->version(),
      " (the shard's --max_wait_s): is a worker of the sync step missing?"));
}

}  // namespace monsoon::server
