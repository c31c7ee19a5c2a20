// ClusterExchange against a real redis-server (tests/redis_util.h).

#include "src/cluster/cluster_exchange.h"

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster/redis_util.h"

namespace trafficrate {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using testing_util::FreePort;
using testing_util::RedisServer;

constexpr absl::Duration kTimeout = absl::Milliseconds(200);

ClusterUrl Url(int port, const std::string& password = "") {
  return testing_util::RedisUrl(port, password);
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
  // Only the keys a has: b's k2 is none of a's business.
  ASSERT_EQ((*seen_by_a)[0].keys.size(), 1u);
  EXPECT_EQ((*seen_by_a)[0].keys[0].name, "k1");
  EXPECT_EQ((*seen_by_a)[0].keys[0].demand, 10000);
  EXPECT_EQ((*seen_by_a)[0].keys[0].connections, 1u);
  // With k2 too, a reads both (unbounded demand is "inf").
  absl::StatusOr<std::vector<PeerFigures>> both = a.Exchange(
      {{"k1", 51200, 2}, {"k2", std::numeric_limits<double>::infinity(), 1}},
      kTimeout);
  ASSERT_TRUE(both.ok()) << both.status();
  ASSERT_EQ((*both)[0].keys.size(), 2u);
  EXPECT_EQ((*both)[0].keys[1].name, "k2");
  EXPECT_EQ((*both)[0].keys[1].demand, 7);
  EXPECT_EQ((*both)[0].keys[1].connections, 3u);
  absl::StatusOr<std::vector<PeerFigures>> seen_by_b = b.Exchange({}, kTimeout);
  ASSERT_TRUE(seen_by_b.ok()) << seen_by_b.status();
  ASSERT_THAT(Hosts(*seen_by_b), ElementsAre("a"));
  EXPECT_TRUE((*seen_by_b)[0].keys.empty());  // b asked for none
  seen_by_b = b.Exchange({{"k1", 10000, 1}, {"k2", 7, 3}}, kTimeout);
  ASSERT_TRUE(seen_by_b.ok()) << seen_by_b.status();
  ASSERT_EQ((*seen_by_b)[0].keys.size(), 2u);
  EXPECT_EQ((*seen_by_b)[0].keys[0].demand, 51200);
  EXPECT_TRUE(std::isinf((*seen_by_b)[0].keys[1].demand));
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

// Whatever another writer left in Redis under the zone's names: malformed
// figures are skipped, a host entry of the wrong type is skipped (and the
// exchange still succeeds), and nothing beyond this host's keys is read.
TEST(ClusterExchangeTest, GarbageInAnotherHostsEntryIsSkipped) {
  const int port = FreePort();
  RedisServer redis(port);
  ClusterExchange a(Url(port), "web", "a", 5000);
  ClusterExchange b(Url(port), "web", "b", 5000);
  ASSERT_TRUE(a.Exchange({}, kTimeout).ok());
  ASSERT_TRUE(b.Exchange({}, kTimeout).ok());
  ASSERT_TRUE(a.Exchange({}, kTimeout).ok());  // a now knows of b
  redisContext* c = redisConnect("127.0.0.1", port);
  ASSERT_TRUE(c != nullptr && c->err == 0);
  const char* commands[] = {
      "HSET trafficrate:web:host:b k1 garbage k2 -5_1 k3 nan_2 "
      "k4 1_99999999999 k5 3_4 k6 1_2_3 other 1_1",
      "SET trafficrate:web:host:x not-a-hash",
      "SADD trafficrate:web:hosts x",
  };
  for (const char* command : commands) {
    // Spaces inside a value are written as '_' here, then put back.
    std::vector<std::string> words = absl::StrSplit(command, ' ');
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (std::string& w : words) {
      std::replace(w.begin(), w.end(), '_', ' ');
      argv.push_back(w.data());
      lens.push_back(w.size());
    }
    auto* reply = static_cast<redisReply*>(redisCommandArgv(
        c, static_cast<int>(argv.size()), argv.data(), lens.data()));
    ASSERT_NE(reply, nullptr);
    EXPECT_NE(reply->type, REDIS_REPLY_ERROR) << command;
    freeReplyObject(reply);
  }
  redisFree(c);
  const std::vector<KeyFigures> mine = {{"k1", 1, 1}, {"k2", 1, 1},
                                        {"k3", 1, 1}, {"k4", 1, 1},
                                        {"k5", 1, 1}, {"k6", 1, 1}};
  ASSERT_TRUE(a.Exchange(mine, kTimeout).ok());  // learns of x
  absl::StatusOr<std::vector<PeerFigures>> seen = a.Exchange(mine, kTimeout);
  ASSERT_TRUE(seen.ok()) << seen.status();
  ASSERT_THAT(Hosts(*seen), ElementsAre("b"));
  ASSERT_EQ((*seen)[0].keys.size(), 1u);
  EXPECT_EQ((*seen)[0].keys[0].name, "k5");
  EXPECT_EQ((*seen)[0].keys[0].demand, 3);
  EXPECT_EQ((*seen)[0].keys[0].connections, 4u);
}

// Two instances under one host id (two hosts with the same hostname):
// each finds the other's writes, exchange after exchange; one instance
// that takes over from another finds its predecessor's once.
TEST(ClusterExchangeTest, TwoInstancesUnderOneHostIdAreNoticed) {
  const int port = FreePort();
  RedisServer redis(port);
  ClusterExchange first(Url(port), "web", "a", 5000);
  ASSERT_TRUE(first.Exchange({}, kTimeout).ok());
  ASSERT_TRUE(first.Exchange({}, kTimeout).ok());
  EXPECT_EQ(first.foreign_writes(), 0);
  ClusterExchange twin(Url(port), "web", "a", 5000);
  ASSERT_TRUE(twin.Exchange({}, kTimeout).ok());
  EXPECT_EQ(twin.foreign_writes(), 1);  // a takeover looks like this once
  ASSERT_TRUE(twin.Exchange({}, kTimeout).ok());
  EXPECT_EQ(twin.foreign_writes(), 0);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(first.Exchange({}, kTimeout).ok());
    ASSERT_TRUE(twin.Exchange({}, kTimeout).ok());
  }
  EXPECT_EQ(first.foreign_writes(), 3);
  EXPECT_EQ(twin.foreign_writes(), 3);
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
