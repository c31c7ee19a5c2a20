// ClusterAgent: two "hosts" (two zones of this process, each with its own
// agent) sharing a key's rate through a real redis-server
// (tests/redis_util.h). The tests drive the agents' passes themselves
// (PassForTesting); one test runs the agent's own thread.

#include "src/cluster/cluster_agent.h"

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "src/base/log.h"
#include "src/shm/key_budget.h"
#include "src/shm/zone.h"
#include "src/shm/zone_layout.h"
#include "tests/cluster/redis_util.h"
#include "tests/shm/zone_fixture.h"

namespace trafficrate {
namespace {

using testing_util::FreePort;
using testing_util::kOneMiB;
using testing_util::kRate;
using testing_util::MakeKey;
using testing_util::PollUntil;
using testing_util::RedisServer;
using testing_util::RedisUrl;
using testing_util::TestKey;

constexpr char kSecret[] = "test-secret-0123456789";

// One host: a zone, this process's slot in it, and its agent.
struct Host {
  std::string zone_name;
  std::unique_ptr<Zone> zone;
  uint32_t proc = kNoSlot;
  std::unique_ptr<ClusterAgent> agent;
  uint32_t key = kNoSlot;  // the client's key slot
};

class ClusterAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = FreePort();
    redis_ = std::make_unique<RedisServer>(port_);
  }

  void TearDown() override {
    for (Host& h : hosts_) {
      h.agent.reset();
      h.zone.reset();
      (void)ZoneSegment::Unlink(h.zone_name);
    }
  }

  // A new host; decay: its TRAFFICRATE_CLUSTER_DECAY.
  Host& AddHost(const std::string& id, int64_t decay_ns = kNsPerSec) {
    Host& h = hosts_[count_++];
    h.zone_name = testing_util::UniqueZoneName(id);
    (void)ZoneSegment::Unlink(h.zone_name);
    absl::StatusOr<std::unique_ptr<Zone>> zone =
        Zone::OpenOrCreate(h.zone_name, kOneMiB, kRate);
    EXPECT_TRUE(zone.ok()) << zone.status();
    h.zone = std::move(*zone);
    h.proc = ClaimProc(*h.zone, 1);
    h.agent = std::make_unique<ClusterAgent>(h.zone.get(), &logger_,
                                             Options(id, decay_ns));
    return h;
  }

  // The agent options of host `id` (another process of its zone takes the
  // same).
  ClusterAgentOptions Options(const std::string& id,
                              int64_t decay_ns = kNsPerSec) const {
    ClusterAgentOptions options;
    options.url = RedisUrl(port_);
    options.name = "fleet";  // the same on every host
    options.secret = kSecret;
    options.host_id = id;
    options.decay_ns = decay_ns;
    return options;
  }

  // A process slot for this process. Its liveness mutex is let go at once:
  // robust mutexes held by one thread in two zones would link one zone's
  // into the other's (a process of the library uses one zone), or into an
  // unmapped one after a test; nothing here reaps.
  static uint32_t ClaimProc(Zone& zone, int64_t now_ns) {
    HeldMutex liveness;
    uint32_t proc = kNoSlot;
    {
      ZoneLock lock(zone);
      EXPECT_TRUE(lock.ok());
      proc = zone.procs().ClaimLocked(getpid(), now_ns, &liveness);
    }
    EXPECT_TRUE(liveness.Release());
    return proc;
  }

  // n more sending connections of the client on host h.
  // rule: the key's rule place in h's zone.
  static void Send(Host& h, int n, uint8_t rule = 0) {
    ZoneLock lock(*h.zone);
    ASSERT_TRUE(lock.ok());
    TestKey key = MakeKey(1);
    key.bytes[kKeyRuleByte] = rule;
    h.key = h.zone->keys().FindOrInsertLocked(key.bytes, MonotonicNowNs());
    ASSERT_NE(h.key, kNoSlot);
    for (int i = 0; i < n; ++i) {
      const uint32_t c = h.zone->conns().RegisterLocked(
          h.key, h.proc, 100 + i, testing_util::kPeer, 4242);
      ASSERT_NE(c, kNoSlot);
      ASSERT_TRUE(h.zone->conns().JoinLocked(c));
    }
  }

