// The zone as a whole, through its handle: a zone created and attached by
// another opener (each process with the geometry it validated), the live
// rate the last opener sets, counts from forked processes that add up, the
// reaping scan (ReapDead) over the process table, and the zone lock: its
// bounds when a holder stops (issue 8), repair when one dies, and a lock
// damaged while held, or a corrupt zone, not used any more. The parts each
// have their own test (key_table_test.cc, conn_table_test.cc ...); the
// fixtures are in zone_fixture.h.

#include "src/shm/zone.h"

#include <errno.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <set>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "src/shm/zone_layout.h"
#include "tests/shm/zone_fixture.h"

namespace trafficrate {
namespace {

using testing_util::ElapsedNs;
using testing_util::ExitedWith;
using testing_util::kLockSlackNs;
using testing_util::kOneMiB;
using testing_util::kPeer;
using testing_util::kRate;
using testing_util::LockHolder;
using testing_util::MakeKey;
using testing_util::Pipe;
using testing_util::ReadByte;
using testing_util::TestKey;
using testing_util::WaitChild;
using testing_util::WriteByte;

using ZoneTest = testing_util::ZoneFixture;

// The header's checks are the segment's (zone_segment_test.cc); each part
// works on the tables the segment validated.
TEST_F(ZoneTest, ACreatedZonesPartsHaveItsCapacitiesAndEmptyTables) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  const ZoneHeaderShm& h = zone->header();
  const ZoneGeometry g = ComputeZoneGeometry(kOneMiB);
  EXPECT_EQ(&h, zone->segment().tables().header);
  EXPECT_EQ(zone->settings().RuleRate(0), kRate);
  EXPECT_EQ(zone->keys().capacity(), g.key_capacity);
  EXPECT_EQ(zone->conns().capacity(), g.conn_capacity);
  EXPECT_EQ(zone->procs().capacity(), g.proc_capacity);
  EXPECT_EQ(zone->handoffs().capacity(), g.handoff_capacity);
  EXPECT_EQ(zone->name(), zone_name_);
  EXPECT_EQ(zone->path(), zone->segment().path());
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  EXPECT_EQ(h.keys_used, 0u);
  EXPECT_EQ(h.conns_used, 0u);
  EXPECT_EQ(zone->keys().FindLocked(MakeKey(1).bytes), kNoSlot);
}

TEST_F(ZoneTest, SecondOpenerAttachesAndSeesTheFirstsData) {
  std::unique_ptr<Zone> first = Open();
  ASSERT_NE(first, nullptr);
  uint32_t conn = kNoSlot;
  {
    ZoneLock lock(*first);
    ASSERT_TRUE(lock.ok());
    conn = RegisterLocked(*first, 42, 3);
    ASSERT_NE(conn, kNoSlot);
    EXPECT_TRUE(first->conns().JoinLocked(conn));
  }
  std::unique_ptr<Zone> second = Open();
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->header().hash_seed[0], first->header().hash_seed[0]);
  EXPECT_EQ(second->header().hash_seed[1], first->header().hash_seed[1]);
  {
    ZoneLock lock(*second);
    ASSERT_TRUE(lock.ok());
    const uint32_t k = second->keys().FindLocked(MakeKey(42).bytes);
    ASSERT_NE(k, kNoSlot);
    EXPECT_EQ(second->keys().slot(k).refs.load(), 1u);
    EXPECT_EQ(second->keys().slot(k).active.load(), 1u);
    EXPECT_EQ(second->conns().slot(conn).key_index.load(), k);
    EXPECT_EQ(second->conns().slot(conn).proc_index.load(), 3u);
    EXPECT_EQ(second->header().conns_used, 1u);
    // A change through the second mapping shows in the first.
    EXPECT_TRUE(second->conns().DeregisterLocked(conn));
  }
  ZoneLock lock(*first);
  EXPECT_EQ(first->header().conns_used, 0u);
  EXPECT_EQ(first->header().keys_used, 0u);
  EXPECT_EQ(first->keys().FindLocked(MakeKey(42).bytes), kNoSlot);
}

