// The shm zone across processes: counts from forked children add up, a lock
// holder killed mid-update leaves a repaired table (EOWNERDEAD), process
// liveness and reaping of dead processes' connections, and futex wakes of
// watchers in another process. The single-process tests are in zone_test.cc;
// the fixture is in test_util.h.

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "src/shm/zone.h"
#include "src/shm/zone_layout.h"
#include "tests/shm/zone_fixture.h"

namespace trafficrate {
namespace {

using testing_util::ExitedWith;
using testing_util::kPeer;
using testing_util::kRate;
using testing_util::kWaitNs;
using testing_util::MakeKey;
using testing_util::MutexReleaser;
using testing_util::Pipe;
using testing_util::PollUntil;
using testing_util::ReadByte;
using testing_util::TestKey;
using testing_util::WaitChild;
using testing_util::WriteByte;

// Reads the robust mutex word, as ProcTable::MaybeDead does for proc slots.
bool OwnerDied(const pthread_mutex_t& mutex) {
  return (__atomic_load_n(&mutex.__data.__lock, __ATOMIC_ACQUIRE) &
          FUTEX_OWNER_DIED) != 0;
}

using ZoneTest = testing_util::ZoneFixture;

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

TEST_F(ZoneTest, LockHolderKilledMidUpdateLeavesARepairedTable) {
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
  ASSERT_TRUE(OwnerDied(zone->header().lock));
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
  EXPECT_FALSE(OwnerDied(zone->header().lock));
  // Later lockers see a plain, consistent lock.
  ZoneLock again(*zone);
  EXPECT_TRUE(again.ok());
  EXPECT_EQ(zone->header().lock_repairs.load(), repairs + 1);
}

TEST_F(ZoneTest, WaitForChangeReturnsAtOnceWhenTheWordAlreadyMoved) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  const uint32_t seen = zone->changes().Current();
  zone->changes().WakeWatchers();
  EXPECT_NE(zone->changes().Current(), seen);
  const int64_t start = MonotonicNowNs();
  zone->changes().WaitForChange(seen, 60 * kNsPerSec);
  EXPECT_LT(MonotonicNowNs() - start, kWaitNs);
  EXPECT_EQ(zone->header().watchers_waiting.load(), 0u);
}

TEST_F(ZoneTest, WakeWatchersWakesAWaiterInAnotherProcess) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  constexpr int64_t kLongTimeoutNs = 60 * kNsPerSec;
  const uint32_t seen = zone->changes().Current();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int64_t start = MonotonicNowNs();
    zone->changes().WaitForChange(seen, kLongTimeoutNs);
    TRAFFICRATE_CHILD_CHECK(zone->changes().Current() != seen);
    TRAFFICRATE_CHILD_CHECK(MonotonicNowNs() - start < kLongTimeoutNs / 2);
    _exit(0);
  }
  // Wake only once the child is (about to be) blocked in the futex.
  const bool waiting =
      PollUntil([&] { return zone->header().watchers_waiting.load() == 1; });
  const int64_t woken = MonotonicNowNs();
  zone->changes().WakeWatchers();
  const int status = WaitChild(pid, kLongTimeoutNs / 4);
  const int64_t took = MonotonicNowNs() - woken;
  ASSERT_TRUE(waiting) << "the child never waited";
  EXPECT_TRUE(ExitedWith(status, 0)) << status;
  EXPECT_LT(took, kWaitNs) << "the waiter slept on after the wake";
  EXPECT_EQ(zone->header().watchers_waiting.load(), 0u);
}

TEST_F(ZoneTest, SetRateStoresTheRateAndWakesWatchers) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  const uint32_t settings = zone->header().settings_generation.load();
  const uint32_t change = zone->changes().Current();
  zone->settings().SetRate(5 * kRate);
  EXPECT_EQ(zone->header().rate_bytes_per_sec.load(), 5 * kRate);
  EXPECT_EQ(zone->header().settings_generation.load(), settings + 1);
  EXPECT_NE(zone->changes().Current(), change);
}

