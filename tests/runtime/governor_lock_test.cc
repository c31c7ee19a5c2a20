// The Governor while another process holds the zone lock (issue 8): its
// connections pass through meanwhile and catch up after; a lock or header
// damaged in the zone makes the process pass everything through. The lock's
// own bounds are tested in tests/shm/zone_test.cc.
//
// The holder is a forked child (another process, as in a real server) that
// takes the lock and is then stopped, released or killed (LockHolder). The
// lock's waits are real (its bounds are what is tested); the Governor is
// driven (governor_fixture.h): what its watcher does once the lock is free,
// or held for good, or the header broken, the test does by calling the
// watcher's once-a-loop duty, CheckZone, at the times it means.

#include <unistd.h>

#include <cstdint>
#include <memory>

#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "src/runtime/governor.h"
#include "src/shm/zone.h"
#include "src/shm/zone_layout.h"
#include "tests/runtime/governor_fixture.h"

namespace trafficrate {
namespace {

using testing_util::Conn;
using testing_util::ElapsedNs;
using testing_util::kLockSlackNs;
using testing_util::kNotPaced;
using testing_util::kRate;
using testing_util::LockHolder;
using testing_util::Pacing;

using GovernorLockTest = testing_util::GovernorFixture;

TEST_F(GovernorLockTest, ConnectionsPassThroughWhileTheLockIsHeldAndCatchUp) {
  StartGovernor();
  Conn first = Open("127.0.0.2");
  ASSERT_GT(Send(first.server), 0);  // starts the watcher, joins
  ASSERT_EQ(Pacing(first.server), kRate);
  ASSERT_EQ(ConnsUsed(), 1u);
  LockHolder holder(*zone_);
  ASSERT_TRUE(holder.holding());
  ASSERT_TRUE(holder.Stop());

  // An accept waits once, then passes through; its sends are paced at its
  // rule's rate until it is registered.
  int64_t start = MonotonicNowNs();
  Conn second = Open("127.0.0.3");
  EXPECT_LT(ElapsedNs(start), kHostLockWaitNs + kLockSlackNs);
  EXPECT_EQ(table_->Get(second.server)->state.load(),
            FdState::Pending().word());
  start = MonotonicNowNs();
  Conn third = Open("127.0.0.3");
  for (int i = 0; i < 50; ++i) ASSERT_GT(Send(second.server), 0);
  EXPECT_LT(ElapsedNs(start), kLockSlackNs);
  EXPECT_EQ(Pacing(second.server), kRate);
  // A duplicate of a pending fd is not counted on its own.
  const int dup_fd = dup(third.server);
  ASSERT_GE(dup_fd, 0);
  gov_->OnDup(third.server, dup_fd);
  EXPECT_EQ(table_->Get(dup_fd)->state.load(), 0u);
  gov_->OnClose(dup_fd);
  close(dup_fd);
  // A close of a registered connection is finished by the watcher later.
  start = MonotonicNowNs();
  Close(first);
  EXPECT_LT(ElapsedNs(start), kLockSlackNs);
  EXPECT_GE(zone_->header().lock_timeouts.load(), 2u);

  ASSERT_TRUE(holder.Release());
  EXPECT_TRUE(zone_->lock_stalled()) << "nothing looked at the lock yet";
  // The watcher's next look finds the lock free, finishes the deferred
  // close (first's connection is gone), and registers the pending
  // connections without waiting for their next send (a full socket may put
  // it off for seconds), and joins them: they were sending. Its pass over
  // the changed shares then paces both at their share.
  EXPECT_TRUE(gov_->CheckZone(Now()));
  EXPECT_FALSE(zone_->lock_stalled());
  EXPECT_NE(ConnIndex(second.server), kNoSlot);
  EXPECT_NE(ConnIndex(third.server), kNoSlot);
  EXPECT_EQ(Active(second.server), 2u);
  gov_->ApplyChangedShares();
  EXPECT_EQ(Pacing(second.server), kRate / 2);
  EXPECT_EQ(Pacing(third.server), kRate / 2);
  EXPECT_EQ(ConnsUsed(), 2u) << "the watcher did not finish the deferred close";
  ASSERT_GT(Send(second.server), 0);
  EXPECT_EQ(Active(second.server), 2u);
}

TEST_F(GovernorLockTest,
       ALockHeldByAThreadThatDoesNotExistMarksTheZoneCorrupt) {
  StartGovernor();
  Conn conn = Open("127.0.0.2");
  ASSERT_GT(Send(conn.server), 0);
  ASSERT_EQ(Pacing(conn.server), kRate);
  // A forged lock word: a thread id above any pid_max.
  constexpr int kNoSuchThread = 0x3ffffff0;
  __atomic_store_n(&zone_->header().lock.__data.__lock, kNoSuchThread,
                   __ATOMIC_RELAXED);
  Conn later = Open("127.0.0.3");  // times out: stalled from here
  // The watcher looks at the stalled lock once a second: after the third
  // look that finds it held by a thread that does not exist, the zone is
  // corrupt, and its process passes everything through.
  EXPECT_TRUE(gov_->CheckZone(Now()));
  Advance(kNsPerSec);
  EXPECT_TRUE(gov_->CheckZone(Now()));
  EXPECT_FALSE(zone_->segment().corrupt()) << "marked before the third look";
  Advance(kNsPerSec);
  EXPECT_FALSE(gov_->CheckZone(Now()));
  EXPECT_TRUE(zone_->segment().corrupt());
  EXPECT_EQ(zone_->header().corrupt.load(), 1u);
  // Everything passes through: the paced socket is unpaced again, and new
  // connections are not registered.
  EXPECT_EQ(Pacing(conn.server), kNotPaced);
  EXPECT_EQ(table_->Get(conn.server)->state.load(), 0u);
  Conn after = Open("127.0.0.4");
  ASSERT_GT(Send(after.server), 0);
  EXPECT_EQ(table_->Get(after.server)->state.load(), 0u);
  ASSERT_GT(Send(later.server), 0);
  EXPECT_EQ(Pacing(later.server), kNotPaced);
  // Teardown must not wait on the forged lock.
  __atomic_store_n(&zone_->header().lock.__data.__lock, 0, __ATOMIC_RELAXED);
}

TEST_F(GovernorLockTest, AHeaderChangedUnderARunningProcessMakesItPassThrough) {
  StartGovernor();
  Conn conn = Open("127.0.0.2");
  ASSERT_GT(Send(conn.server), 0);
  ASSERT_EQ(Pacing(conn.server), kRate);
  ASSERT_TRUE(gov_->CheckZone(Now()));  // the watcher's look: sound
  // Immutable: the checksum breaks. (Atomic, as the checksum's reads are.)
  __atomic_fetch_xor(&zone_->header().hash_seed[0], 0x10, __ATOMIC_RELAXED);
  // The watcher checks the header once a second: not at its looks within
  // the second, at the first after it.
  EXPECT_TRUE(gov_->CheckZone(Now() + kNsPerSec - 1));
  Advance(kNsPerSec);
  EXPECT_FALSE(gov_->CheckZone(Now()));
  EXPECT_TRUE(zone_->segment().corrupt());
  EXPECT_EQ(Pacing(conn.server), kNotPaced);
  Conn after = Open("127.0.0.3");
  ASSERT_GT(Send(after.server), 0);
  EXPECT_EQ(table_->Get(after.server)->state.load(), 0u);
  EXPECT_EQ(Pacing(after.server), kNotPaced);
  // A server started now gets a fresh zone.
  ZoneOpenNotes notes;
  absl::StatusOr<std::unique_ptr<Zone>> fresh = Zone::OpenOrCreate(
      zone_name_, uint64_t{1} << 20, kRate, KeySpec(), &notes);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE(notes.replaced_corrupt);
  EXPECT_TRUE((*fresh)->segment().CheckHeader());
}

}  // namespace
}  // namespace trafficrate