// The crash of issue 8: three header fields set to large values in a live
// zone. Each process keeps the geometry it validated at attach, so the
// stray values move no index out of the mapping (the sanitizer builds
// would see it) and the tables go on working.
TEST_F(ZoneTest, GeometryOverwrittenInALiveZoneIsNotUsed) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  const uint32_t keys = zone->keys().capacity();
  const uint32_t conns = zone->conns().capacity();
  const uint32_t procs = zone->procs().capacity();
  ZoneHeaderShm& h = zone->header();
  const uint32_t buckets = h.bucket_count;
  h.key_capacity = 0xfffffff0u;
  h.conn_capacity = 0xfffffff0u;
  h.proc_capacity = 0xfffffff0u;
  h.bucket_count = 0x80000000u;
  h.keys_offset = ~0ull;
  h.conns_offset = ~0ull;
  EXPECT_EQ(zone->keys().capacity(), keys);
  EXPECT_EQ(zone->conns().capacity(), conns);
  EXPECT_EQ(zone->procs().capacity(), procs);
  std::set<uint32_t> seen;
  for (uint32_t n = 0; n < 64; ++n) {
    const uint32_t bucket = zone->keys().BucketOf(MakeKey(n).bytes);
    seen.insert(bucket);
    EXPECT_LT(bucket, buckets);
  }
  EXPECT_GT(seen.size(), 1u);  // still a hash, not a constant
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const uint32_t conn = RegisterLocked(*zone, 7, 0);
  ASSERT_NE(conn, kNoSlot);
  EXPECT_LT(conn, conns);
  EXPECT_TRUE(zone->conns().JoinLocked(conn));
  const uint32_t k = zone->keys().FindLocked(MakeKey(7).bytes);
  ASSERT_LT(k, keys);
  EXPECT_EQ(zone->keys().slot(k).active.load(), 1u);
  EXPECT_TRUE(zone->conns().DeregisterLocked(conn));
  EXPECT_EQ(zone->keys().FindLocked(MakeKey(7).bytes), kNoSlot);
  // Out-of-range indices written into the tables are refused, not followed.
  h.conn_free_head = 0xfffffff0u;
  h.key_free_head = 0xfffffff0u;
  EXPECT_EQ(RegisterLocked(*zone, 8, 0), kNoSlot);
}

TEST_F(ZoneTest, LastOpenerWithAnotherRateSetsTheLiveRate) {
  std::unique_ptr<Zone> first = Open(kOneMiB, kRate);
  ASSERT_NE(first, nullptr);
  const uint32_t settings = first->header().settings_generation.load();
  std::unique_ptr<Zone> same = Open(kOneMiB, kRate);
  ASSERT_NE(same, nullptr);
  EXPECT_EQ(first->header().settings_generation.load(), settings);
  std::unique_ptr<Zone> second = Open(kOneMiB, 3 * kRate);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(first->header().rate_bytes_per_sec.load(), 3 * kRate);
  EXPECT_NE(first->header().settings_generation.load(), settings);
}

