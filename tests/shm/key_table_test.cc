// The key table: keys found, inserted once and freed when unused; a full
// table refused and recovered; the hash seeded per zone; and chain walks
// bounded by the table, whatever the zone holds.

#include "src/shm/key_table.h"

#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "src/shm/zone.h"
#include "src/shm/zone_layout.h"
#include "tests/shm/zone_fixture.h"

namespace trafficrate {
namespace {

using testing_util::kOneMiB;
using testing_util::kPeer;
using testing_util::kRate;
using testing_util::MakeKey;

using KeyTableTest = testing_util::ZoneFixture;

TEST_F(KeyTableTest, KeysAreFoundInsertedOnceAndReleasedWhenUnused) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const uint32_t a = zone->keys().FindOrInsertLocked(MakeKey(1).bytes, 100);
  const uint32_t b = zone->keys().FindOrInsertLocked(MakeKey(2).bytes, 200);
  ASSERT_NE(a, kNoSlot);
  ASSERT_NE(b, kNoSlot);
  EXPECT_NE(a, b);
  EXPECT_EQ(zone->keys().FindOrInsertLocked(MakeKey(1).bytes, 300), a);
  EXPECT_EQ(zone->keys().FindLocked(MakeKey(2).bytes), b);
  EXPECT_EQ(zone->keys().slot(a).last_active_ns.load(), 100);
  EXPECT_EQ(zone->keys().slot(a).refs.load(), 0u);
  EXPECT_EQ(zone->header().keys_used, 2u);
  const uint32_t c = zone->conns().RegisterLocked(a, 0, 5, kPeer, 1);
  ASSERT_NE(c, kNoSlot);
  zone->keys().ReleaseIfUnusedLocked(a);  // still referenced: kept
  zone->keys().ReleaseIfUnusedLocked(b);  // unused: freed
  EXPECT_EQ(zone->keys().FindLocked(MakeKey(1).bytes), a);
  EXPECT_EQ(zone->keys().FindLocked(MakeKey(2).bytes), kNoSlot);
  EXPECT_EQ(zone->header().keys_used, 1u);
  zone->conns().DeregisterLocked(c);
  EXPECT_EQ(zone->keys().FindLocked(MakeKey(1).bytes), kNoSlot);
  EXPECT_EQ(zone->header().keys_used, 0u);
}

TEST_F(KeyTableTest, FullKeyTableReturnsNoSlotAndRecovers) {
  std::unique_ptr<Zone> zone = Open(kMinZoneSize);
  ASSERT_NE(zone, nullptr);
  const uint32_t capacity = zone->keys().capacity();
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  std::set<uint32_t> slots;
  for (uint32_t n = 0; n < capacity; ++n) {
    const uint32_t k = zone->keys().FindOrInsertLocked(MakeKey(n).bytes, 1);
    ASSERT_NE(k, kNoSlot) << n;
    slots.insert(k);
  }
  EXPECT_EQ(slots.size(), capacity);
  EXPECT_EQ(zone->header().keys_used, capacity);
  EXPECT_EQ(zone->header().table_full.load(), 0u);
  EXPECT_EQ(zone->keys().FindOrInsertLocked(MakeKey(capacity).bytes, 1),
            kNoSlot);
  EXPECT_EQ(zone->keys().FindOrInsertLocked(MakeKey(capacity + 1).bytes, 1),
            kNoSlot);
  EXPECT_EQ(zone->header().table_full.load(), 2u);
  // Every key is still found; an existing key needs no free slot.
  for (uint32_t n = 0; n < capacity; ++n) {
    ASSERT_NE(zone->keys().FindLocked(MakeKey(n).bytes), kNoSlot) << n;
  }
  EXPECT_NE(zone->keys().FindOrInsertLocked(MakeKey(3).bytes, 1), kNoSlot);
  // Freeing one makes room for exactly one more.
  const uint32_t freed = zone->keys().FindLocked(MakeKey(17).bytes);
  zone->keys().ReleaseIfUnusedLocked(freed);
  EXPECT_EQ(zone->keys().FindLocked(MakeKey(17).bytes), kNoSlot);
  EXPECT_EQ(zone->keys().FindOrInsertLocked(MakeKey(capacity).bytes, 1), freed);
  EXPECT_EQ(zone->keys().FindOrInsertLocked(MakeKey(capacity + 1).bytes, 1),
            kNoSlot);
  for (uint32_t n = 0; n <= capacity; ++n) {
    zone->keys().ReleaseIfUnusedLocked(
        zone->keys().FindLocked(MakeKey(n).bytes));
  }
  EXPECT_EQ(zone->header().keys_used, 0u);
}

TEST_F(KeyTableTest, HashSeedDiffersBetweenZones) {
  std::unique_ptr<Zone> a = Open();
  ASSERT_NE(a, nullptr);
  const std::string other_name = zone_name_ + "_other";
  (void)ZoneSegment::Unlink(other_name);
  absl::StatusOr<std::unique_ptr<Zone>> b =
      Zone::OpenOrCreate(other_name, kOneMiB, kRate);
  (void)ZoneSegment::Unlink(other_name);
  ASSERT_TRUE(b.ok()) << b.status();
  const ZoneHeaderShm& ha = a->header();
  const ZoneHeaderShm& hb = (*b)->header();
  EXPECT_FALSE(ha.hash_seed[0] == hb.hash_seed[0] &&
               ha.hash_seed[1] == hb.hash_seed[1]);
  EXPECT_FALSE(ha.hash_seed[0] == 0 && ha.hash_seed[1] == 0);
  // So the same keys land in different buckets.
  int differing = 0;
  for (uint32_t n = 0; n < 64; ++n) {
    if (a->keys().BucketOf(MakeKey(n).bytes) !=
        (*b)->keys().BucketOf(MakeKey(n).bytes)) {
      ++differing;
    }
  }
  EXPECT_GT(differing, 32);
}

// A chain that loops, or leads out of the table (a stray write), ends the
// walk: a lookup gives up after as many steps as there are slots.
TEST_F(KeyTableTest, AChainThatLoopsOrLeavesTheTableIsWalkedNoFurther) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  KeyTable& keys = zone->keys();
  const ZoneTables& t = zone->segment().tables();
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const uint32_t a = keys.FindOrInsertLocked(MakeKey(1).bytes, 1);
  ASSERT_NE(a, kNoSlot);
  const testing_util::TestKey missing = MakeKey(2);
  t.buckets[keys.BucketOf(missing.bytes)] = a;
  keys.slot(a).next = a;
  EXPECT_EQ(keys.FindLocked(missing.bytes), kNoSlot);
  keys.slot(a).next = 0xfffffff0u;
  EXPECT_EQ(keys.FindLocked(missing.bytes), kNoSlot);
  EXPECT_EQ(keys.FindLocked(MakeKey(1).bytes), a) << "still in its bucket";
}

