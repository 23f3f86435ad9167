#include "worker/client_flags.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/auth.h"
#include "common/daemon.h"
#include "common/tls.h"

ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate that signed the servers' certificates: turns "
          "TLS on (env MONSOON_TLS_CA).");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate (with --tls_key), for servers that require "
          "one (env MONSOON_TLS_CERT).");
ABSL_FLAG(std::string, tls_key, "",
          "PEM private key of --tls_cert (env MONSOON_TLS_KEY).");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the run's secret token, the same as the servers' "
          "(env MONSOON_AUTH_TOKEN_FILE).");
ABSL_FLAG(double, peer_timeout_s, 30,
          "Seconds a shard may stay silent before its connection counts as "
          "lost (a frozen or partitioned host): pinged after half, dropped "
          "after the rest (env MONSOON_PEER_TIMEOUT_S).");
ABSL_FLAG(int, num_shards, 0,
          "With one --servers address holding {i} (ps-{i}.ps:5000): the "
          "shard count, and the address of shard i is that with {i} "
          "replaced by i; with a list: 0, or the list's length "
          "(env MONSOON_NUM_SHARDS).");
ABSL_FLAG(uint64_t, session, 0,
          "The session this worker registers its rank with; 0 (the default) "
          "draws one at random. The launchers set it, to start a worker in "
          "place of one that died (--replaces_session); not for setting by "
          "hand: two processes of one rank and one session are not told "
          "apart (env MONSOON_SESSION).");
ABSL_FLAG(uint64_t, replaces_session, 0,
          "The session of a worker of this rank that died (its launcher saw "
          "it exit): the shards let this one take the rank at once, not once "
          "the dead one's lease has run out (env MONSOON_REPLACES_SESSION).");
ABSL_FLAG(double, connect_timeout_s, 60,
          "How long to keep trying to reach "
          "the servers at start-up.");

namespace monsoon::worker {

absl::StatusOr<std::vector<std::string>> ExpandServers(
    const std::vector<std::string>& servers, int num_shards) {
  constexpr absl::string_view kIndex = "{i}";
  if (num_shards < 0 || num_shards > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num_shards must be from 0 to 4096, got ", num_shards));
  }
  if (servers.size() == 1 && absl::StrContains(servers[0], kIndex)) {
    if (num_shards == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--servers=", servers[0],
                       " names shards by {i}: "
                       "give their count with --num_shards"));
    }
    std::vector<std::string> expanded;
    for (int i = 0; i < num_shards; ++i) {
      expanded.push_back(
          absl::StrReplaceAll(servers[0], {{kIndex, absl::StrCat(i)}}));
    }
    return expanded;
  }
  for (const std::string& server : servers) {
    if (absl::StrContains(server, kIndex)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--servers: {i} stands for every shard only in a single address, "
          "not in a list (",
          server, ")"));
    }
  }
  if (num_shards != 0 && static_cast<int>(servers.size()) != num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--servers lists ", servers.size(), " shards but --num_shards=",
        num_shards, ": list every shard, in shard order"));
  }
  return servers;
}

bool RefusedForHowItWasStarted(const absl::Status& connect) {
  const absl::StatusCode code = connect.code();
  return code == absl::StatusCode::kFailedPrecondition ||
         code == absl::StatusCode::kAlreadyExists ||
         code == absl::StatusCode::kInvalidArgument ||
         code == absl::StatusCode::kUnauthenticated;
}

absl::Status ApplyClientFlags(PsClientOptions* options) {
  absl::StatusOr<std::vector<std::string>> servers =
      ExpandServers(options->server_addresses, absl::GetFlag(FLAGS_num_shards));
  if (!servers.ok()) return servers.status();
  options->server_addresses = *std::move(servers);
  options->connect_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_connect_timeout_s));
  if (!(absl::GetFlag(FLAGS_peer_timeout_s) >= 2 &&
        absl::GetFlag(FLAGS_peer_timeout_s) <= 1e6)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--peer_timeout_s must be from 2 to 1e6 seconds, got ",
                     absl::GetFlag(FLAGS_peer_timeout_s)));
  }
  options->peer_timeout = absl::Seconds(absl::GetFlag(FLAGS_peer_timeout_s));
  options->session = absl::GetFlag(FLAGS_session);
  options->replaces_session = absl::GetFlag(FLAGS_replaces_session);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      common::ChannelCredentialsFrom({absl::GetFlag(FLAGS_tls_cert),
                                      absl::GetFlag(FLAGS_tls_key),
                                      absl::GetFlag(FLAGS_tls_ca)});
  if (!credentials.ok()) return credentials.status();
  options->credentials = *std::move(credentials);
  if (!absl::GetFlag(FLAGS_auth_token_file).empty()) {
    absl::StatusOr<std::string> token =
        common::ReadTokenFile(absl::GetFlag(FLAGS_auth_token_file));
    if (!token.ok()) return token.status();
    options->auth_token = *std::move(token);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PsClient>> ConnectWithClientFlags(
    PsClientOptions options, int* exit_code) {
  if (absl::Status applied = ApplyClientFlags(&options); !applied.ok()) {
    *exit_code = common::kExitConfigError;
    return applied;
  }
  absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(options);
  if (!client.ok()) {
    *exit_code = RefusedForHowItWasStarted(client.status())
                     ? common::kExitConfigError
                     : common::kExitFailure;
  }
  return client;
}

PsClientOptions ObserverOptions(const std::string& servers,
                                const TrainingConfig& config,
                                const absl::Notification* stop) {
  PsClientOptions options;
  options.server_addresses =
      absl::StrSplit(servers, ',', absl::SkipWhitespace());
  options.config = config;
  options.worker_rank = -1;
  options.stop = stop;
  options.log_every = absl::Seconds(10);
  return options;
}

}  // namespace monsoon::worker
