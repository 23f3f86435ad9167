#include "common/tls.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace monsoon::common {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path);
  std::stringstream text;
  if (in) text << in.rdbuf();
  if (!in || text.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", what, " ", path,
                     " as PEM (tools/make_certs.sh makes a set)"));
  }
  return text.str();
}

absl::Status CheckPair(const TlsFiles& files) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: give both or neither");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFrom(
    const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureServerCredentials();
  if (absl::Status pair = CheckPair(files); !pair.ok()) return pair;
  if (files.cert.empty()) {
    return absl::InvalidArgumentError(
        "a server with --tls_ca needs its own --tls_cert and --tls_key");
  }
  absl::StatusOr<std::string> cert = ReadPem(files.cert, "--tls_cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(files.key, "--tls_key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!files.ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(files.ca, "--tls_ca");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
ChannelCredentialsFrom(const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureChannelCredentials();
  if (absl::Status pair = CheckPair(files); !pair.ok()) return pair;
  if (files.ca.empty()) {
    return absl::InvalidArgumentError(
        "a client with TLS needs --tls_ca, the CA that signed the servers' "
        "certificates");
  }
  grpc::SslCredentialsOptions options;
  absl::StatusOr<std::string> ca = ReadPem(files.ca, "--tls_ca");
  if (!ca.ok()) return ca.status();
  options.pem_root_certs = *ca;
  if (!files.cert.empty()) {
    absl::StatusOr<std::string> cert = ReadPem(files.cert, "--tls_cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem(files.key, "--tls_key");
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *cert;
    options.pem_private_key = *key;
  }
  return grpc::SslCredentials(options);
}

}  // namespace monsoon::common
