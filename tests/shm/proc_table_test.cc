// The process table: a slot claimed once per liveness mutex, a dead
// process's slot reaped (its connections and handoffs released) and a live
// one's never, a claim that reaps its own pid's slot from before an exec or
// a dead process's when the table is full, the latest late watcher, and the
// bound of a reaping scan.

#include "src/shm/proc_table.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <memory>

#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "src/shm/robust_mutex.h"
#include "src/shm/zone.h"
#include "src/shm/zone_layout.h"
#include "tests/shm/zone_fixture.h"

namespace trafficrate {
namespace {

using testing_util::ExitedWith;
using testing_util::MakeKey;
using testing_util::MutexReleaser;
using testing_util::Pipe;
using testing_util::PollUntil;
using testing_util::ReadByte;
using testing_util::WaitChild;
using testing_util::WriteByte;

using ProcTableTest = testing_util::ZoneFixture;

TEST_F(ProcTableTest, ProcSlotsAreClaimedOncePerLivenessMutex) {
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

TEST_F(ProcTableTest, LatestWatcherLateNsIsThatOfLiveProcessesWithConnections) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  uint32_t a = kNoSlot, b = kNoSlot;
  {
    ZoneLock lock(*zone);
    ASSERT_TRUE(lock.ok());
    a = zone->procs().ClaimLocked(getpid(), 1);
    b = zone->procs().ClaimLocked(getpid() + 1, 1);
  }
  ASSERT_NE(a, kNoSlot);
  ASSERT_NE(b, kNoSlot);
  // This thread holds both liveness mutexes now: let go before the zone is
  // unmapped (they are on its robust list).
  MutexReleaser release_a(&zone->procs().slot(a).liveness);
  MutexReleaser release_b(&zone->procs().slot(b).liveness);
  const int64_t now = int64_t{5000} * kNsPerMs;
  const int64_t most = 2 * kNsPerSec;
  EXPECT_EQ(zone->procs().slot(a).watcher_due_ms.load(), 0u)
      << "a claim clears it";
  EXPECT_EQ(zone->procs().LatestWatcherLateNs(now, most), 0);
  zone->procs().slot(a).watcher_due_ms.store(4700);
  zone->procs().slot(b).watcher_due_ms.store(4900);
  EXPECT_EQ(zone->procs().LatestWatcherLateNs(now, most), 0)
      << "processes with no connections are not waited for";
  zone->procs().slot(a).conns.store(1);
  zone->procs().slot(b).conns.store(2);
  EXPECT_EQ(zone->procs().LatestWatcherLateNs(now, most), 300 * kNsPerMs);
  zone->procs().slot(a).watcher_due_ms.store(5100);
  EXPECT_EQ(zone->procs().LatestWatcherLateNs(now, most), 100 * kNsPerMs)
      << "one due later is early, not late";
  zone->procs().slot(b).watcher_due_ms.store(2000);
  EXPECT_EQ(zone->procs().LatestWatcherLateNs(now, most), 0)
      << "3 s late: stopped, not late";
  // Milliseconds wrap; their difference does not.
  const int64_t wrapped = (int64_t{1} << 32) * kNsPerMs + 10 * kNsPerMs;
  zone->procs().slot(b).watcher_due_ms.store(0xFFFFFFF0u);
  EXPECT_EQ(zone->procs().LatestWatcherLateNs(wrapped, most), 26 * kNsPerMs);
}

TEST_F(ProcTableTest, DeadProcessIsReapedAndALiveOneIsNot) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  // This process: a live slot owning two connections of key 1, one sending.
  const OwnProc own(*zone);
  const uint32_t me = own.slot();
  ASSERT_NE(me, kNoSlot);
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
    EXPECT_FALSE(MutexOwnerDied(zone->procs().slot(dead).liveness));
    const uint32_t again = zone->procs().ClaimLocked(getpid(), 2);
    ASSERT_NE(again, kNoSlot);
    MutexReleaser release_again(&zone->procs().slot(again).liveness);
    EXPECT_EQ(again, dead) << "the lowest free slot";
  }
  WriteByte(finish.write_end());
  EXPECT_TRUE(ExitedWith(WaitChild(children[1]), 0));
}

// A process that execs keeps its pid; the kernel marks the robust mutexes
// its threads held owner-died (the watcher of the image before). The new
// image's claim reaps that slot first: its connections are not counted
// twice while it registers them again (an exec'd CGI helper).
TEST_F(ProcTableTest, AClaimReapsTheSlotItsPidHeldBeforeAnExec) {
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
    return MutexOwnerDied(zone->procs().slot(slot).liveness);
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
TEST_F(ProcTableTest, AFullZoneOfDeadProcessesStillGivesASlot) {
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

// Zone::ReapDead's scan: the slots below the high water, and every
// kFullReapEvery passes all of them (a zone made by an older version, which
// keeps no high water, every time).
TEST_F(ProcTableTest, AReapingScanCoversTheHighWaterAndNowAndThenAll) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ProcTable& procs = zone->procs();
  EXPECT_EQ(procs.NextReapScanLimit(), procs.capacity()) << "no high water";
  zone->header().procs_high_water.store(3);
  uint32_t full = 0;
  for (uint32_t pass = 0; pass < 2 * ProcTable::kFullReapEvery; ++pass) {
    const uint32_t limit = procs.NextReapScanLimit();
    if (limit == procs.capacity()) {
      ++full;
    } else {
      EXPECT_EQ(limit, 3u);
    }
  }
  EXPECT_EQ(full, 2u);
}

}  // namespace
}  // namespace trafficrate