  // A pass of every host, `rounds` times: a host reads a newcomer's
  // figures from its third exchange after the newcomer's first.
  void Exchange(int rounds = 3) {
    for (int r = 0; r < rounds; ++r) {
      for (int i = 0; i < count_; ++i) {
        ASSERT_TRUE(
            hosts_[i].agent->PassForTesting(hosts_[i].proc, MonotonicNowNs()));
      }
    }
  }

  static uint64_t Share(const Host& h) {
    return h.zone->keys().slot(h.key).cluster_share.load();
  }
  static uint64_t Rate(const Host& h) {
    return h.zone->settings().KeyRate(h.zone->keys().slot(h.key));
  }

  int port_ = 0;
  std::unique_ptr<RedisServer> redis_;
  Logger logger_;  // to stderr
  Host hosts_[3];
  int count_ = 0;
};

TEST_F(ClusterAgentTest, TwoAndTwoConnectionsHalveTheRate) {
  Host& a = AddHost("a");
  Host& b = AddHost("b");
  Send(a, 2);
  Send(b, 2);
  Exchange();
  EXPECT_EQ(Share(a), kRate / 2);
  EXPECT_EQ(Share(b), kRate / 2);
  EXPECT_EQ(Rate(a), kRate / 2);  // what the key's connections are paced to
  const KeySlotShm& key = a.zone->keys().slot(a.key);
  EXPECT_EQ(key.cluster_active.load(), 4u);
  EXPECT_EQ(key.cluster_hosts.load(), 2u);
  const ClusterShm& c = a.zone->settings().cluster();
  EXPECT_EQ(c.state.load(), kClusterConnected);
  EXPECT_EQ(c.peers.load(), 1u);
  EXPECT_GE(c.exchanges.load(), 3u);
  EXPECT_EQ(c.failures.load(), 0u);
  EXPECT_EQ(c.pid.load(), getpid());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(c.host)), "a");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(c.name)), "fleet");
}

// Rules match across hosts by name, not by their place in each zone (a
// reload may give the same rule another place on one host); a client under
// two rules is two keys in the fleet too.
TEST_F(ClusterAgentTest, ARuleIsTheSameKeyOnEveryHostWhateverItsPlace) {
  Host& a = AddHost("a");
  Host& b = AddHost("b");
  a.zone->settings().SetRule(1, "downloads", kRate, 0, KeySpec());
  b.zone->settings().SetRule(3, "downloads", kRate, 0, KeySpec());
  b.zone->settings().SetRule(1, "api", kRate, 0, KeySpec());
  Send(a, 1, 1);
  Send(b, 3, 3);
  Exchange();
  EXPECT_EQ(Share(a), kRate / 4);
  EXPECT_EQ(Share(b), kRate * 3 / 4);
  Host& c = AddHost("c");
  c.zone->settings().SetRule(1, "api", kRate, 0, KeySpec());
  Send(c, 1, 1);  // another rule: another key
  Exchange();
  EXPECT_EQ(Rate(c), kRate);
  EXPECT_EQ(Share(a), kRate / 4);
}

TEST_F(ClusterAgentTest, SharesFollowTheConnectionsOnEachHost) {
  Host& a = AddHost("a");
  Host& b = AddHost("b");
  Send(a, 3);
  Send(b, 1);
  Exchange();
  EXPECT_EQ(Share(a), kRate * 3 / 4);
  EXPECT_EQ(Share(b), kRate / 4);
  // A third host joins with 4 more: a has 3 of 8.
  Host& c = AddHost("c");
  Send(c, 4);
  Exchange();
  EXPECT_EQ(Share(a), kRate * 3 / 8);
  EXPECT_EQ(Share(b), kRate / 8);
  EXPECT_EQ(Share(c), kRate / 2);
  EXPECT_EQ(a.zone->settings().cluster().peers.load(), 2u);
}

TEST_F(ClusterAgentTest, AKeyOnOneHostOnlyKeepsTheWholeRate) {
  Host& a = AddHost("a");
  Host& b = AddHost("b");
  Send(a, 2);
  Exchange();
  EXPECT_EQ(Rate(a), kRate);
  EXPECT_EQ(b.zone->settings().cluster().peers.load(), 1u);
}