TEST_F(ZoneTest, CountsFromForkedProcessesAddUp) {
  constexpr int kChildren = 4;
  constexpr int kRounds = 500;
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  const TestKey shared = MakeKey(1000);
  Pipe go;
  std::vector<pid_t> children;
  for (int child = 0; child < kChildren; ++child) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      go.CloseWrite();
      // Start together: wait until the parent closes the pipe.
      char c;
      while (read(go.read_end(), &c, 1) < 0 && errno == EINTR) {
      }
      const uint32_t proc = static_cast<uint32_t>(child);
      for (int i = 0; i < kRounds; ++i) {
        {
          // A connection that stays; every other one also stays active.
          // (The children contend for the lock: a long wait, so that a
          // slow sanitizer build cannot time out.)
          ZoneLock lock(*zone, kWatcherLockWaitNs);
          TRAFFICRATE_CHILD_CHECK(lock.ok());
          const uint32_t k = zone->keys().FindOrInsertLocked(shared.bytes, 1);
          TRAFFICRATE_CHILD_CHECK(k != kNoSlot);
          const uint32_t c = zone->conns().RegisterLocked(k, proc, i, kPeer, 1);
          TRAFFICRATE_CHILD_CHECK(c != kNoSlot);
          if (i % 2 == 0) TRAFFICRATE_CHILD_CHECK(zone->conns().JoinLocked(c));
        }
        {
          // A connection with a key of its own that comes and goes.
          ZoneLock lock(*zone, kWatcherLockWaitNs);
          TRAFFICRATE_CHILD_CHECK(lock.ok());
          const TestKey own = MakeKey(static_cast<uint32_t>(i), 1 + child);
          const uint32_t k = zone->keys().FindOrInsertLocked(own.bytes, 1);
          TRAFFICRATE_CHILD_CHECK(k != kNoSlot);
          const uint32_t c =
              zone->conns().RegisterLocked(k, proc, -1, kPeer, 2);
          TRAFFICRATE_CHILD_CHECK(c != kNoSlot);
          TRAFFICRATE_CHILD_CHECK(zone->conns().JoinLocked(c));
          TRAFFICRATE_CHILD_CHECK(zone->conns().LeaveLocked(c));
          TRAFFICRATE_CHILD_CHECK(!zone->conns().DeregisterLocked(c));
        }
      }
      _exit(0);
    }
    children.push_back(pid);
  }
  go.CloseWrite();
  for (const pid_t pid : children) {
    EXPECT_TRUE(ExitedWith(WaitChild(pid), 0)) << "child " << pid;
  }
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const ZoneHeaderShm& h = zone->header();
  EXPECT_EQ(h.lock_repairs.load(), 0u);
  EXPECT_EQ(h.keys_used, 1u) << "the coming-and-going keys were all freed";
  EXPECT_EQ(h.conns_used, uint32_t{kChildren * kRounds});
  const uint32_t k = zone->keys().FindLocked(shared.bytes);
  ASSERT_NE(k, kNoSlot);
  EXPECT_EQ(zone->keys().slot(k).refs.load(), uint32_t{kChildren * kRounds});
  EXPECT_EQ(zone->keys().slot(k).active.load(),
            uint32_t{kChildren * kRounds / 2});
  for (uint32_t p = 0; p < kChildren; ++p) {
    EXPECT_EQ(zone->procs().slot(p).conns.load(), uint32_t{kRounds}) << p;
  }
  for (uint32_t c = 0; c < zone->conns().capacity(); ++c) {
    if (zone->conns().slot(c).seq.load() & 1) zone->conns().DeregisterLocked(c);
  }
  EXPECT_EQ(h.conns_used, 0u);
  EXPECT_EQ(h.keys_used, 0u) << "no key leaked";
}

TEST_F(ZoneTest, ReapDeadReleasesEveryDeadProcessAndWakesWatchers) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  const OwnProc own(*zone);
  const uint32_t me = own.slot();
  ASSERT_NE(me, kNoSlot);
  ASSERT_NE(Register(*zone, 1, me), kNoSlot);
  constexpr int kDying = 2;
  Pipe ready;
  pid_t children[kDying];
  for (int i = 0; i < kDying; ++i) {
    children[i] = fork();
    ASSERT_GE(children[i], 0);
    if (children[i] == 0) {
      {
        ZoneLock lock(*zone);
        const uint32_t slot = zone->procs().ClaimLocked(getpid(), 1);
        TRAFFICRATE_CHILD_CHECK(slot != kNoSlot);
        for (int n = 0; n < 3; ++n) {
          const uint32_t c = RegisterLocked(*zone, 1, slot);
          TRAFFICRATE_CHILD_CHECK(c != kNoSlot && zone->conns().JoinLocked(c));
        }
      }
      WriteByte(ready.write_end());
      _exit(0);  // dies holding its liveness mutex
    }
  }
  ready.CloseWrite();
  for (int i = 0; i < kDying; ++i) {
    ASSERT_TRUE(ReadByte(ready.read_end()));
    EXPECT_TRUE(ExitedWith(WaitChild(children[i]), 0));
  }
  EXPECT_EQ(zone->header().conns_used, 1u + 3u * kDying);
  const uint32_t change = zone->changes().Current();
  uint32_t procs = 0;
  EXPECT_EQ(zone->ReapDead(&procs), 3u * kDying);
  EXPECT_EQ(procs, uint32_t{kDying});
  EXPECT_NE(zone->changes().Current(), change);
  ZoneLock lock(*zone);
  EXPECT_EQ(zone->header().conns_used, 1u);
  const uint32_t key = zone->keys().FindLocked(MakeKey(1).bytes);
  ASSERT_NE(key, kNoSlot);
  EXPECT_EQ(zone->keys().slot(key).refs.load(), 1u);
  EXPECT_EQ(zone->keys().slot(key).active.load(), 0u);
  EXPECT_EQ(zone->procs().slot(me).state.load(), kProcLive)
      << "the live one stays";
  EXPECT_EQ(zone->procs().slot(me).conns.load(), 1u);
}

