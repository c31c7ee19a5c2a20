// The connection table: registering, joining and leaving (the key's
// generation moves only on a change), cookies, indices out of range and a
// full table refused, the under-pace count of budget mode, the level set at
// once on a budget join, finding another process's registration, moving
// a connection to another process, and counting what left a connection
// into its key.

#include "src/shm/conn_table.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "src/budget/budget.h"
#include "src/budget/share.h"
#include "src/shm/key_budget.h"
#include "src/shm/zone.h"
#include "src/shm/zone_layout.h"
#include "tests/shm/zone_fixture.h"

namespace trafficrate {
namespace {

using testing_util::kPeer;
using testing_util::MakeKey;

using ConnTableTest = testing_util::ZoneFixture;

TEST_F(ConnTableTest, JoinAndLeaveBumpTheGenerationOnlyOnChange) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const auto [c1, c2] = RegisterEachLocked<2>(*zone, 9);
  ASSERT_NE(c1, kNoSlot);
  ASSERT_NE(c2, kNoSlot);
  const uint32_t k = zone->conns().slot(c1).key_index.load();
  EXPECT_EQ(zone->conns().slot(c2).key_index.load(), k);
  EXPECT_EQ(zone->keys().slot(k).refs.load(), 2u);
  EXPECT_EQ(zone->conns().slot(c1).fd.load(), 10);
  EXPECT_EQ(std::memcmp(zone->conns().slot(c1).peer, kPeer, 16), 0);
  EXPECT_EQ(zone->conns().slot(c1).peer_port, 4242);
  const uint32_t gen = zone->keys().slot(k).generation.load();
  EXPECT_TRUE(zone->conns().JoinLocked(c1));
  EXPECT_FALSE(zone->conns().JoinLocked(c1));
  EXPECT_TRUE(zone->conns().JoinLocked(c2));
  EXPECT_EQ(zone->keys().slot(k).active.load(), 2u);
  EXPECT_EQ(zone->keys().slot(k).generation.load(), gen + 2);
  EXPECT_TRUE(zone->conns().LeaveLocked(c1));
  EXPECT_FALSE(zone->conns().LeaveLocked(c1));
  EXPECT_EQ(zone->keys().slot(k).active.load(), 1u);
  EXPECT_EQ(zone->keys().slot(k).generation.load(), gen + 3);
  // Deregistering an active connection is a membership change.
  EXPECT_TRUE(zone->conns().DeregisterLocked(c2));
  EXPECT_FALSE(zone->conns().DeregisterLocked(c2));
  EXPECT_FALSE(zone->conns().JoinLocked(c2)) << "a freed slot cannot join";
  EXPECT_EQ(zone->keys().slot(k).active.load(), 0u);
  EXPECT_FALSE(zone->conns().DeregisterLocked(c1)) << "c1 had left already";
  EXPECT_EQ(zone->header().conns_used, 0u);
  EXPECT_FALSE(zone->conns().JoinLocked(zone->conns().capacity()));
  EXPECT_FALSE(zone->conns().LeaveLocked(kNoSlot));
}

// Budget mode: the count of a key's connections under their pace (in
// budget_aux beside what the lease holder writes) follows the owners'
// marks, never counts a connection twice or one that left, and survives
// the holder's stores.
TEST_F(ConnTableTest, UnderPaceCountFollowsMarksJoinsAndLeaves) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const auto [c1, c2, c3] = RegisterEachLocked<3>(*zone, 9);
  ASSERT_NE(c3, kNoSlot);
  KeySlotShm& key = zone->keys().slot(zone->conns().slot(c1).key_index.load());
  zone->conns().SetUnderPace(c1, true);
  EXPECT_EQ(UnderPaceOf(key), 0u) << "not sending: not counted";
  ASSERT_TRUE(zone->conns().JoinLocked(c1));
  ASSERT_TRUE(zone->conns().JoinLocked(c2));
  ASSERT_TRUE(zone->conns().JoinLocked(c3));
  zone->conns().SetUnderPace(c1, true);
  zone->conns().SetUnderPace(c1, true);
  zone->conns().SetUnderPace(c2, true);
  EXPECT_EQ(UnderPaceOf(key), 2u);
  // The lease holder's store keeps the count.
  BudgetState state = LoadBudget(key);
  state.packet_bytes = 65536;
  state.under_ticks = 7;
  StoreBudget(key, state);
  EXPECT_EQ(UnderPaceOf(key), 2u);
  EXPECT_EQ(LoadBudget(key).packet_bytes, 65536u);
  EXPECT_EQ(LoadBudget(key).under_ticks, 7u);
  zone->conns().SetUnderPace(c2, false);
  zone->conns().SetUnderPace(c2, false);
  zone->conns().SetUnderPace(c3, false);
  EXPECT_EQ(UnderPaceOf(key), 1u);
  // A leave takes it off; so does a close of a connection still marked.
  ASSERT_TRUE(zone->conns().LeaveLocked(c1));
  EXPECT_EQ(UnderPaceOf(key), 0u);
  zone->conns().SetUnderPace(c3, true);
  EXPECT_EQ(UnderPaceOf(key), 1u);
  EXPECT_TRUE(zone->conns().DeregisterLocked(c3));
  EXPECT_EQ(UnderPaceOf(key), 0u);
}

