// ClusterExchange against a real redis-server (Debian's), started on a free
// loopback port by each test and stopped by pid.

#include "src/cluster_exchange.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

extern char** environ;

namespace trafficrate {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kTimeout = absl::Milliseconds(200);

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// redis-server on 127.0.0.1:port, no persistence.
class RedisServer {
 public:
  explicit RedisServer(int port, const std::string& password = "")
      : port_(port) {
    std::vector<std::string> args = {"redis-server",
                                     "--port",
                                     std::to_string(port),
                                     "--bind",
                                     "127.0.0.1",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--daemonize",
                                     "no",
                                     "--logfile",
                                     "/dev/null"};
    if (!password.empty()) {
      args.push_back("--requirepass");
      args.push_back(password);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    const int rc = posix_spawnp(&pid_, "redis-server", &actions, nullptr,
                                argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      pid_ = -1;
      ADD_FAILURE() << "cannot start redis-server (apt-get install "
                       "redis-server): "
                    << strerror(rc);
      return;
    }
    // Ready when it accepts a connection (at most 5 s).
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (absl::Now() < deadline && !Accepts()) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_TRUE(Accepts()) << "redis-server did not listen on " << port;
  }
  ~RedisServer() { Stop(); }

  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  bool Accepts() const {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    const bool ok =
        connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    return ok;
  }

  int port_;
  pid_t pid_ = -1;
};

ClusterUrl Url(int port, const std::string& password = "") {
  ClusterUrl url;
  url.host = "127.0.0.1";
  url.port = port;
  url.password = password;
  return url;
}

std::vector<std::string> Hosts(const std::vector<PeerFigures>& peers) {
  std::vector<std::string> hosts;
  for (const PeerFigures& p : peers) hosts.push_back(p.host);
  return hosts;
}

TEST(ClusterExchangeTest, TwoHostsSeeEachOthersFigures) {
  const int port = FreePort();
  RedisServer redis(port);
  ClusterExchange a(Url(port), "web", "a", 1000);
  ClusterExchange b(Url(port), "web", "b", 1000);
  // The first exchange only learns who is there.
  ASSERT_THAT(a.Exchange({{"k1", 51200, 2}}, kTimeout).value(), ElementsAre());
  ASSERT_THAT(b.Exchange({{"k1", 10000, 1}, {"k2", 7, 3}}, kTimeout).value(),
              ElementsAre());
  // a learned of b only now (its second exchange listed the hosts): it
  // reads b's figures from its third.
  EXPECT_THAT(a.Exchange({{"k1", 51200, 2}}, kTimeout).value(), ElementsAre());
  absl::StatusOr<std::vector<PeerFigures>> seen_by_a =
      a.Exchange({{"k1", 51200, 2}}, kTimeout);
  ASSERT_TRUE(seen_by_a.ok()) << seen_by_a.status();
  ASSERT_THAT(Hosts(*seen_by_a), ElementsAre("b"));
  ASSERT_EQ((*seen_by_a)[0].keys.size(), 2u);
  for (const KeyFigures& k : (*seen_by_a)[0].keys) {
    if (k.name == "k1") {
      EXPECT_EQ(k.demand, 10000);
      EXPECT_EQ(k.connections, 1u);
    } else {
      EXPECT_EQ(k.name, "k2");
      EXPECT_EQ(k.demand, 7);
      EXPECT_EQ(k.connections, 3u);
    }
  }
  absl::StatusOr<std::vector<PeerFigures>> seen_by_b = b.Exchange({}, kTimeout);
  ASSERT_TRUE(seen_by_b.ok()) << seen_by_b.status();
  ASSERT_THAT(Hosts(*seen_by_b), ElementsAre("a"));
  ASSERT_EQ((*seen_by_b)[0].keys.size(), 1u);
  EXPECT_EQ((*seen_by_b)[0].keys[0].demand, 51200);
  // b now has no active key: a still sees it, with none.
  const std::vector<PeerFigures> idle = a.Exchange({}, kTimeout).value();
  ASSERT_THAT(Hosts(idle), ElementsAre("b"));
  EXPECT_TRUE(idle[0].keys.empty());
  // Another zone is another namespace.
  ClusterExchange other(Url(port), "api", "c", 1000);
  ASSERT_TRUE(other.Exchange({{"k1", 1, 1}}, kTimeout).ok());
  EXPECT_THAT(other.Exchange({{"k1", 1, 1}}, kTimeout).value(), ElementsAre());
}

TEST(ClusterExchangeTest, AHostThatStopsDropsOutAfterItsTtl) {
  const int port = FreePort();
  RedisServer redis(port);
  ClusterExchange a(Url(port), "web", "a", 300);
  ClusterExchange b(Url(port), "web", "b", 300);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(a.Exchange({{"k", 1, 1}}, kTimeout).ok());
    ASSERT_TRUE(b.Exchange({{"k", 2, 1}}, kTimeout).ok());
  }
  EXPECT_THAT(Hosts(a.Exchange({{"k", 1, 1}}, kTimeout).value()),
              ElementsAre("b"));
  // b stops exchanging: within its 300 ms it is still seen, after it not.
  EXPECT_THAT(Hosts(a.Exchange({{"k", 1, 1}}, kTimeout).value()),
              ElementsAre("b"));
  absl::SleepFor(absl::Milliseconds(400));
  EXPECT_THAT(Hosts(a.Exchange({{"k", 1, 1}}, kTimeout).value()),
              ElementsAre());
  // ... and it has left the set: a newcomer learns only of a.
  ASSERT_TRUE(a.Exchange({{"k", 1, 1}}, kTimeout).ok());
  ClusterExchange c(Url(port), "web", "c", 300);
  ASSERT_TRUE(c.Exchange({}, kTimeout).ok());
  EXPECT_THAT(Hosts(c.Exchange({}, kTimeout).value()), ElementsAre("a"));
}

TEST(ClusterExchangeTest, NoServerOrASilentOneIsUnavailableWithinTheTimeout) {
  const int port = FreePort();
  ClusterExchange nobody(Url(port), "web", "a", 300);
  absl::Time start = absl::Now();
  absl::StatusOr<std::vector<PeerFigures>> r =
      nobody.Exchange({{"k", 1, 1}}, kTimeout);
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_FALSE(nobody.connected());

  // A listener that never answers (its backlog accepts the connection).
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 8), 0);
  ClusterExchange silent(Url(port), "web", "a", 300);
  start = absl::Now();
  r = silent.Exchange({{"k", 1, 1}}, kTimeout);
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_FALSE(silent.connected());
  close(fd);
}

