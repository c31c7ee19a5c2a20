// TakeSnapshot (src/shm/snapshot.h): what `trafficrate stat` and `top` read,
// without the zone lock, from a zone that may be changing or corrupt.

#include "src/shm/snapshot.h"

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "src/budget/budget.h"
#include "src/shm/zone.h"
#include "src/shm/zone_layout.h"
#include "tests/shm/zone_fixture.h"

namespace trafficrate {
namespace {

using testing_util::kPeer;
using testing_util::MakeKey;
using testing_util::TestKey;
using SnapshotTest = testing_util::ZoneFixture;

TEST_F(SnapshotTest, CountsKeysConnectionsAndProcesses) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  const uint32_t proc = ClaimProc(*zone);
  const uint32_t a = Register(*zone, 1, proc);
  const uint32_t b = Register(*zone, 1, proc);
  Register(*zone, 2, proc);
  {
    ZoneLock lock(*zone);
    zone->conns().JoinLocked(a);
    zone->conns().JoinLocked(b);
  }
  zone->conns().slot(a).bytes_sent.store(1000);
  absl::StatusOr<ZoneSnapshot> snap = TakeSnapshot(*zone);
  ASSERT_TRUE(snap.ok()) << snap.status();
  ASSERT_EQ(snap->keys.size(), 2u);
  EXPECT_EQ(snap->connections.size(), 3u);
  EXPECT_EQ(ActiveConnections(*snap), 2u);
  EXPECT_EQ(LiveProcesses(*snap), 1u);
  const KeySnapshot* key1 = nullptr;
  for (const KeySnapshot& k : snap->keys) {
    if (k.active == 2) key1 = &k;
  }
  ASSERT_NE(key1, nullptr);
  EXPECT_EQ(key1->connections, 2u);
  EXPECT_EQ(key1->connections_served, 2u);
  EXPECT_EQ(key1->share_bytes_per_sec, testing_util::kRate / 2);
  EXPECT_EQ(key1->bytes_sent, 1000u);
  EXPECT_EQ(snap->connections[0].peer, "127.0.0.1:4242");
  {
    ZoneLock lock(*zone);
    pthread_mutex_unlock(&zone->procs().slot(proc).liveness);
  }
}

// Rules (zone_layout.h, RuleSlotShm): a key's byte 18 names its rule, whose
// rate, burst and key spec are its own; rule 0's are the header's.
TEST_F(SnapshotTest, EachKeyTakesItsRulesRateAndName) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  KeySpec per24;
  per24.v4_prefix = 24;
  zone->settings().SetRule(0, "downloads", 0, 0, KeySpec());
  zone->settings().SetRule(2, "api", 4000, 64 << 10, per24);
  EXPECT_EQ(zone->settings().RuleName(0), "downloads");
  EXPECT_EQ(zone->settings().RuleName(2), "api");
  EXPECT_EQ(zone->settings().RuleName(1), "rule 1");
  EXPECT_EQ(zone->settings().RuleRate(0), testing_util::kRate);
  EXPECT_EQ(zone->settings().RuleRate(2), 4000u);
  EXPECT_EQ(zone->settings().RuleRate(1), 0u);
  EXPECT_EQ(zone->settings().RuleRate(kZoneRules), 0u);
  EXPECT_EQ(zone->settings().RuleBurst(2), 64u << 10);
  EXPECT_EQ(zone->settings().RuleBurst(0),
            DefaultBurstBytes(testing_util::kRate));
  EXPECT_EQ(zone->settings().RuleKeySpec(2).v4_prefix, 24);
  EXPECT_EQ(zone->settings().budget_settings(2).rate_bytes_per_sec, 4000u);
  EXPECT_EQ(zone->settings().FindRule("api"), 2u);
  EXPECT_EQ(zone->settings().FindRule("downloads"), 0u);
  EXPECT_EQ(zone->settings().FindRule("rule 1"), kNoSlot);  // unused
  EXPECT_EQ(zone->settings().FindRule("nope"), kNoSlot);
  const uint32_t proc = ClaimProc(*zone);
  uint32_t a = kNoSlot;
  uint32_t b = kNoSlot;
  {
    ZoneLock lock(*zone);
    // The same client under two rules: two keys, two budgets.
    TestKey key = MakeKey(1);
    const uint32_t k0 = zone->keys().FindOrInsertLocked(key.bytes, 1);
    key.bytes[kKeyRuleByte] = 2;
    const uint32_t k2 = zone->keys().FindOrInsertLocked(key.bytes, 1);
    ASSERT_NE(k0, k2);
    a = zone->conns().RegisterLocked(k0, proc, 7, kPeer, 4242);
    b = zone->conns().RegisterLocked(k2, proc, 8, kPeer, 4243);
    zone->conns().JoinLocked(a);
    zone->conns().JoinLocked(b);
  }
  zone->settings().SetRuleRate(2, 6000);
  absl::StatusOr<ZoneSnapshot> snap = TakeSnapshot(*zone);
  ASSERT_TRUE(snap.ok()) << snap.status();
  ASSERT_EQ(snap->rules.size(), 2u);
  EXPECT_EQ(snap->rules[1].name, "api");
  EXPECT_EQ(snap->rules[1].rate_bytes_per_sec, 6000u);
  ASSERT_EQ(snap->keys.size(), 2u);
  for (const KeySnapshot& k : snap->keys) {
    EXPECT_EQ(k.rule, k.rule_index == 2 ? "api" : "downloads");
    EXPECT_EQ(k.share_bytes_per_sec,
              k.rule_index == 2 ? 6000u : testing_util::kRate);
  }
  // A stray write into a name shows as '?', never as raw bytes.
  zone->header().rules[2].name[0] = '\n';
  EXPECT_EQ(zone->settings().RuleName(2), "?pi");
  {
    ZoneLock lock(*zone);
    pthread_mutex_unlock(&zone->procs().slot(proc).liveness);
  }
}

