// The handoff table: a passed socket taken once by its inode while its
// connection lives, withdrawn by its sender, expired in batches, dropped
// with a dead sender, and a full table that refuses, then reuses slots no
// process would ever clear.

#include "src/shm/handoff_table.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "src/shm/conn_table.h"
#include "src/shm/zone.h"
#include "src/shm/zone_layout.h"
#include "tests/shm/zone_fixture.h"

namespace trafficrate {
namespace {

using HandoffTableTest = testing_util::ZoneFixture;

TEST_F(HandoffTableTest, HandoffIsTakenOnceByInodeWhileItsConnectionLives) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const uint32_t c = RegisterLocked(*zone, 1, 0);
  ASSERT_NE(c, kNoSlot);
  const uint32_t cookie = ConnTable::CookieOf(zone->conns().slot(c).seq.load());
  EXPECT_FALSE(zone->handoffs().MayHave(77));
  ASSERT_TRUE(zone->handoffs().PublishLocked(77, c, cookie, 0, 1000));
  EXPECT_TRUE(zone->handoffs().MayHave(77));
  EXPECT_FALSE(zone->handoffs().MayHave(78));
  EXPECT_TRUE(zone->handoffs().PendingLocked(c, cookie));
  EXPECT_FALSE(zone->handoffs().PendingLocked(c, cookie + 1));
  uint32_t got = 0;
  EXPECT_EQ(zone->handoffs().TakeLocked(78, &got), kNoSlot);
  EXPECT_EQ(zone->handoffs().TakeLocked(77, &got), c);
  EXPECT_EQ(got, cookie);
  EXPECT_EQ(zone->handoffs().TakeLocked(77, &got), kNoSlot) << "taken once";
  EXPECT_FALSE(zone->handoffs().PendingLocked(c, cookie));
  // A connection that ended meanwhile is not handed over.
  ASSERT_TRUE(zone->handoffs().PublishLocked(77, c, cookie, 0, 1000));
  zone->conns().DeregisterLocked(c);
  EXPECT_EQ(zone->handoffs().TakeLocked(77, &got), kNoSlot);
  EXPECT_FALSE(zone->handoffs().MayHave(77)) << "and the slot is freed";
  // Inode 0 (no socket) and a slot index beyond the table are refused.
  EXPECT_FALSE(zone->handoffs().PublishLocked(0, c, cookie, 0, 1000));
  EXPECT_FALSE(zone->handoffs().PublishLocked(5, zone->conns().capacity(),
                                              cookie, 0, 1000));
}

TEST_F(HandoffTableTest, HandoffsAreWithdrawnExpiredAndReapedPerProcess) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const uint32_t a = RegisterLocked(*zone, 1, 0);
  const uint32_t b = RegisterLocked(*zone, 2, 1);
  ASSERT_TRUE(zone->handoffs().PublishLocked(10, a, 1, 0, 1000));
  ASSERT_TRUE(zone->handoffs().PublishLocked(11, b, 1, 1, 1000));
  zone->handoffs().WithdrawLocked(10, 1);
  EXPECT_TRUE(zone->handoffs().MayHave(10)) << "only its sender withdraws it";
  zone->handoffs().WithdrawLocked(10, 0);
  EXPECT_FALSE(zone->handoffs().MayHave(10));
  ASSERT_TRUE(zone->handoffs().PublishLocked(10, a, 1, 0, 5000));
  EXPECT_FALSE(zone->handoffs().HasOld(0, 5000));
  EXPECT_TRUE(zone->handoffs().HasOld(0, 5001));
  uint64_t out[kMinHandoffSlots];
  EXPECT_EQ(zone->handoffs().ExpireLocked(0, 5000, out, kMinHandoffSlots), 0u);
  ASSERT_EQ(zone->handoffs().ExpireLocked(0, 5001, out, kMinHandoffSlots), 1u);
  EXPECT_EQ(ConnRef::From(out[0]), ConnRef::Of(a, 1));
  EXPECT_FALSE(zone->handoffs().MayHave(10));
  EXPECT_TRUE(zone->handoffs().MayHave(11)) << "another process's stays";
}

