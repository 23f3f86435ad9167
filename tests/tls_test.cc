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

using ::monsoon::testutil::FreePort;
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

// Replicated shards (--replicas=1) dial each other as clients: under
// mutual TLS each presents a client certificate of the run's CA
// (ps_server --peer_tls_cert, the workers' client.pem) and every update
// reaches the backup. The shard's own certificate, for server
// authentication only, fails every handshake: each range goes on without
// its backup (DEGRADED), as ps_server's --peer_tls_cert help warns.
TEST(TlsReplicationTest, ShardsReachTheirBackupsWithAClientCertificate) {
  const TrainingConfig config = ResolvedConfig(kConfig);
  for (const bool client_pair : {true, false}) {
    SCOPED_TRACE(client_pair ? "client.pem" : "server.pem");
    const std::vector<int> ports = {FreePort(), FreePort()};
    const std::vector<std::string> addresses = {
        absl::StrCat("127.0.0.1:", ports[0]),
        absl::StrCat("127.0.0.1:", ports[1])};
    const std::string pair = client_pair ? "client" : "server";
    std::vector<std::unique_ptr<server::ShardServer>> servers;
    for (int s = 0; s < 2; ++s) {
      server::ShardServerOptions options;
      options.config = config;
      options.shard = s;
      options.num_shards = 2;
      options.num_workers = 1;
      options.listen_address = addresses[s];
      options.replicas = 1;
      options.servers = addresses;
      ASSERT_OK_AND_ASSIGN(options.credentials,
                           common::ServerCredentialsFrom(ServerFiles(true)));
      ASSERT_OK_AND_ASSIGN(
          options.peer_credentials,
          common::ChannelCredentialsFrom({Pem("run", pair + ".pem"),
                                          Pem("run", pair + ".key"),
                                          Pem("run", "ca.pem")}));
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<server::ShardServer> server,
                           server::ShardServer::Start(options));
      servers.push_back(std::move(server));
    }
    worker::PsClientOptions options;
    options.server_addresses = addresses;
    options.config = config;
    options.connect_timeout = absl::Seconds(10);
    ASSERT_OK_AND_ASSIGN(
        options.credentials,
        common::ChannelCredentialsFrom({Pem("run", "client.pem"),
                                        Pem("run", "client.key"),
                                        Pem("run", "ca.pem")}));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<worker::PsClient> client,
                         worker::PsClient::Connect(options));
    for (int k = 0; k < 3; ++k) {
      ASSERT_OK(client->Push(std::vector<float>(53, 1.0f), {k, k}, 4));
    }
    ASSERT_OK_AND_ASSIGN(std::vector<StatsResponse> stats,
                         client->Stats(absl::Seconds(5)));
    ASSERT_EQ(stats.size(), 2u);
    for (int s = 0; s < 2; ++s) {
      // Shard s's range has its backup in the other process.
      EXPECT_EQ(stats[s].replica_role(), client_pair
                                             ? StatsResponse::PRIMARY
                                             : StatsResponse::DEGRADED)
          << s;
      EXPECT_EQ(servers[1 - s]->backup_state()->version(),
                client_pair ? 3 : 0)
          << s;
    }
  }
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