// The cluster section (ClusterShm) and a key's fleet figures, as the
// cluster agent writes them; a beat over kClusterStaleNs old is "stale" and
// the key has its rule's full rate again.
TEST_F(SnapshotTest, ClusterStateAndTheKeysHostShare) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  const uint32_t proc = ClaimProc(*zone);
  const uint32_t a = Register(*zone, 1, proc);
  const uint32_t b = Register(*zone, 1, proc);
  {
    ZoneLock lock(*zone);
    zone->conns().JoinLocked(a);
    zone->conns().JoinLocked(b);
  }
  absl::StatusOr<ZoneSnapshot> snap = TakeSnapshot(*zone);
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_FALSE(snap->has_cluster);  // no agent has run
  ClusterShm& c = zone->settings().cluster();
  const char url[] = "redis://10.0.0.5:6379/0\x01";
  std::memcpy(c.url, url, sizeof(url));
  std::memcpy(c.name, "fleet", 6);
  std::memcpy(c.host, "web1/z", 7);
  c.state.store(kClusterConnected);
  c.pid.store(4321);
  c.peers.store(2);
  c.rtt_us.store(250);
  c.exchanges.store(10);
  c.failures.store(1);
  c.fallbacks.store(1);
  const int64_t now = MonotonicNowNs();
  c.beat_ns.store(now);
  c.last_exchange_ns.store(now - 50'000'000);
  const uint32_t k = zone->conns().slot(a).key_index.load();
  zone->keys().slot(k).cluster_share.store(testing_util::kRate / 4);
  zone->keys().slot(k).cluster_active.store(8);
  zone->keys().slot(k).cluster_hosts.store(3);
  snap = TakeSnapshot(*zone);
  ASSERT_TRUE(snap.ok()) << snap.status();
  ASSERT_TRUE(snap->has_cluster);
  EXPECT_EQ(snap->cluster.state, "connected");
  EXPECT_EQ(snap->cluster.url, "redis://10.0.0.5:6379/0?");
  EXPECT_EQ(snap->cluster.name, "fleet");
  EXPECT_EQ(snap->cluster.host, "web1/z");
  EXPECT_EQ(snap->cluster.pid, 4321);
  EXPECT_EQ(snap->cluster.peers, 2u);
  EXPECT_EQ(snap->cluster.rtt_us, 250u);
  EXPECT_GE(snap->cluster.last_exchange_age_ns, 50'000'000);
  EXPECT_EQ(snap->cluster.exchanges, 10u);
  EXPECT_EQ(snap->cluster.failures, 1u);
  EXPECT_EQ(snap->cluster.fallbacks, 1u);
  ASSERT_EQ(snap->keys.size(), 1u);
  EXPECT_EQ(snap->keys[0].cluster_active, 8u);
  EXPECT_EQ(snap->keys[0].cluster_hosts, 3u);
  EXPECT_EQ(snap->keys[0].host_share_bytes_per_sec, testing_util::kRate / 4);
  EXPECT_EQ(snap->keys[0].share_bytes_per_sec, testing_util::kRate / 8);
  EXPECT_EQ(snap->keys[0].rate_bytes_per_sec, testing_util::kRate);
  // No beat for longer than kClusterStaleNs: nobody exchanges.
  c.beat_ns.store(now - kClusterStaleNs - 1'000'000);
  snap = TakeSnapshot(*zone);
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_EQ(snap->cluster.state, "stale");
  EXPECT_EQ(snap->keys[0].host_share_bytes_per_sec, testing_util::kRate);
  EXPECT_EQ(snap->keys[0].share_bytes_per_sec, testing_util::kRate / 2);
  {
    ZoneLock lock(*zone);
    pthread_mutex_unlock(&zone->procs().slot(proc).liveness);
  }
}

