// TLS and mutual TLS between a shard and its clients, over real gRPC, with
// the test certificates in tests/testdata/tls (made by tools/make_certs.sh).
#include "common/tls.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard_server.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"
#include "worker/ps_client.h"

namespace monsoon {
namespace {

using ::monsoon::testutil::ResolvedConfig;
using ::monsoon::testutil::StatusIs;
using ::testing::HasSubstr;

constexpr char kConfig[] =
    "layer_sizes: [6, 5, 3] mode: DOWNPOUR optimizer: SGD learning_rate: 1 "
    "momentum: 0 chunk_bytes: 262144";

// A file of the test certificate set `set` ("run" or "other").
std::string Pem(const std::string& set, const std::string& name) {
  return "tests/testdata/tls/" + set + "/" + name;
}

common::TlsFiles ServerFiles(bool mutual) {
  return {Pem("run", "server.pem"), Pem("run", "server.key"),
          mutual ? Pem("run", "ca.pem") : ""};
}

class TlsTest : public testing::Test {
 protected:
  void Start(bool mutual) {
    server::ShardServerOptions options;
    options.config = config_;
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
        common::ServerCredentialsFrom(ServerFiles(mutual));
    ASSERT_OK(credentials.status());
    options.credentials = *credentials;
    ASSERT_OK_AND_ASSIGN(server_, server::ShardServer::Start(options));
  }

  // Connects with `files` (plaintext when empty) and pushes once.
  absl::Status ConnectAndPush(const common::TlsFiles& files) {
    worker::PsClientOptions options;
    options.server_addresses = {server_->address()};
    options.config = config_;
    options.connect_timeout = absl::Seconds(2);
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        common::ChannelCredentialsFrom(files);
    if (!credentials.ok()) return credentials.status();
    options.credentials = *credentials;
    absl::StatusOr<std::unique_ptr<worker::PsClient>> client =
        worker::PsClient::Connect(options);
    if (!client.ok()) return client.status();
    return (*client)->Push(std::vector<float>(53, 1.0f), {0}, 4);
  }

  const TrainingConfig config_ = ResolvedConfig(kConfig);
  std::unique_ptr<server::ShardServer> server_;
};

TEST_F(TlsTest, MutualTlsAdmitsOnlyClientsWithACertificateOfTheRunsCa) {
  ASSERT_NO_FATAL_FAILURE(Start(/*mutual=*/true));
  // Without a client certificate, with one of another CA, trusting another
  // CA, or in plaintext: the handshake fails, nothing reaches the service.
  EXPECT_THAT(ConnectAndPush({"", "", Pem("run", "ca.pem")}),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(
      ConnectAndPush({Pem("other", "client.pem"), Pem("other", "client.key"),
                      Pem("run", "ca.pem")}),
      StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(
      ConnectAndPush({Pem("run", "client.pem"), Pem("run", "client.key"),
                      Pem("other", "ca.pem")}),
      StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(ConnectAndPush({}), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(server_->state()->Stats().pushes(), 0);
  EXPECT_EQ(server_->state()->version(), 0);

  EXPECT_OK(ConnectAndPush({Pem("run", "client.pem"), Pem("run", "client.key"),
                            Pem("run", "ca.pem")}));
  EXPECT_EQ(server_->state()->version(), 1);
}

TEST_F(TlsTest, ServerOnlyTlsAdmitsClientsThatTrustItsCa) {
  ASSERT_NO_FATAL_FAILURE(Start(/*mutual=*/false));
  EXPECT_THAT(ConnectAndPush({}), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(ConnectAndPush({"", "", Pem("other", "ca.pem")}),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_OK(ConnectAndPush({"", "", Pem("run", "ca.pem")}));
  EXPECT_EQ(server_->state()->version(), 1);
}

TEST(TlsFilesTest, IncompleteOrUnreadableFilesAreInvalid) {
  EXPECT_THAT(common::ServerCredentialsFrom({Pem("run", "server.pem"), "", ""})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--tls_cert and --tls_key go together")));
  EXPECT_THAT(
      common::ServerCredentialsFrom({"", "", Pem("run", "ca.pem")}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("needs its own --tls_cert")));
  EXPECT_THAT(common::ServerCredentialsFrom(
                  {"no/such.pem", Pem("run", "server.key"), ""})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cannot read --tls_cert no/such.pem")));
  EXPECT_THAT(common::ChannelCredentialsFrom(
                  {Pem("run", "client.pem"), Pem("run", "client.key"), ""})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("needs --tls_ca")));
  // Nothing given: plaintext.
  EXPECT_OK(common::ServerCredentialsFrom({}).status());
  EXPECT_OK(common::ChannelCredentialsFrom({}).status());
}

}  // namespace
}  // namespace monsoon
