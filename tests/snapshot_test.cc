// TakeSnapshot (src/snapshot.h): what `trafficrate stat` and `top` read,
// without the zone lock, from a zone that may be changing or corrupt.

#include "src/snapshot.h"

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace trafficrate {
namespace {

using testing_util::kPeer;
using testing_util::MakeKey;
using testing_util::TestKey;
using SnapshotTest = testing_util::ZoneFixture;

uint32_t Register(Zone& zone, uint32_t n, uint32_t proc) {
  ZoneLock lock(zone);
  const TestKey key = MakeKey(n);
  const uint32_t k = zone.FindOrInsertKeyLocked(key.bytes, 1);
  return zone.RegisterConnLocked(k, proc, 7, kPeer, 4242);
}

TEST_F(SnapshotTest, CountsKeysConnectionsAndProcesses) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  const uint32_t proc = ClaimProc(*zone);
  const uint32_t a = Register(*zone, 1, proc);
  const uint32_t b = Register(*zone, 1, proc);
  Register(*zone, 2, proc);
  {
    ZoneLock lock(*zone);
    zone->JoinLocked(a);
    zone->JoinLocked(b);
  }
  zone->conn(a).bytes_sent.store(1000);
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
    pthread_mutex_unlock(&zone->proc(proc).liveness);
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
  EXPECT_TRUE(Zone::IsCorruptZone(snap.status()));
  EXPECT_NE(snap.status().message().find("trafficrate rm"), std::string::npos);
  // Reading it marks nothing: only a process that uses the zone does.
  EXPECT_EQ(zone->header().corrupt.load(), 0u);
}

TEST_F(SnapshotTest, GarbageInTheSlotsIsReadWithoutACrash) {
  std::unique_ptr<Zone> zone = Open(256 * 1024);
  ASSERT_NE(zone, nullptr);
  std::mt19937_64 random(42);
  // Every slot full of random bytes: in-use flags set, indices anywhere.
  for (uint32_t i = 0; i < zone->key_capacity(); ++i) {
    auto* bytes = reinterpret_cast<uint8_t*>(&zone->key(i));
    for (size_t b = 0; b < sizeof(KeySlotShm); ++b) bytes[b] = random();
  }
  for (uint32_t i = 0; i < zone->conn_capacity(); ++i) {
    auto* bytes = reinterpret_cast<uint8_t*>(&zone->conn(i));
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
      const uint32_t k = zone->FindOrInsertKeyLocked(key.bytes, 1);
      const uint32_t c = zone->RegisterConnLocked(k, proc, 7, kPeer, 1);
      zone->JoinLocked(c);
      zone->DeregisterConnLocked(c);
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
    pthread_mutex_unlock(&zone->proc(proc).liveness);
  }
}

}  // namespace
}  // namespace trafficrate