TEST_F(HandoffTableTest, HandoffTableFullRefusesThenReusesStaleOrGarbageSlots) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  // Sized from the zone: an eighth of its connection slots.
  EXPECT_EQ(zone->handoffs().capacity(), zone->conns().capacity() / 8);
  EXPECT_GT(zone->handoffs().capacity(), kMinHandoffSlots);
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const int64_t now = 100 * kNsPerSec;
  std::vector<uint32_t> conns;
  for (uint64_t i = 0; i < zone->handoffs().capacity(); ++i) {
    conns.push_back(RegisterLocked(*zone, 1, 0));
    ASSERT_NE(conns.back(), kNoSlot);
    ASSERT_TRUE(
        zone->handoffs().PublishLocked(100 + i, conns.back(), 1, 0, now));
  }
  EXPECT_EQ(zone->header().handoffs_pending.load(),
            zone->handoffs().capacity());
  const uint32_t c = RegisterLocked(*zone, 2, 0);
  EXPECT_FALSE(zone->handoffs().PublishLocked(999, c, 1, 0, now)) << "full";
  EXPECT_TRUE(zone->handoffs().PublishLocked(100, conns[0], 1, 0, now))
      << "the same one";
  // Garbage (a slot naming no process) and a slot dated far ahead are free
  // for others; so is one left for far longer than any sender keeps it.
  zone->handoffs().slot(3).proc.store(kNoSlot);
  EXPECT_TRUE(zone->handoffs().PublishLocked(999, c, 1, 0, now));
  EXPECT_EQ(zone->handoffs().slot(3).inode.load(), 999u);
  EXPECT_TRUE(zone->handoffs().MayBeHandedOff(c, 1));
  EXPECT_FALSE(zone->handoffs().MayBeHandedOff(conns[3], 1))
      << "its slot was taken";
  zone->handoffs().slot(4).since_ns.store(INT64_MAX);
  const uint32_t d = RegisterLocked(*zone, 3, 0);
  EXPECT_TRUE(zone->handoffs().PublishLocked(998, d, 1, 0, now));
  const uint32_t e = RegisterLocked(*zone, 4, 0);
  EXPECT_TRUE(
      zone->handoffs().PublishLocked(997, e, 1, 0, now + 60 * kNsPerSec));
  EXPECT_EQ(zone->header().handoffs_pending.load(),
            zone->handoffs().capacity());
}

TEST_F(HandoffTableTest, ExpiringHandoffsTakesABatchAndLeavesTheRest) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  EXPECT_FALSE(zone->handoffs().AnyPending());
  for (uint64_t i = 0; i < 3 * kMinHandoffSlots; ++i) {
    const uint32_t c = RegisterLocked(*zone, 1, 0);
    ASSERT_TRUE(zone->handoffs().PublishLocked(100 + i, c, 1, 0, 1000));
  }
  EXPECT_TRUE(zone->handoffs().AnyPending());
  uint64_t out[kMinHandoffSlots];
  for (int batch = 0; batch < 3; ++batch) {
    EXPECT_TRUE(zone->handoffs().HasOld(0, 2000));
    EXPECT_EQ(zone->handoffs().ExpireLocked(0, 2000, out, kMinHandoffSlots),
              kMinHandoffSlots);
  }
  EXPECT_FALSE(zone->handoffs().HasOld(0, 2000));
  EXPECT_FALSE(zone->handoffs().AnyPending());
  EXPECT_EQ(zone->header().handoffs_pending.load(), 0u);
}

TEST_F(HandoffTableTest, ADeadSendersHandoffsAreAllDroppedAndOnlyTheirs) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  HandoffTable& handoffs = zone->handoffs();
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const uint32_t a = RegisterLocked(*zone, 1, 0);
  const uint32_t b = RegisterLocked(*zone, 2, 0);
  const uint32_t c = RegisterLocked(*zone, 3, 1);
  ASSERT_TRUE(handoffs.PublishLocked(10, a, 1, 0, 1000));
  ASSERT_TRUE(handoffs.PublishLocked(11, b, 1, 0, 1000));
  ASSERT_TRUE(handoffs.PublishLocked(12, c, 1, 1, 1000));
  EXPECT_EQ(zone->header().handoffs_pending.load(), 3u);
  handoffs.ClearProcLocked(0);
  EXPECT_FALSE(handoffs.MayHave(10));
  EXPECT_FALSE(handoffs.MayHave(11));
  EXPECT_FALSE(handoffs.MayBeHandedOff(a, 1));
  EXPECT_EQ(zone->conns().slot(a).handoff.load(), 0u);
  EXPECT_TRUE(handoffs.MayHave(12));
  EXPECT_TRUE(handoffs.PendingLocked(c, 1));
  EXPECT_EQ(zone->header().handoffs_pending.load(), 1u);
}

}  // namespace
}  // namespace trafficrate
