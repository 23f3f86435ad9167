// TcpProxy: a TCP forwarder on 127.0.0.1 for tests, which can freeze: from
// Freeze() on it neither reads nor writes, so its connections stay open but
// silent, as a SIGSTOPped peer or a partition without resets leaves them.
// Test-only. Its methods may be called from any thread.
#ifndef MONSOON_TESTS_TCP_PROXY_H_
#define MONSOON_TESTS_TCP_PROXY_H_

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace monsoon::testutil {

class TcpProxy {
 public:
  // Forwards every connection to 127.0.0.1:`target_port`. port() is 0 when
  // it could not listen (a test failure is recorded).
  explicit TcpProxy(int target_port);
  ~TcpProxy();  // closes every connection and joins the threads
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return port_; }
  std::string address() const;

  // Stops forwarding anything, in both directions, on every connection.
  void Freeze() { frozen_.store(true); }
  // Forwards again (connections that the peers closed meanwhile stay
  // closed).
  void Thaw() { frozen_.store(false); }

 private:
  void Accept();
  void Forward(int client, int server);

  int listen_fd_ = -1;
  int port_ = 0;
  const int target_port_;
  std::atomic<bool> frozen_{false};
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  absl::Mutex mu_;
  std::vector<std::thread> forwarders_ ABSL_GUARDED_BY(mu_);
};

}  // namespace monsoon::testutil

#endif  // MONSOON_TESTS_TCP_PROXY_H_