TEST_F(ConnTableTest, FreedConnectionSlotGetsANewCookie) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  const uint32_t c = RegisterLocked(*zone, 1, 0);
  ASSERT_NE(c, kNoSlot);
  const uint32_t seq = zone->conns().slot(c).seq.load();
  EXPECT_EQ(seq & 1, 1u) << "odd while in use";
  zone->conns().DeregisterLocked(c);
  EXPECT_EQ(zone->conns().slot(c).seq.load() & 1, 0u) << "even while free";
  const uint32_t again = RegisterLocked(*zone, 1, 0);
  ASSERT_EQ(again, c) << "the free list is LIFO";
  EXPECT_NE(ConnTable::CookieOf(zone->conns().slot(again).seq.load()),
            ConnTable::CookieOf(seq));
}

// ConnRef's encode and decode, tested here once: its users trust them.
TEST(ConnRefTest, RoundTripsTheIndexHighAndTheCookieLow) {
  struct Case {
    uint32_t conn;
    uint32_t cookie;
  };
  for (const Case c : {Case{0, 1}, Case{1, 0x7fffffff}, Case{6895, 12345},
                       Case{0xfffffffe, 0xffffffff}}) {
    const ConnRef ref = ConnRef::Of(c.conn, c.cookie);
    EXPECT_EQ(ref.word(), uint64_t{c.conn} << 32 | c.cookie);
    EXPECT_EQ(ref.conn(), c.conn);
    EXPECT_EQ(ref.cookie(), c.cookie);
    EXPECT_EQ(ConnRef::From(ref.word()), ref);
    EXPECT_NE(ref.word(), 0u) << "a drain slot's free mark";
  }
  EXPECT_NE(ConnRef::Of(1, 2), ConnRef::Of(2, 1));
  EXPECT_EQ(ConnRef().word(), 0u);
}

TEST_F(ConnTableTest, RegisterRefusesIndicesOutOfRange) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  const uint32_t k = zone->keys().FindOrInsertLocked(MakeKey(1).bytes, 1);
  EXPECT_EQ(
      zone->conns().RegisterLocked(zone->keys().capacity(), 0, 1, kPeer, 1),
      kNoSlot);
  EXPECT_EQ(
      zone->conns().RegisterLocked(k, zone->procs().capacity(), 1, kPeer, 1),
      kNoSlot);
  EXPECT_EQ(zone->header().conns_used, 0u);
  zone->keys().ReleaseIfUnusedLocked(k);
  EXPECT_EQ(zone->header().keys_used, 0u);
}

TEST_F(ConnTableTest, FullConnectionTableReturnsNoSlotAndRecovers) {
  std::unique_ptr<Zone> zone = Open(kMinZoneSize);
  ASSERT_NE(zone, nullptr);
  const uint32_t capacity = zone->conns().capacity();
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  std::vector<uint32_t> conns;
  for (uint32_t i = 0; i < capacity; ++i) {
    const uint32_t c = RegisterLocked(*zone, i % 3, 0, static_cast<int>(i));
    ASSERT_NE(c, kNoSlot) << i;
    conns.push_back(c);
  }
  EXPECT_EQ(zone->header().conns_used, capacity);
  EXPECT_EQ(zone->procs().slot(0).conns.load(), capacity);
  // Full: a new key is inserted but the connection is refused; the helper
  // then releases the key, as the Governor does.
  EXPECT_EQ(RegisterLocked(*zone, 99, 0), kNoSlot);
  EXPECT_EQ(zone->header().table_full.load(), 1u);
  EXPECT_EQ(zone->keys().FindLocked(MakeKey(99).bytes), kNoSlot);
  EXPECT_EQ(zone->header().keys_used, 3u);
  // After a free, registering works again.
  EXPECT_FALSE(zone->conns().DeregisterLocked(conns.back()));
  conns.pop_back();
  const uint32_t c = RegisterLocked(*zone, 99, 0);
  ASSERT_NE(c, kNoSlot);
  conns.push_back(c);
  EXPECT_EQ(RegisterLocked(*zone, 98, 0), kNoSlot);
  for (const uint32_t conn : conns) zone->conns().DeregisterLocked(conn);
  EXPECT_EQ(zone->header().conns_used, 0u);
  EXPECT_EQ(zone->header().keys_used, 0u);
  EXPECT_EQ(zone->procs().slot(0).conns.load(), 0u);
}