TEST_F(SnapshotTest, OverwrittenHeaderIsDataLossNotACrash) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  zone->header().magic = 0;
  absl::StatusOr<ZoneSnapshot> snap = TakeSnapshot(*zone);
  ASSERT_FALSE(snap.ok());
  EXPECT_EQ(snap.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(snap.status().message().find("corrupt"), std::string::npos);
}

TEST_F(SnapshotTest, HeaderFailingItsChecksumIsCorrupt) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ASSERT_TRUE(TakeSnapshot(*zone).ok());
  zone->header().proc_capacity += 1;
  absl::StatusOr<ZoneSnapshot> snap = TakeSnapshot(*zone);
  ASSERT_FALSE(snap.ok());
  EXPECT_TRUE(ZoneSegment::IsCorruptZone(snap.status()));
  EXPECT_NE(snap.status().message().find("trafficrate rm"), std::string::npos);
  // Reading it marks nothing: only a process that uses the zone does.
  EXPECT_EQ(zone->header().corrupt.load(), 0u);
}

TEST_F(SnapshotTest, GarbageInTheSlotsIsReadWithoutACrash) {
  std::unique_ptr<Zone> zone = Open(256 * 1024);
  ASSERT_NE(zone, nullptr);
  std::mt19937_64 random(42);
  // Every slot full of random bytes: in-use flags set, indices anywhere.
  for (uint32_t i = 0; i < zone->keys().capacity(); ++i) {
    auto* bytes = reinterpret_cast<uint8_t*>(&zone->keys().slot(i));
    for (size_t b = 0; b < sizeof(KeySlotShm); ++b) bytes[b] = random();
  }
  for (uint32_t i = 0; i < zone->conns().capacity(); ++i) {
    auto* bytes = reinterpret_cast<uint8_t*>(&zone->conns().slot(i));
    for (size_t b = 0; b < sizeof(ConnSlotShm); ++b) bytes[b] = random();
  }
  absl::StatusOr<ZoneSnapshot> snap = TakeSnapshot(*zone);
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_GT(snap->keys.size(), 0u);
  EXPECT_GT(snap->connections.size(), 0u);
}

TEST_F(SnapshotTest, ReadingWhileAnotherThreadChangesTheZoneIsSafe) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  const uint32_t proc = ClaimProc(*zone);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint32_t round = 0; round < 200000 && !stop.load(); ++round) {
      ZoneLock lock(*zone);
      const TestKey key = MakeKey(round % 64);
      const uint32_t k = zone->keys().FindOrInsertLocked(key.bytes, 1);
      const uint32_t c = zone->conns().RegisterLocked(k, proc, 7, kPeer, 1);
      zone->conns().JoinLocked(c);
      zone->conns().DeregisterLocked(c);
    }
  });
  size_t snapshots = 0;
  const int64_t deadline = MonotonicNowNs() + 200 * kNsPerMs;
  while (MonotonicNowNs() < deadline) {
    absl::StatusOr<ZoneSnapshot> snap = TakeSnapshot(*zone);
    ASSERT_TRUE(snap.ok()) << snap.status();
    EXPECT_LE(snap->keys.size(), 64u);
    ++snapshots;
  }
  stop.store(true);
  writer.join();
  EXPECT_GT(snapshots, 0u);
  {
    ZoneLock lock(*zone);
    pthread_mutex_unlock(&zone->procs().slot(proc).liveness);
  }
}

}  // namespace
}  // namespace trafficrate