TEST_F(ZoneTest, DeadProcessIsReapedAndALiveOneIsNot) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  // This process: a live slot owning two connections of key 1, one sending.
  const uint32_t me = ClaimProc(*zone);
  ASSERT_NE(me, kNoSlot);
  MutexReleaser release_me(&zone->procs().slot(me).liveness);
  {
    ZoneLock lock(*zone);
    const uint32_t c = RegisterLocked(*zone, 1, me, 30);
    ASSERT_NE(c, kNoSlot);
    zone->conns().JoinLocked(c);
    ASSERT_NE(RegisterLocked(*zone, 1, me, 31), kNoSlot);
  }
  // Two children: one will die, one stays alive until told to go.
  Pipe ready;
  Pipe finish;
  pid_t children[2];
  for (int i = 0; i < 2; ++i) {
    children[i] = fork();
    ASSERT_GE(children[i], 0);
    if (children[i] == 0) {
      finish.CloseWrite();
      uint32_t slot = kNoSlot;
      {
        ZoneLock lock(*zone);
        TRAFFICRATE_CHILD_CHECK(lock.ok());
        // The main thread claims and so holds the liveness mutex.
        slot = zone->procs().ClaimLocked(getpid(), 1);
        TRAFFICRATE_CHILD_CHECK(slot != kNoSlot);
        // Key 1: three connections, two sending; key 2: two connections.
        for (int n = 0; n < 3; ++n) {
          const uint32_t c = RegisterLocked(*zone, 1, slot, 40 + n);
          TRAFFICRATE_CHILD_CHECK(c != kNoSlot);
          if (n < 2) TRAFFICRATE_CHILD_CHECK(zone->conns().JoinLocked(c));
        }
        for (int n = 0; n < 2; ++n) {
          TRAFFICRATE_CHILD_CHECK(RegisterLocked(*zone, 2 + i, slot, 50) !=
                                  kNoSlot);
        }
      }
      WriteByte(ready.write_end());
      ReadByte(finish.read_end());  // killed here, or told to finish
      _exit(0);
    }
  }
  finish.CloseRead();
  ready.CloseWrite();
  ASSERT_TRUE(ReadByte(ready.read_end()));
  ASSERT_TRUE(ReadByte(ready.read_end()));
  uint32_t slots[2] = {kNoSlot, kNoSlot};
  for (uint32_t p = 0; p < zone->procs().capacity(); ++p) {
    for (int i = 0; i < 2; ++i) {
      if (zone->procs().slot(p).state.load() == kProcLive &&
          zone->procs().slot(p).pid.load() == children[i]) {
        slots[i] = p;
      }
    }
  }
  ASSERT_NE(slots[0], kNoSlot);
  ASSERT_NE(slots[1], kNoSlot);
  const uint32_t dead = slots[0];
  const uint32_t live = slots[1];
  EXPECT_FALSE(ProcTable::MaybeDead(zone->procs().slot(dead)));
  EXPECT_FALSE(ProcTable::MaybeDead(zone->procs().slot(live)));
  EXPECT_FALSE(ProcTable::MaybeDead(zone->procs().slot(me)));
  {
    ZoneLock lock(*zone);
    EXPECT_EQ(zone->header().conns_used, 2u + 5u + 5u);
    uint32_t reaped = 99;
    EXPECT_FALSE(zone->procs().ReapIfDeadLocked(dead, &reaped))
        << "still alive";
    EXPECT_EQ(reaped, 99u);
  }

  ASSERT_EQ(kill(children[0], SIGKILL), 0);
  const int status = WaitChild(children[0]);
  ASSERT_TRUE(status != -1 && WIFSIGNALED(status));
  EXPECT_TRUE(ProcTable::MaybeDead(zone->procs().slot(dead)));
  EXPECT_FALSE(ProcTable::MaybeDead(zone->procs().slot(live)));
  {
    ZoneLock lock(*zone);
    ASSERT_TRUE(lock.ok());
    const uint32_t key1 = zone->keys().FindLocked(MakeKey(1).bytes);
    ASSERT_NE(key1, kNoSlot);
    EXPECT_EQ(zone->keys().slot(key1).refs.load(), 2u + 3u + 3u);
    EXPECT_EQ(zone->keys().slot(key1).active.load(), 1u + 2u + 2u);
    const uint32_t gen = zone->keys().slot(key1).generation.load();

    EXPECT_FALSE(zone->procs().ReapIfDeadLocked(live, nullptr))
        << "a live process";
    EXPECT_FALSE(zone->procs().ReapIfDeadLocked(me, nullptr))
        << "the caller itself";
    uint32_t reaped = 0;
    EXPECT_TRUE(zone->procs().ReapIfDeadLocked(dead, &reaped));
    EXPECT_EQ(reaped, 5u);
    EXPECT_FALSE(zone->procs().ReapIfDeadLocked(dead, nullptr))
        << "already free";
    EXPECT_FALSE(
        zone->procs().ReapIfDeadLocked(zone->procs().capacity(), nullptr));

    EXPECT_EQ(zone->keys().slot(key1).refs.load(), 2u + 3u);
    EXPECT_EQ(zone->keys().slot(key1).active.load(), 1u + 2u);
    EXPECT_NE(zone->keys().slot(key1).generation.load(), gen);
    EXPECT_EQ(zone->keys().FindLocked(MakeKey(2).bytes), kNoSlot);
    EXPECT_NE(zone->keys().FindLocked(MakeKey(3).bytes), kNoSlot);
    EXPECT_EQ(zone->header().conns_used, 2u + 5u);
    EXPECT_EQ(zone->header().keys_used, 2u);
    EXPECT_EQ(zone->header().procs_reaped.load(), 1u);
    EXPECT_EQ(zone->header().conns_reaped.load(), 5u);
    EXPECT_EQ(zone->procs().slot(dead).state.load(), kProcFree);
    EXPECT_EQ(zone->procs().slot(live).conns.load(), 5u);
    EXPECT_EQ(zone->procs().slot(me).conns.load(), 2u);
    for (uint32_t c = 0; c < zone->conns().capacity(); ++c) {
      if (zone->conns().slot(c).seq.load() & 1) {
        EXPECT_NE(zone->conns().slot(c).proc_index.load(), dead) << c;
      }
    }
    // The reaped slot's mutex was made consistent: it can be claimed again.
    EXPECT_FALSE(OwnerDied(zone->procs().slot(dead).liveness));
    const uint32_t again = zone->procs().ClaimLocked(getpid(), 2);
    ASSERT_NE(again, kNoSlot);
    MutexReleaser release_again(&zone->procs().slot(again).liveness);
    EXPECT_EQ(again, dead) << "the lowest free slot";
  }
  WriteByte(finish.write_end());
  EXPECT_TRUE(ExitedWith(WaitChild(children[1]), 0));
}

