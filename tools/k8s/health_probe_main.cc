// health_probe: asks a gRPC server for its grpc.health.v1 status, as
// Kubernetes' native gRPC probe does, but also over TLS and mutual TLS,
// which the native probe cannot speak: the manifests run it as the shards'
// exec probe, and tests and people run it by hand (there is no
// grpc_health_probe in Debian).
//
//   health_probe --addr=127.0.0.1:5000 [--service=] [--wait_s=30]
//       [--tls_ca=ca.pem [--tls_cert=client.pem --tls_key=client.key]
//        [--tls_server_name=ps-0.ps]]
//
// The health service needs no auth token. Exit codes: 0 SERVING, 1 any
// other status or no answer (after retrying for --wait_s), 2 for a bad flag
// or an unreadable certificate.
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/daemon.h"
#include "common/tls.h"
#include "proto/health.grpc.pb.h"

ABSL_FLAG(std::string, addr, "", "host:port of the server.");
ABSL_FLAG(std::string, service, "", "Service name; empty: the server.");
ABSL_FLAG(double, timeout_s, 1, "Deadline of each Check call.");
ABSL_FLAG(double, wait_s, 0,
          "Keep asking until SERVING or this many "
          "seconds have passed (0: ask once).");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate that signed the server's certificate: turns "
          "TLS on.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate (with --tls_key), for a server that "
          "requires one (mutual TLS).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_server_name, "",
          "With TLS, the name to check the server's certificate against "
          "instead of --addr's host.");

namespace {

constexpr char kProgram[] = "health_probe";

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Checks a server's grpc.health.v1 status; exit 0 when SERVING.");
  absl::ParseCommandLine(argc, argv);
  const std::string addr = absl::GetFlag(FLAGS_addr);
  if (addr.empty() || absl::GetFlag(FLAGS_timeout_s) <= 0) {
    return monsoon::common::Fail(
        kProgram, monsoon::common::kExitConfigError,
        "give --addr=host:port and a positive --timeout_s");
  }
  const monsoon::common::TlsFiles tls{absl::GetFlag(FLAGS_tls_cert),
                                      absl::GetFlag(FLAGS_tls_key),
                                      absl::GetFlag(FLAGS_tls_ca)};
  auto credentials = monsoon::common::ChannelCredentialsFrom(tls);
  if (!credentials.ok()) {
    return monsoon::common::Fail(kProgram, monsoon::common::kExitConfigError,
                                 credentials.status());
  }
  grpc::ChannelArguments arguments;
  const std::string server_name = absl::GetFlag(FLAGS_tls_server_name);
  if (!server_name.empty()) {
    if (!tls.enabled()) {
      return monsoon::common::Fail(kProgram, monsoon::common::kExitConfigError,
                                   "--tls_server_name needs --tls_ca");
    }
    arguments.SetSslTargetNameOverride(server_name);
  }
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateCustomChannel(addr, *credentials, arguments));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(absl::GetFlag(FLAGS_service));
  const absl::Time give_up =
      absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_wait_s));
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(
        absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_timeout_s))));
    grpc::health::v1::HealthCheckResponse response;
    const grpc::Status status = stub->Check(&context, request, &response);
    std::string answer;
    if (status.ok()) {
      answer = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
          response.status());
      if (response.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
        std::printf("%s: %s\n", addr.c_str(), answer.c_str());
        return monsoon::common::kExitOk;
      }
    } else {
      answer = "no answer (" + status.error_message() + ")";
    }
    if (absl::Now() >= give_up) {
      std::printf("%s: %s\n", addr.c_str(), answer.c_str());
      return monsoon::common::kExitFailure;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}