TEST_F(KeyTableTest, ReleasingAKeyInUseFreeOrOutOfRangeChangesNothing) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  KeyTable& keys = zone->keys();
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const uint32_t k = keys.FindOrInsertLocked(MakeKey(1).bytes, 1);
  ASSERT_NE(k, kNoSlot);
  const uint32_t c = zone->conns().RegisterLocked(k, 0, 5, kPeer, 1);
  ASSERT_NE(c, kNoSlot);
  const uint32_t generation = keys.slot(k).generation.load();
  keys.ReleaseIfUnusedLocked(k);
  keys.ReleaseIfUnusedLocked(keys.capacity());
  keys.ReleaseIfUnusedLocked(kNoSlot);
  keys.ReleaseIfUnusedLocked(k + 1);  // free already
  EXPECT_EQ(keys.FindLocked(MakeKey(1).bytes), k);
  EXPECT_EQ(keys.slot(k).generation.load(), generation);
  EXPECT_EQ(zone->header().keys_used, 1u);
  // Freed once unused: its generation moves, its bytes are cleared.
  zone->conns().DeregisterLocked(c);
  EXPECT_EQ(keys.slot(k).in_use.load(), 0u);
  EXPECT_NE(keys.slot(k).generation.load(), generation);
  EXPECT_EQ(keys.slot(k).key[19], 0u);
  EXPECT_EQ(zone->header().key_free_head, k);
}

}  // namespace
}  // namespace trafficrate