TEST_F(ConnTableTest, FindLockedFindsARegistrationByItsPeer) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ConnTable& conns = zone->conns();
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const uint32_t other = RegisterLocked(*zone, 1, 0);  // port 4242
  const uint32_t k = conns.slot(other).key_index.load();
  const uint32_t c = conns.RegisterLocked(k, 1, 8, kPeer, 4343);
  ASSERT_NE(c, kNoSlot);
  EXPECT_EQ(conns.FindLocked(k, kPeer, 4343), c);
  EXPECT_EQ(conns.FindLocked(k, kPeer, 4242), other);
  EXPECT_EQ(conns.FindLocked(k, kPeer, 1), kNoSlot);
  const uint8_t elsewhere[16] = {0, 0, 0,    0,    0,   0, 0, 0,
                                 0, 0, 0xff, 0xff, 127, 0, 0, 2};
  EXPECT_EQ(conns.FindLocked(k, elsewhere, 4343), kNoSlot);
  EXPECT_EQ(conns.FindLocked(zone->keys().capacity(), kPeer, 4343), kNoSlot);
  EXPECT_EQ(conns.IndexOf(conns.slot(c)), c);
}

TEST_F(ConnTableTest, TransferLockedGivesTheConnectionToAnotherProcess) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ConnTable& conns = zone->conns();
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const uint32_t c = RegisterLocked(*zone, 1, 0, 7);
  ASSERT_NE(c, kNoSlot);
  conns.TransferLocked(c, 3, 9);
  EXPECT_EQ(conns.slot(c).proc_index.load(), 3u);
  EXPECT_EQ(conns.slot(c).fd.load(), 9);
  EXPECT_EQ(zone->procs().slot(0).conns.load(), 0u);
  EXPECT_EQ(zone->procs().slot(3).conns.load(), 1u);
  conns.TransferLocked(c, 3, 11);  // its own already: nothing moves
  EXPECT_EQ(conns.slot(c).fd.load(), 9);
  conns.TransferLocked(c, zone->procs().capacity(), 12);
  conns.TransferLocked(conns.capacity(), 0, 12);
  EXPECT_EQ(conns.slot(c).proc_index.load(), 3u);
  EXPECT_EQ(zone->procs().slot(3).conns.load(), 1u);
}

// Budget mode: a new connection's first segments leave unpaced, and its
// key's level moves at once (BudgetMembershipChange), not at the next tick.
TEST_F(ConnTableTest, ABudgetJoinStartsUnpacedAndSetsTheLevelAtOnce) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ConnTable& conns = zone->conns();
  const ZoneSettings& settings = zone->settings();
  uint32_t first = kNoSlot;
  {
    ZoneLock lock(*zone);
    ASSERT_TRUE(lock.ok());
    first = RegisterLocked(*zone, 1, 0);
    ASSERT_TRUE(conns.JoinLocked(first));  // equal share: nothing of this
  }
  KeySlotShm& key = zone->keys().slot(conns.slot(first).key_index.load());
  EXPECT_EQ(key.start_pending.load(), 0u);
  zone->settings().SetShare(ShareMode::kBudget, 0);
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  BudgetState state = LoadBudget(key);
  state.level_bytes_per_sec = settings.KeyRate(key);
  StoreBudget(key, state);
  const uint32_t second = RegisterLocked(*zone, 1, 0);
  ASSERT_TRUE(conns.JoinLocked(second));
  EXPECT_EQ(key.start_pending.load(), kUnpacedStartBytes);
  const BudgetState expected =
      BudgetMembershipChange(state, settings.key_budget_settings(key), 1, 2);
  EXPECT_EQ(LoadBudget(key).level_bytes_per_sec, expected.level_bytes_per_sec);
  EXPECT_EQ(LoadBudget(key).boost, expected.boost);
  EXPECT_LT(LoadBudget(key).level_bytes_per_sec, state.level_bytes_per_sec)
      << "the joiner's share comes from the others at once";
  // A connection that has sent is not new.
  ASSERT_TRUE(conns.LeaveLocked(first));
  conns.slot(first).bytes_sent.store(1);
  ASSERT_TRUE(conns.JoinLocked(first));
  EXPECT_EQ(key.start_pending.load(), kUnpacedStartBytes);
}