TEST_F(ZoneTest, ReapDeadScansTheClaimedSlotsAndNowAndThenAllOfThem) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  const OwnProc own(*zone);
  const uint32_t me = own.slot();
  ASSERT_NE(me, kNoSlot);
  EXPECT_EQ(zone->header().procs_high_water.load(), me + 1);
  uint32_t procs = 0;
  EXPECT_EQ(zone->ReapDead(&procs), 0u);  // the first pass: every slot
  // A child claims the next slot and dies holding a connection; a second
  // one does the same but lowers the high water again, as a process of an
  // older version (which does not keep it) would leave it.
  for (const bool lower : {false, true}) {
    Pipe ready;
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      {
        ZoneLock lock(*zone);
        const uint32_t slot = zone->procs().ClaimLocked(getpid(), 1);
        TRAFFICRATE_CHILD_CHECK(slot != kNoSlot && slot > me);
        TRAFFICRATE_CHILD_CHECK(RegisterLocked(*zone, 1, slot) != kNoSlot);
        if (lower) {
          zone->header().procs_high_water.store(me + 1);
        }
      }
      WriteByte(ready.write_end());
      _exit(0);  // dies holding its liveness mutex
    }
    ready.CloseWrite();
    ASSERT_TRUE(ReadByte(ready.read_end()));
    EXPECT_TRUE(ExitedWith(WaitChild(child), 0));
    if (!lower) {
      // Below the high water: the next pass finds it.
      EXPECT_GT(zone->header().procs_high_water.load(), me + 1);
      EXPECT_EQ(zone->ReapDead(&procs), 1u);
      EXPECT_EQ(procs, 1u);
      continue;
    }
    // Above it: not in the next pass, but within one full round.
    EXPECT_EQ(zone->ReapDead(&procs), 0u);
    uint32_t passes = 1;
    uint32_t reaped = 0;
    while (reaped == 0 && passes < 2 * ProcTable::kFullReapEvery) {
      reaped = zone->ReapDead(&procs);
      ++passes;
    }
    EXPECT_EQ(reaped, 1u);
    EXPECT_LE(passes, ProcTable::kFullReapEvery);
  }
  EXPECT_EQ(zone->procs().slot(me).state.load(), kProcLive);
}

TEST_F(ZoneTest, ACorruptZoneIsNotLockedAnyMore) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  zone->header().hash_seed[1] ^= 1;
  EXPECT_FALSE(zone->segment().CheckHeader());
  const int64_t start = MonotonicNowNs();
  ZoneLock lock(*zone, kWatcherLockWaitNs);
  EXPECT_FALSE(lock.ok());
  EXPECT_LT(ElapsedNs(start), kLockSlackNs) << "not even tried";
  EXPECT_EQ(MutexHolder(zone->header().lock), 0);
  EXPECT_EQ(zone->lock_timeouts(), 0u);
}

// --- The zone lock, held by another process.

using ZoneLockTest = testing_util::ZoneFixture;