TEST_F(ClusterAgentTest, AHostThatStopsHandsItsShareOver) {
  Host& a = AddHost("a");
  Host& b = AddHost("b");
  Send(a, 1);
  Send(b, 1);
  Exchange();
  ASSERT_EQ(Share(a), kRate / 2);
  // b stops exchanging (its process died): its figures expire after their
  // TTL (600 ms), and a's next pass gives a the whole rate.
  const int64_t start = MonotonicNowNs();
  ASSERT_TRUE(PollUntil(
      [&] {
        a.agent->PassForTesting(a.proc, MonotonicNowNs());
        SleepNs(50 * kNsPerMs);
        return Rate(a) == kRate;
      },
      3 * kNsPerSec));
  EXPECT_LT(MonotonicNowNs() - start, kNsPerSec);
  EXPECT_EQ(a.zone->settings().cluster().peers.load(), 0u);
}

TEST_F(ClusterAgentTest, FallsBackWhileRedisIsAwayAndRecovers) {
  Host& a = AddHost("a", /*decay_ns=*/kNsPerSec);
  Host& b = AddHost("b");
  Send(a, 1);
  Send(b, 3);
  Exchange();
  ASSERT_EQ(Share(a), kRate / 4);
  redis_->Stop();
  const int64_t stopped = MonotonicNowNs();
  ASSERT_TRUE(a.agent->PassForTesting(a.proc, stopped));
  const ClusterShm& c = a.zone->settings().cluster();
  EXPECT_EQ(c.state.load(), kClusterFallback);
  EXPECT_EQ(c.fallbacks.load(), 1u);
  EXPECT_GE(c.failures.load(), 1u);
  // Half-way through the decay: half-way from 1/4 to the whole rate.
  const int64_t last = c.last_exchange_ns.load();
  ASSERT_TRUE(a.agent->PassForTesting(a.proc, last + kNsPerSec / 2));
  EXPECT_NEAR(static_cast<double>(Share(a)), kRate * 0.625, kRate * 0.01);
  // Past it: the whole local rate.
  ASSERT_TRUE(a.agent->PassForTesting(a.proc, last + 2 * kNsPerSec));
  EXPECT_EQ(Rate(a), kRate);
  EXPECT_EQ(c.fallbacks.load(), 1u);  // one fallback, however many passes
  EXPECT_GE(c.failures.load(), 3u);
  // Redis back: the next exchanges share again.
  redis_ = std::make_unique<RedisServer>(port_);
  Exchange(5);  // the first pass of each finds its old connection closed
  EXPECT_EQ(c.state.load(), kClusterConnected);
  EXPECT_EQ(Share(a), kRate / 4);
  EXPECT_EQ(c.fallbacks.load(), 1u);
}

TEST_F(ClusterAgentTest, AStaleAgentLeavesEveryKeyItsRulesRate) {
  Host& a = AddHost("a");
  Host& b = AddHost("b");
  Send(a, 1);
  Send(b, 1);
  Exchange();
  ASSERT_EQ(Rate(a), kRate / 2);
  // No pass for longer than kClusterStaleNs: the agent is gone.
  a.zone->settings().cluster().beat_ns.store(MonotonicNowNs() -
                                             kClusterStaleNs - 1);
  EXPECT_EQ(Share(a), kRate / 2);
  EXPECT_EQ(Rate(a), kRate);
}

TEST_F(ClusterAgentTest, OneProcessPerZoneHoldsTheLease) {
  Host& a = AddHost("a");
  const uint32_t other = ClaimProc(*a.zone, 2);
  ASSERT_NE(other, kNoSlot);
  ClusterAgent second(a.zone.get(), &logger_, Options("a"));
  const int64_t now = MonotonicNowNs();
  ASSERT_TRUE(a.agent->PassForTesting(a.proc, now));
  EXPECT_FALSE(second.PassForTesting(other, now));
  // The holder stops renewing: its lease (500 ms) runs out.
  EXPECT_FALSE(second.PassForTesting(other, now + 400 * kNsPerMs));
  EXPECT_TRUE(second.PassForTesting(other, now + 600 * kNsPerMs));
  EXPECT_FALSE(a.agent->PassForTesting(a.proc, now + 700 * kNsPerMs));
}