TEST(ClusterExchangeTest, RecoversByItselfWhenRedisComesBack) {
  const int port = FreePort();
  ClusterExchange a(Url(port), "web", "a", 300);
  {
    RedisServer redis(port);
    ASSERT_TRUE(a.Exchange({{"k", 1, 1}}, kTimeout).ok());
    redis.Stop();
    EXPECT_TRUE(
        absl::IsUnavailable(a.Exchange({{"k", 1, 1}}, kTimeout).status()));
  }
  RedisServer again(port);
  EXPECT_TRUE(a.Exchange({{"k", 1, 1}}, kTimeout).ok());
  EXPECT_TRUE(a.connected());
}

TEST(ClusterExchangeTest, AuthenticatesAndNeverShowsThePassword) {
  const int port = FreePort();
  RedisServer redis(port, "hunter2-secret");
  ClusterExchange wrong(Url(port, "not-it"), "web", "a", 300);
  absl::StatusOr<std::vector<PeerFigures>> r =
      wrong.Exchange({{"k", 1, 1}}, kTimeout);
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("AUTH"));
  EXPECT_THAT(r.status().message(), Not(HasSubstr("not-it")));
  ClusterExchange none(Url(port), "web", "a", 300);
  r = none.Exchange({{"k", 1, 1}}, kTimeout);
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("NOAUTH"));
  ClusterExchange right(Url(port, "hunter2-secret"), "web", "a", 300);
  EXPECT_TRUE(right.Exchange({{"k", 1, 1}}, kTimeout).ok());
}

}  // namespace
}  // namespace trafficrate