TEST_F(ZoneLockTest, AStoppedHolderCostsOneShortWaitThenNothingUntilItLetsGo) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  LockHolder holder(*zone);
  ASSERT_TRUE(holder.holding());
  ASSERT_TRUE(holder.Stop());
  EXPECT_EQ(zone->LockHolder(), holder.pid());  // its main thread

  int64_t start = MonotonicNowNs();
  {
    ZoneLock lock(*zone);
    EXPECT_FALSE(lock.ok());
  }
  int64_t waited = ElapsedNs(start);
  EXPECT_GE(waited, kHostLockWaitNs - kNsPerMs);
  EXPECT_LT(waited, kHostLockWaitNs + kLockSlackNs);
  EXPECT_TRUE(zone->lock_stalled());
  EXPECT_EQ(zone->header().lock_timeouts.load(), 1u);

  // Stalled: later locks only try it, the watcher's included.
  start = MonotonicNowNs();
  for (int i = 0; i < 100; ++i) {
    ZoneLock lock(*zone, kWatcherLockWaitNs);
    EXPECT_FALSE(lock.ok());
  }
  EXPECT_LT(ElapsedNs(start), kLockSlackNs);
  EXPECT_EQ(zone->header().lock_timeouts.load(), 101u);
  EXPECT_EQ(zone->lock_timeouts(), 101u);

  // The watcher's look waits kLockRecheckWaitNs, and it is still held.
  start = MonotonicNowNs();
  EXPECT_FALSE(zone->RecheckLock());
  waited = ElapsedNs(start);
  EXPECT_GE(waited, kLockRecheckWaitNs - kNsPerMs);
  EXPECT_LT(waited, kLockRecheckWaitNs + kLockSlackNs);

  ASSERT_TRUE(holder.Release());
  EXPECT_TRUE(zone->RecheckLock());
  EXPECT_FALSE(zone->lock_stalled());
  ZoneLock lock(*zone);
  EXPECT_TRUE(lock.ok());
  EXPECT_EQ(zone->LockHolder(), static_cast<int32_t>(gettid()));
}

TEST_F(ZoneLockTest, AHolderKilledWhileStoppedIsRepairedAtTheNextLook) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  LockHolder holder(*zone);
  ASSERT_TRUE(holder.holding());
  ASSERT_TRUE(holder.Stop());
  {
    ZoneLock lock(*zone);
    EXPECT_FALSE(lock.ok());
  }
  EXPECT_TRUE(zone->lock_stalled());
  holder.Kill();
  EXPECT_TRUE(zone->RecheckLock());
  EXPECT_FALSE(zone->lock_stalled());
  EXPECT_EQ(zone->header().lock_repairs.load(), 1u);
  ZoneLock lock(*zone);
  EXPECT_TRUE(lock.ok());
}

TEST_F(ZoneLockTest, ALockWhoseLinksChangeWhileHeldIsNotFollowed) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  pthread_mutex_t& mutex = zone->header().lock;
  __pthread_list_t links{};
  {
    ZoneLock lock(*zone);
    ASSERT_TRUE(lock.ok());
    links = mutex.__data.__list;
    // What a stray write could leave: glibc would write through it.
    mutex.__data.__list.__next = reinterpret_cast<__pthread_list_t*>(0x1000);
  }
  EXPECT_TRUE(zone->segment().corrupt());
  EXPECT_EQ(zone->header().corrupt.load(), 1u);
  // Left locked by this thread: put it right, so that the rest of this test
  // process never meets the damaged links in its robust list.
  mutex.__data.__list = links;
  EXPECT_EQ(pthread_mutex_unlock(&mutex), 0);
  ZoneLock lock(*zone);
  EXPECT_FALSE(lock.ok());  // corrupt: not used any more
}

TEST_F(ZoneLockTest, ALockWhoseKindChangesWhileHeldIsNotFollowed) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  pthread_mutex_t& mutex = zone->header().lock;
  int kind = 0;
  {
    ZoneLock lock(*zone);
    ASSERT_TRUE(lock.ok());
    kind = mutex.__data.__kind;
    mutex.__data.__kind = 0;  // a plain mutex: glibc would not unlink it
  }
  EXPECT_TRUE(zone->segment().corrupt());
  mutex.__data.__kind = kind;
  EXPECT_EQ(pthread_mutex_unlock(&mutex), 0);
}

}  // namespace
}  // namespace trafficrate
