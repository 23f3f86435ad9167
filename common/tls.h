// TLS for the daemons, with gRPC's own credentials: the flags --tls_cert,
// --tls_key and --tls_ca turned into server and channel credentials. With a
// CA, a server requires and verifies client certificates (mutual TLS), and
// a client verifies the server against it. Without any, everything is
// plaintext. Stateless functions; thread-safe.
#ifndef MONSOON_COMMON_TLS_H_
#define MONSOON_COMMON_TLS_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace monsoon::common {

// PEM files, by path; empty: not given.
struct TlsFiles {
  std::string cert;  // this daemon's certificate (chain)
  std::string key;   // its private key
  std::string ca;    // the CA that signs the other side's certificates

  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// A server's credentials: plaintext when nothing is given; TLS with cert
// and key; mutual TLS when a CA is given too. INVALID_ARGUMENT when only
// one of cert and key is given, a CA without them, or a file cannot be
// read (naming it).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFrom(
    const TlsFiles& files);

// A client's credentials: plaintext when nothing is given; TLS trusting the
// CA (required) and, with cert and key, presenting them to a server that
// asks. INVALID_ARGUMENT when only one of cert and key is given, cert and
// key without a CA, or a file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
ChannelCredentialsFrom(const TlsFiles& files);

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_TLS_H_
