// Repair after a dead holder: a lock holder killed mid-update leaves a
// table rebuilt from its connection slots (EOWNERDEAD); the rebuild drops
// half-built connections, relinks the chains and free lists, recounts every
// count (the under-pace marks of budget mode, pending handoffs) and moves
// every key's generation.

#include "src/shm/zone_repair.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <memory>

#include "gtest/gtest.h"
#include "src/budget/budget.h"
#include "src/shm/key_budget.h"
#include "src/shm/robust_mutex.h"
#include "src/shm/zone.h"
#include "src/shm/zone_layout.h"
#include "tests/shm/zone_fixture.h"

namespace trafficrate {
namespace {

using testing_util::MakeKey;
using testing_util::Pipe;
using testing_util::ReadByte;
using testing_util::WaitChild;
using testing_util::WriteByte;

using ZoneRepairTest = testing_util::ZoneFixture;

TEST_F(ZoneRepairTest, LockHolderKilledMidUpdateLeavesARepairedTable) {
  std::unique_ptr<Zone> zone = Open(kMinZoneSize);
  ASSERT_NE(zone, nullptr);
  uint32_t a_conns[3];
  {
    ZoneLock lock(*zone);
    ASSERT_TRUE(lock.ok());
    for (int i = 0; i < 3; ++i) {
      a_conns[i] = RegisterLocked(*zone, 1, 2, 20 + i);
      ASSERT_NE(a_conns[i], kNoSlot);
    }
    zone->conns().JoinLocked(a_conns[0]);
    zone->conns().JoinLocked(a_conns[1]);
  }
  const uint32_t key_a = zone->conns().slot(a_conns[0]).key_index.load();
  Pipe holding;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Dies inside the critical section with the table half-written.
    ZoneLock lock(*zone);
    TRAFFICRATE_CHILD_CHECK(lock.ok());
    const uint32_t b = zone->keys().FindOrInsertLocked(MakeKey(2).bytes, 1);
    TRAFFICRATE_CHILD_CHECK(b != kNoSlot);
    zone->keys().slot(key_a).refs.store(999);
    zone->keys().slot(key_a).active.store(77);
    zone->header().conns_used = 12345;
    zone->header().conn_free_head = kNoSlot;  // as if the list was lost
    zone->procs().slot(2).conns.store(55);
    WriteByte(holding.write_end());
    raise(SIGKILL);
    _exit(1);
  }
  holding.CloseWrite();  // EOF at once if the child dies early
  ASSERT_TRUE(ReadByte(holding.read_end())) << "the child never took the lock";
  const int status = WaitChild(pid);
  ASSERT_TRUE(status != -1 && WIFSIGNALED(status) &&
              WTERMSIG(status) == SIGKILL);
  // The kernel released the dead owner's robust lock; locking must not block.
  ASSERT_TRUE(MutexOwnerDied(zone->header().lock));
  const uint64_t repairs = zone->header().lock_repairs.load();
  const uint32_t change = zone->changes().Current();
  {
    ZoneLock lock(*zone);
    ASSERT_TRUE(lock.ok());
    const ZoneHeaderShm& h = zone->header();
    EXPECT_EQ(h.lock_repairs.load(), repairs + 1);
    EXPECT_EQ(zone->keys().slot(key_a).refs.load(), 3u);
    EXPECT_EQ(zone->keys().slot(key_a).active.load(), 2u);
    EXPECT_EQ(h.conns_used, 3u);
    EXPECT_EQ(h.keys_used, 1u);
    EXPECT_EQ(zone->procs().slot(2).conns.load(), 3u);
    EXPECT_EQ(zone->keys().FindLocked(MakeKey(1).bytes), key_a);
    EXPECT_EQ(zone->keys().FindLocked(MakeKey(2).bytes), kNoSlot)
        << "a key without connections is dropped";
    // The free lists were rebuilt: every other slot can be used.
    uint32_t registered = 0;
    for (uint32_t n = 10; n < 10 + zone->keys().capacity(); ++n) {
      if (RegisterLocked(*zone, n, 0) == kNoSlot) break;
      ++registered;
    }
    EXPECT_EQ(registered, zone->conns().capacity() - 3);
    EXPECT_EQ(h.keys_used, 1 + registered);
    for (uint32_t c = 0; c < zone->conns().capacity(); ++c) {
      if ((zone->conns().slot(c).seq.load() & 1) &&
          zone->conns().slot(c).key_index.load() != key_a) {
        zone->conns().DeregisterLocked(c);
      }
    }
    EXPECT_EQ(h.keys_used, 1u);
    EXPECT_EQ(h.conns_used, 3u);
  }
  EXPECT_NE(zone->changes().Current(), change)
      << "watchers are told to re-apply";
  EXPECT_FALSE(MutexOwnerDied(zone->header().lock));
  // Later lockers see a plain, consistent lock.
  ZoneLock again(*zone);
  EXPECT_TRUE(again.ok());
  EXPECT_EQ(zone->header().lock_repairs.load(), repairs + 1);
}

TEST_F(ZoneRepairTest, ARepairRebuildsTheTablesFromTheConnectionSlots) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ConnTable& conns = zone->conns();
  const ZoneTables& t = zone->segment().tables();
  ZoneHeaderShm& h = zone->header();
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const uint32_t c1 = RegisterLocked(*zone, 1, 0);
  const uint32_t c2 = RegisterLocked(*zone, 2, 1);
  ASSERT_EQ(c2, 1u);
  ASSERT_TRUE(conns.JoinLocked(c1));
  ASSERT_TRUE(zone->handoffs().PublishLocked(10, c1, 1, 0, 1000));
  const uint32_t k1 = conns.slot(c1).key_index.load();
  const uint32_t k2 = conns.slot(c2).key_index.load();
  const uint32_t generation = zone->keys().slot(k2).generation.load();
  // What a holder killed half-way may leave: a connection published for a
  // key out of range, counts gone wrong, a chain and the lists lost.
  ConnSlotShm& half = conns.slot(2);
  half.seq.store(half.seq.load() | 1);
  half.key_index.store(zone->keys().capacity());
  h.conns_used = 50;
  h.keys_used = 50;
  h.conn_free_head = kNoSlot;
  h.key_free_head = kNoSlot;
  h.handoffs_pending.store(9);
  zone->keys().slot(k2).refs.store(7);
  zone->procs().slot(1).conns.store(9);
  t.buckets[zone->keys().BucketOf(MakeKey(1).bytes)] = kNoSlot;
  const uint64_t repairs = h.lock_repairs.load();

