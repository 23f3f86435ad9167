// The flags with which ps_worker, ps_evaluator and run_finisher reach the
// shards, defined once: TLS (--tls_ca, --tls_cert, --tls_key), the run's
// token (--auth_token_file), the timeouts (--connect_timeout_s,
// --peer_timeout_s), the shard count (--num_shards, for a --servers
// pattern) and a worker's session (--session, --replaces_session, which
// the launchers set). Each can also come from MONSOON_<NAME> (flag_env.h).
#ifndef MONSOON_WORKER_CLIENT_FLAGS_H_
#define MONSOON_WORKER_CLIENT_FLAGS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/ps_client.h"

namespace monsoon::worker {

// The shards' addresses in shard order: `servers` itself, or, for a single
// address holding "{i}", that address for every i from 0 to num_shards - 1
// ("ps-{i}.ps:5000" and 2: ps-0.ps:5000, ps-1.ps:5000), so that a count is
// all a deployment changes. INVALID_ARGUMENT for a pattern without a count,
// {i} in a list, a count outside [0, 4096], or a list whose length is not a
// nonzero num_shards.
absl::StatusOr<std::vector<std::string>> ExpandServers(
    const std::vector<std::string>& servers, int num_shards);

// Sets options' server_addresses (ExpandServers with --num_shards),
// credentials, auth_token, connect_timeout and peer_timeout from the flags.
// INVALID_ARGUMENT (a configuration error) for a timeout out of range, a
// bad --servers/--num_shards pair, or TLS files or a token file that cannot
// be read.
absl::Status ApplyClientFlags(PsClientOptions* options);

// Whether PsClient::Connect was refused for how the daemon was started (the
// counts, the config, a rank another live worker holds, the token), a
// configuration error not to be retried as is (exit code 2), rather than
// for something that may pass (exit code 1).
bool RefusedForHowItWasStarted(const absl::Status& connect);

// A daemon's client of the shards: ApplyClientFlags(&options), then
// PsClient::Connect(options). When either fails, *exit_code is the daemon's
// exit code for it: common::kExitConfigError for a bad flag or a refusal for
// how the daemon was started (RefusedForHowItWasStarted),
// common::kExitFailure otherwise.
absl::StatusOr<std::unique_ptr<PsClient>> ConnectWithClientFlags(
    PsClientOptions options, int* exit_code);

// The options of a client of rank -1 (an evaluator, the run's finisher) of
// `servers` (comma-separated host:port, in shard order), stopped by `stop`,
// logging every 10 s what it waits for.
PsClientOptions ObserverOptions(const std::string& servers,
                                const TrainingConfig& config,
                                const absl::Notification* stop);

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_CLIENT_FLAGS_H_