TEST_F(ZoneTest, ReapDeadReleasesEveryDeadProcessAndWakesWatchers) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  const uint32_t me = ClaimProc(*zone);
  ASSERT_NE(me, kNoSlot);
  MutexReleaser release_me(&zone->procs().slot(me).liveness);
  {
    ZoneLock lock(*zone);
    ASSERT_NE(RegisterLocked(*zone, 1, me), kNoSlot);
  }
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
  const uint32_t me = ClaimProc(*zone);
  ASSERT_NE(me, kNoSlot);
  MutexReleaser release_me(&zone->procs().slot(me).liveness);
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

TEST_F(ZoneTest, ProcSlotsAreClaimedOncePerLivenessMutex) {
  std::unique_ptr<Zone> zone = Open(kMinZoneSize);
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  const uint32_t a = zone->procs().ClaimLocked(111, 5);
  ASSERT_NE(a, kNoSlot);
  MutexReleaser release_a(&zone->procs().slot(a).liveness);
  const uint32_t b = zone->procs().ClaimLocked(222, 6);
  ASSERT_NE(b, kNoSlot);
  MutexReleaser release_b(&zone->procs().slot(b).liveness);
  EXPECT_NE(a, b);
  EXPECT_EQ(zone->procs().slot(a).pid.load(), 111);
  EXPECT_EQ(zone->procs().slot(b).pid.load(), 222);
  EXPECT_EQ(zone->procs().slot(a).state.load(), kProcLive);
  EXPECT_EQ(zone->procs().slot(b).started_ns, 6);
}

