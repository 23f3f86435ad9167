// The flags with which ps_worker and ps_evaluator reach the shards, defined
// once: TLS (--tls_ca, --tls_cert, --tls_key), the run's token
// (--auth_token_file) and the timeouts (--connect_timeout_s,
// --peer_timeout_s). Each can also come from MONSOON_<NAME> (flag_env.h).
#ifndef MONSOON_WORKER_CLIENT_FLAGS_H_
#define MONSOON_WORKER_CLIENT_FLAGS_H_

#include "absl/status/status.h"
#include "worker/ps_client.h"

namespace monsoon::worker {

// Sets options' credentials, auth_token, connect_timeout and peer_timeout
// from the flags. INVALID_ARGUMENT (a configuration error) for a timeout
// out of range, or TLS files or a token file that cannot be read.
absl::Status ApplyClientFlags(PsClientOptions* options);

}  // namespace monsoon::worker

#endif  // MONSOON_WORKER_CLIENT_FLAGS_H_