// Budget mode: an owner counts what has left its connection's socket in
// all; its key's sent_bytes gets only what is new since the last count, a
// smaller total (a measurement older than the last) adds nothing, and a
// key index out of range (the segment is not trusted) reaches no key.
TEST_F(ConnTableTest, CountLeftAddsOnlyWhatIsNewToTheKey) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ConnTable& conns = zone->conns();
  uint32_t c1 = kNoSlot, c2 = kNoSlot, other = kNoSlot;
  {
    ZoneLock lock(*zone);
    ASSERT_TRUE(lock.ok());
    const std::array<uint32_t, 2> both = RegisterEachLocked<2>(*zone, 9);
    c1 = both[0];
    c2 = both[1];
    other = RegisterLocked(*zone, 10, 0);
  }
  ASSERT_NE(c1, kNoSlot);
  ASSERT_NE(c2, kNoSlot);
  ASSERT_NE(other, kNoSlot);
  ConnSlotShm& conn = conns.slot(c1);
  KeySlotShm& key = zone->keys().slot(conn.key_index.load());
  KeySlotShm& other_key = zone->keys().slot(conns.slot(other).key_index.load());
  ASSERT_NE(&key, &other_key);
  EXPECT_EQ(key.sent_bytes.load(), 0u);
  conns.CountLeft(conn, 1000);
  EXPECT_EQ(key.sent_bytes.load(), 1000u);
  EXPECT_EQ(conn.bytes_left.load(), 1000u);
  conns.CountLeft(conn, 1500);
  EXPECT_EQ(key.sent_bytes.load(), 1500u) << "only the 500 new bytes";
  EXPECT_EQ(conn.bytes_left.load(), 1500u);
  // The same total again, or a smaller one: nothing.
  conns.CountLeft(conn, 1500);
  conns.CountLeft(conn, 1200);
  conns.CountLeft(conn, 0);
  EXPECT_EQ(key.sent_bytes.load(), 1500u);
  EXPECT_EQ(conn.bytes_left.load(), 1500u) << "a smaller total is ignored";
  // Another connection of the key adds its own.
  conns.CountLeft(conns.slot(c2), 700);
  EXPECT_EQ(key.sent_bytes.load(), 2200u);
  conns.CountLeft(conn, 2000);
  EXPECT_EQ(key.sent_bytes.load(), 2700u);
  EXPECT_EQ(other_key.sent_bytes.load(), 0u) << "other keys untouched";
  // Large totals: the difference, not the total, is added.
  conns.CountLeft(conn, uint64_t{1} << 40);
  EXPECT_EQ(key.sent_bytes.load(), (uint64_t{1} << 40) + 700);
}

TEST_F(ConnTableTest, CountLeftWithAKeyIndexOutOfRangeReachesNoKey) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ConnTable& conns = zone->conns();
  uint32_t c = kNoSlot, other = kNoSlot;
  {
    ZoneLock lock(*zone);
    ASSERT_TRUE(lock.ok());
    c = RegisterLocked(*zone, 1, 0);
    other = RegisterLocked(*zone, 2, 0);
  }
  ASSERT_NE(c, kNoSlot);
  ASSERT_NE(other, kNoSlot);
  const uint32_t k = conns.slot(c).key_index.load();
  // Another process wrote garbage over the slot's key index.
  for (const uint32_t bad : {zone->keys().capacity(), kNoSlot}) {
    conns.slot(c).key_index.store(bad);
    conns.CountLeft(conns.slot(c), conns.slot(c).bytes_left.load() + 4096);
    for (uint32_t i = 0; i < zone->keys().capacity(); ++i) {
      ASSERT_EQ(zone->keys().slot(i).sent_bytes.load(), 0u) << bad << " " << i;
    }
  }
  // Set right again, it counts what is new from there on.
  conns.slot(c).key_index.store(k);
  conns.CountLeft(conns.slot(c), conns.slot(c).bytes_left.load() + 100);
  EXPECT_EQ(zone->keys().slot(k).sent_bytes.load(), 100u);
}

}  // namespace
}  // namespace trafficrate