// A lease word no holder wrote (expiry far beyond the lease's length, as a
// corrupt zone may hold) does not keep every process from acting.
TEST_F(ClusterAgentTest, ALeaseEndingTooFarAheadIsTakenOver) {
  Host& a = AddHost("a");
  const int64_t now = MonotonicNowNs();
  a.zone->settings().cluster().lease.store(~uint64_t{0});
  EXPECT_TRUE(a.agent->PassForTesting(a.proc, now));
  // One a live holder could have written is respected.
  const uint64_t now_ms = static_cast<uint64_t>(now / kNsPerMs);
  a.zone->settings().cluster().lease.store(
      LeaseWord::Held(a.proc + 1, now_ms + 400).word());
  EXPECT_FALSE(a.agent->PassForTesting(a.proc, now));
}

// A holder whose process died (its watcher thread ended holding the slot's
// liveness mutex, as under SIGKILL) is replaced at the next poll, not when
// its lease runs out: this host's figures in Redis must be renewed within
// their TTL (600 ms) or the other hosts count it gone.
TEST_F(ClusterAgentTest, ALeaseOfADeadProcessIsTakenAtTheNextPoll) {
  Host& a = AddHost("a");
  std::atomic<uint32_t> slot{kNoSlot};
  std::atomic<bool> die{false};
  std::thread watcher([&] {
    HeldMutex liveness;
    {
      ZoneLock lock(*a.zone);
      ASSERT_TRUE(lock.ok());
      slot = a.zone->procs().ClaimLocked(getpid(), 2, &liveness);
    }
    while (!die.load()) SleepNs(kNsPerMs);
    // Ends without releasing it: the kernel marks it owner-died.
  });
  ASSERT_TRUE(PollUntil([&] { return slot.load() != kNoSlot; }, kNsPerSec));
  const int64_t now = MonotonicNowNs();
  const uint64_t now_ms = static_cast<uint64_t>(now / kNsPerMs);
  a.zone->settings().cluster().lease.store(
      LeaseWord::Held(slot.load(), now_ms + 400).word());
  a.agent->Poll(a.proc, now);
  EXPECT_FALSE(a.agent->running()) << "the holder is alive";
  die = true;
  watcher.join();
  a.agent->Poll(a.proc, now);
  EXPECT_TRUE(a.agent->running())
      << "the holder died 400 ms before its lease ends";
  a.agent.reset();  // joins its thread
}

// A process that takes the exchange over reads the other hosts' figures in
// its first pass: the key never has the full rate in between.
TEST_F(ClusterAgentTest, ATakeOverKeepsTheSharesFromItsFirstPass) {
  Host& a = AddHost("a");
  Host& b = AddHost("b");
  Send(a, 1);
  Send(b, 1);
  Exchange();
  ASSERT_EQ(Share(a), kRate / 2);
  const uint32_t other = ClaimProc(*a.zone, 2);
  ClusterAgent successor(a.zone.get(), &logger_, Options("a"));
  // The holder stops; its lease (500 ms) runs out.
  a.zone->keys().slot(a.key).cluster_share.store(0);
  ASSERT_TRUE(
      successor.PassForTesting(other, MonotonicNowNs() + 600 * kNsPerMs));
  EXPECT_EQ(Share(a), kRate / 2);
}

TEST_F(ClusterAgentTest, TheThreadExchangesEveryTick) {
  Host& a = AddHost("a");
  Host& b = AddHost("b");
  Send(a, 1);
  Send(b, 1);
  a.agent->Poll(a.proc, MonotonicNowNs());
  b.agent->Poll(b.proc, MonotonicNowNs());
  ASSERT_TRUE(a.agent->running());
  // Within a few ticks (100 ms each) both see the other.
  EXPECT_TRUE(PollUntil([&] { return Rate(a) == kRate / 2; }, 3 * kNsPerSec));
  EXPECT_TRUE(PollUntil([&] { return Rate(b) == kRate / 2; }, 3 * kNsPerSec));
  EXPECT_TRUE(PollUntil(
      [&] { return a.zone->settings().cluster().exchanges.load() >= 10; },
      3 * kNsPerSec));
  a.agent.reset();  // joins its thread
  b.agent.reset();
}

}  // namespace
}  // namespace trafficrate