  RepairZoneLocked(t, zone->keys());
  EXPECT_EQ(h.lock_repairs.load(), repairs + 1);
  EXPECT_EQ(h.conns_used, 2u);
  EXPECT_EQ(h.keys_used, 2u);
  EXPECT_EQ(h.handoffs_pending.load(), 1u);
  EXPECT_EQ(zone->keys().FindLocked(MakeKey(1).bytes), k1) << "relinked";
  EXPECT_EQ(zone->keys().slot(k1).refs.load(), 1u);
  EXPECT_EQ(zone->keys().slot(k1).active.load(), 1u);
  EXPECT_EQ(zone->keys().slot(k2).refs.load(), 1u);
  EXPECT_EQ(zone->keys().slot(k2).active.load(), 0u);
  EXPECT_NE(zone->keys().slot(k2).generation.load(), generation);
  EXPECT_EQ(zone->procs().slot(0).conns.load(), 1u);
  EXPECT_EQ(zone->procs().slot(1).conns.load(), 1u);
  EXPECT_EQ(half.seq.load() & 1, 0u) << "the half-built one is freed";
  EXPECT_EQ(half.key_index.load(), kNoSlot);
  EXPECT_EQ(h.conn_free_head, 2u);
  EXPECT_EQ(h.key_free_head, 2u);
  EXPECT_TRUE(zone->handoffs().MayBeHandedOff(c1, 1));
}

// Budget mode: the count of a key's connections under their pace is
// recounted from the marks of its sending connections, and the rest of the
// key's budget state is kept.
TEST_F(ZoneRepairTest, ARepairRecountsTheUnderPaceMarks) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ConnTable& conns = zone->conns();
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const auto [c1, c2, c3] = RegisterEachLocked<3>(*zone, 9);
  ASSERT_NE(c3, kNoSlot);
  KeySlotShm& key = zone->keys().slot(conns.slot(c1).key_index.load());
  ASSERT_TRUE(conns.JoinLocked(c1));
  ASSERT_TRUE(conns.JoinLocked(c2));
  conns.SetUnderPace(c1, true);
  conns.SetUnderPace(c2, true);
  conns.slot(c3).under_pace.store(1);  // a mark on one not sending
  BudgetState state = LoadBudget(key);
  state.packet_bytes = 65536;
  StoreBudget(key, state);
  key.budget_aux.fetch_or(~BudgetAux::kHolderMask);  // a count gone wrong
  zone->RepairLocked();
  EXPECT_EQ(UnderPaceOf(key), 2u);
  EXPECT_EQ(conns.slot(c3).under_pace.load(), 0u);
  EXPECT_EQ(LoadBudget(key).packet_bytes, 65536u);
}

}  // namespace
}  // namespace trafficrate