// A process that execs keeps its pid; the kernel marks the robust mutexes
// its threads held owner-died (the watcher of the image before). The new
// image's claim reaps that slot first: its connections are not counted
// twice while it registers them again (an exec'd CGI helper).
TEST_F(ZoneTest, AClaimReapsTheSlotItsPidHeldBeforeAnExec) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  Pipe ready;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    {
      ZoneLock lock(*zone);
      const uint32_t slot = zone->procs().ClaimLocked(getpid(), 1);
      TRAFFICRATE_CHILD_CHECK(slot != kNoSlot);
      for (int n = 0; n < 2; ++n) {
        const uint32_t c = RegisterLocked(*zone, 1, slot);
        TRAFFICRATE_CHILD_CHECK(c != kNoSlot && zone->conns().JoinLocked(c));
      }
    }
    WriteByte(ready.write_end());
    execl("/bin/sleep", "sleep", "5", static_cast<char*>(nullptr));
    _exit(99);
  }
  ready.CloseWrite();
  ASSERT_TRUE(ReadByte(ready.read_end()));
  uint32_t slot = kNoSlot;
  for (uint32_t i = 0; i < zone->procs().capacity(); ++i) {
    if (zone->procs().slot(i).pid.load() == pid) slot = i;
  }
  ASSERT_NE(slot, kNoSlot);
  EXPECT_TRUE(PollUntil([&] {
    return (__atomic_load_n(&zone->procs().slot(slot).liveness.__data.__lock,
                            __ATOMIC_ACQUIRE) &
            FUTEX_OWNER_DIED) != 0;
  })) << "the exec marked the liveness mutex owner-died";
  EXPECT_EQ(zone->header().conns_used, 2u);
  {
    // The new image of that pid claims (here on its behalf).
    HeldMutex liveness;
    ZoneLock lock(*zone);
    ASSERT_TRUE(lock.ok());
    uint32_t reaped = 0;
    const uint32_t again =
        zone->procs().ClaimLocked(pid, 2, &liveness, &reaped);
    EXPECT_NE(again, kNoSlot);
    EXPECT_EQ(reaped, 2u);
    EXPECT_EQ(zone->header().conns_used, 0u);
    EXPECT_EQ(zone->header().keys_used, 0u);
    EXPECT_EQ(zone->header().procs_reaped.load(), 1u);
    EXPECT_TRUE(liveness.Release());
  }
  kill(pid, SIGKILL);
  WaitChild(pid);
}

// A zone whose every process slot is held by a dead process still gives a
// live one a slot: the claim reaps a dead one.
TEST_F(ZoneTest, AFullZoneOfDeadProcessesStillGivesASlot) {
  std::unique_ptr<Zone> zone = Open(uint64_t{64} << 10);
  ASSERT_NE(zone, nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ZoneLock lock(*zone);
    for (uint32_t i = 0; i < zone->procs().capacity(); ++i) {
      const uint32_t slot = zone->procs().ClaimLocked(getpid() + i + 1, 1);
      TRAFFICRATE_CHILD_CHECK(slot != kNoSlot);
      TRAFFICRATE_CHILD_CHECK(RegisterLocked(*zone, i, slot) != kNoSlot);
    }
    TRAFFICRATE_CHILD_CHECK(zone->procs().ClaimLocked(getpid(), 1) == kNoSlot);
    _exit(0);  // dies holding every liveness mutex
  }
  ASSERT_TRUE(ExitedWith(WaitChild(pid), 0));
  const uint32_t full = zone->header().table_full.load();
  HeldMutex liveness;
  {
    ZoneLock lock(*zone);
    ASSERT_TRUE(lock.ok());
    EXPECT_EQ(zone->header().conns_used, zone->procs().capacity());
    uint32_t reaped = 0;
    EXPECT_NE(zone->procs().ClaimLocked(getpid(), 2, &liveness, &reaped),
              kNoSlot);
    EXPECT_EQ(reaped, 1u) << "one dead process, as many as it takes";
    EXPECT_EQ(zone->header().conns_used, zone->procs().capacity() - 1);
    EXPECT_EQ(zone->header().table_full.load(), full);
  }
  EXPECT_TRUE(liveness.Release());
}

}  // namespace
}  // namespace trafficrate
