// The zone lock's bounds (issue 8): a holder that stops (SIGSTOP) costs the
// host's calls one short wait, then nothing, until the lock is free again;
// the Governor passes connections through meanwhile and catches up after;
// a lock or header damaged in the zone makes the process stop using it.
//
// The holder is a forked child (another process, as in a real server) that
// takes the lock and is then stopped, released or killed.

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
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
using testing_util::ExitedWith;
using testing_util::kRate;
using testing_util::kUnderTsan;
using testing_util::Pacing;
using testing_util::Pipe;
using testing_util::PollUntil;
using testing_util::ReadByte;
using testing_util::WaitChild;
using testing_util::WriteByte;

using testing_util::kNotPaced;
// Sanitizers slow everything down; these are upper bounds, not targets.
constexpr int64_t kSlack = (kUnderTsan ? 200 : 50) * kNsPerMs;

// A child process that holds the zone lock until told to let go.
class LockHolder {
 public:
  explicit LockHolder(Zone& zone) {
    pid_ = fork();
    if (pid_ == 0) {
      ready_.CloseRead();
      release_.CloseWrite();
      {
        ZoneLock lock(zone, kWatcherLockWaitNs);
        TRAFFICRATE_CHILD_CHECK(lock.ok());
        TRAFFICRATE_CHILD_CHECK(WriteByte(ready_.write_end()));
        ReadByte(release_.read_end());
      }
      _exit(0);
    }
    ready_.CloseWrite();
    release_.CloseRead();
    holding_ = pid_ > 0 && ReadByte(ready_.read_end());
  }
  ~LockHolder() {
    if (pid_ > 0) Kill();
  }

  bool holding() const { return holding_; }
  pid_t pid() const { return pid_; }

  // SIGSTOP, and waits until it is stopped.
  bool Stop() {
    if (kill(pid_, SIGSTOP) != 0) return false;
    int status = 0;
    return waitpid(pid_, &status, WUNTRACED) == pid_ && WIFSTOPPED(status);
  }
  // Resumes it and lets it unlock and exit.
  bool Release() {
    kill(pid_, SIGCONT);
    WriteByte(release_.write_end());
    const int status = WaitChild(pid_);
    pid_ = -1;
    return ExitedWith(status, 0);
  }
  // Dies holding the lock (stopped or not).
  void Kill() {
    kill(pid_, SIGKILL);
    WaitChild(pid_);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  bool holding_ = false;
  Pipe ready_;
  Pipe release_;
};

int64_t ElapsedNs(int64_t since) { return MonotonicNowNs() - since; }

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
  EXPECT_LT(waited, kHostLockWaitNs + kSlack);
  EXPECT_TRUE(zone->lock_stalled());
  EXPECT_EQ(zone->header().lock_timeouts.load(), 1u);

  // Stalled: later locks only try it, the watcher's included.
  start = MonotonicNowNs();
  for (int i = 0; i < 100; ++i) {
    ZoneLock lock(*zone, kWatcherLockWaitNs);
    EXPECT_FALSE(lock.ok());
  }
  EXPECT_LT(ElapsedNs(start), kSlack);
  EXPECT_EQ(zone->header().lock_timeouts.load(), 101u);
  EXPECT_EQ(zone->lock_timeouts(), 101u);

  // The watcher's look waits kLockRecheckWaitNs, and it is still held.
  start = MonotonicNowNs();
  EXPECT_FALSE(zone->RecheckLock());
  waited = ElapsedNs(start);
  EXPECT_GE(waited, kLockRecheckWaitNs - kNsPerMs);
  EXPECT_LT(waited, kLockRecheckWaitNs + kSlack);

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

// --- The Governor while another process holds the lock.

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
  EXPECT_LT(ElapsedNs(start), kHostLockWaitNs + kSlack);
  EXPECT_EQ(table_->Get(second.server)->state.load(), kRegisterPending);
  start = MonotonicNowNs();
  Conn third = Open("127.0.0.3");
  for (int i = 0; i < 50; ++i) ASSERT_GT(Send(second.server), 0);
  EXPECT_LT(ElapsedNs(start), kSlack);
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
  EXPECT_LT(ElapsedNs(start), kSlack);
  EXPECT_GE(zone_->header().lock_timeouts.load(), 2u);

  ASSERT_TRUE(holder.Release());
  EXPECT_TRUE(PollUntil([&] { return !zone_->lock_stalled(); }));
  // The watcher finishes the deferred close (first's connection is gone),
  // and registers the pending connections without waiting for
  // their next send (a full socket may put it off for seconds), and joins
  // them: they were sending.
  EXPECT_TRUE(PollUntil([&] {
    return ConnIndex(second.server) != kNoSlot &&
           ConnIndex(third.server) != kNoSlot;
  }));
  EXPECT_EQ(Active(second.server), 2u);
  EXPECT_TRUE(PollUntil([&] {
    return Pacing(second.server) == kRate / 2 &&
           Pacing(third.server) == kRate / 2;
  }));
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
  EXPECT_TRUE(
      PollUntil([&] { return zone_->segment().corrupt(); }, 8 * kNsPerSec));
  EXPECT_EQ(zone_->header().corrupt.load(), 1u);
  // Everything passes through: the paced socket is unpaced again, and new
  // connections are not registered.
  EXPECT_TRUE(PollUntil([&] { return Pacing(conn.server) == kNotPaced; }));
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
  // Immutable: the checksum breaks. (Atomic, as the checksum's reads are.)
  __atomic_fetch_xor(&zone_->header().hash_seed[0], 0x10, __ATOMIC_RELAXED);
  EXPECT_TRUE(
      PollUntil([&] { return zone_->segment().corrupt(); }, 4 * kNsPerSec));
  EXPECT_TRUE(PollUntil([&] { return Pacing(conn.server) == kNotPaced; }));
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
