// Robust mutexes in shared memory: one made by InitRobustMutex survives the
// death of a holder in another process (EOWNERDEAD, seen in its word first),
// TimedLock gives up after its wait naming no error of its own, and
// HeldMutex unlocks only a mutex whose kind, owner and links are as they
// were when it was taken.

#include "src/shm/robust_mutex.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>

#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "tests/test_util.h"

namespace trafficrate {
namespace {

using testing_util::ExitedWith;
using testing_util::kWaitNs;
using testing_util::Pipe;
using testing_util::ReadByte;
using testing_util::WaitChild;
using testing_util::WriteByte;

// A robust, process-shared mutex on a page of its own, shared with children.
class RobustMutexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    void* page = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(page, MAP_FAILED);
    page_ = page;
    mutex_ = static_cast<pthread_mutex_t*>(page);
    ASSERT_TRUE(InitRobustMutex(mutex_).ok());
  }
  void TearDown() override {
    if (page_ != nullptr) munmap(page_, kPageBytes);
  }

  // A child that locks the mutex, says so, and then waits for a byte (or
  // dies at once holding it if `die`).
  pid_t ForkHolder(Pipe& locked, Pipe& release, bool die) {
    const pid_t pid = fork();
    if (pid == 0) {
      TRAFFICRATE_CHILD_CHECK(pthread_mutex_lock(mutex_) == 0);
      TRAFFICRATE_CHILD_CHECK(WriteByte(locked.write_end()));
      if (!die) ReadByte(release.read_end());
      _exit(0);  // holding it
    }
    locked.CloseWrite();
    return pid;
  }

  static constexpr size_t kPageBytes = 4096;
  void* page_ = nullptr;
  pthread_mutex_t* mutex_ = nullptr;
};

TEST_F(RobustMutexTest, AHolderThatDiesLeavesItOwnerDiedForTheNext) {
  Pipe locked;
  Pipe release;
  const pid_t pid = ForkHolder(locked, release, /*die=*/true);
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(ReadByte(locked.read_end()));
  ASSERT_TRUE(ExitedWith(WaitChild(pid), 0));
  EXPECT_TRUE(MutexOwnerDied(*mutex_));
  ASSERT_EQ(TimedLock(mutex_, kWaitNs), EOWNERDEAD);
  EXPECT_EQ(pthread_mutex_consistent(mutex_), 0);
  EXPECT_EQ(MutexHolder(*mutex_), static_cast<int32_t>(gettid()));
  EXPECT_EQ(pthread_mutex_unlock(mutex_), 0);
  EXPECT_FALSE(MutexOwnerDied(*mutex_));
  EXPECT_EQ(MutexHolder(*mutex_), 0);
}

TEST_F(RobustMutexTest, TimedLockGivesUpAfterItsWait) {
  Pipe locked;
  Pipe release;
  const pid_t pid = ForkHolder(locked, release, /*die=*/false);
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(ReadByte(locked.read_end()));
  EXPECT_EQ(MutexHolder(*mutex_), pid);  // its only thread
  EXPECT_FALSE(MutexOwnerDied(*mutex_));
  constexpr int64_t kWaitForNs = 20 * kNsPerMs;
  const int64_t start = MonotonicNowNs();
  EXPECT_EQ(TimedLock(mutex_, kWaitForNs), ETIMEDOUT);
  EXPECT_GE(MonotonicNowNs() - start, kWaitForNs - kNsPerMs);
  EXPECT_LT(MonotonicNowNs() - start, kWaitNs);
  WriteByte(release.write_end());
  EXPECT_TRUE(ExitedWith(WaitChild(pid), 0));
  // It died holding it: the next taker is told.
  EXPECT_EQ(TimedLock(mutex_, kWaitNs), EOWNERDEAD);
  EXPECT_EQ(pthread_mutex_consistent(mutex_), 0);
  EXPECT_EQ(pthread_mutex_unlock(mutex_), 0);
}

TEST_F(RobustMutexTest, HeldMutexUnlocksOnlyWhatIsAsItWasTaken) {
  HeldMutex none;
  EXPECT_TRUE(none.Release()) << "nothing held: nothing to do";
  // Intact: unlocked.
  ASSERT_EQ(TimedLock(mutex_, kWaitNs), 0);
  HeldMutex held;
  held.Hold(mutex_, page_, kPageBytes);
  EXPECT_EQ(held.tid, static_cast<int>(gettid()));
  EXPECT_TRUE(held.Release());
  EXPECT_EQ(MutexHolder(*mutex_), 0);
  EXPECT_TRUE(held.Release()) << "released once";
  // Another kind (a plain mutex glibc would not unlink): left locked.
  ASSERT_EQ(TimedLock(mutex_, kWaitNs), 0);
  held.Hold(mutex_, page_, kPageBytes);
  const int kind = mutex_->__data.__kind;
  mutex_->__data.__kind = 0;
  EXPECT_FALSE(held.Release());
  EXPECT_EQ(MutexHolder(*mutex_), static_cast<int32_t>(gettid()));
  mutex_->__data.__kind = kind;
  EXPECT_EQ(pthread_mutex_unlock(mutex_), 0);
  // A link out of the mapping (glibc would write through it): left locked.
  ASSERT_EQ(TimedLock(mutex_, kWaitNs), 0);
  held.Hold(mutex_, page_, kPageBytes);
  const __pthread_list_t links = mutex_->__data.__list;
  mutex_->__data.__list.__next = reinterpret_cast<__pthread_list_t*>(0x1000);
  EXPECT_FALSE(held.Release());
  EXPECT_EQ(MutexHolder(*mutex_), static_cast<int32_t>(gettid()));
  mutex_->__data.__list = links;  // put right before anyone follows it
  EXPECT_EQ(pthread_mutex_unlock(mutex_), 0);
}

// The robust list is there (glibc registered it): nothing changes, and the
// mutexes this thread takes still pass HeldMutex's check.
TEST_F(RobustMutexTest, ReregisteringAnExistingRobustListChangesNothing) {
  ReregisterRobustList();
  ASSERT_EQ(TimedLock(mutex_, kWaitNs), 0);
  HeldMutex held;
  held.Hold(mutex_, page_, kPageBytes);
  EXPECT_TRUE(held.Release());
}

// A child made with the clone system call itself (not glibc's fork) by a
// thread that holds a robust mutex: the kernel knows no list for it, and
// glibc's list, which its copy of the thread still has, runs through the
// held mutex before it reaches the thread's list head. ReregisterRobustList
// follows it there (to the parent's head, at the same address), and the
// mutexes the child takes pass HeldMutex's check.
TEST_F(RobustMutexTest, RawCloneChildOfAHolderFindsItsRobustListHead) {
  pthread_mutex_t* other = mutex_ + 1;
  ASSERT_TRUE(InitRobustMutex(other).ok());
  void* parent_head = nullptr;
  size_t len = 0;
  ASSERT_EQ(syscall(SYS_get_robust_list, 0, &parent_head, &len), 0);
  ASSERT_EQ(pthread_mutex_lock(mutex_), 0);
  const pid_t pid = static_cast<pid_t>(
      syscall(SYS_clone, SIGCHLD, nullptr, nullptr, nullptr, 0));
  if (pid == 0) {
    void* head = nullptr;
    TRAFFICRATE_CHILD_CHECK(syscall(SYS_get_robust_list, 0, &head, &len) == 0 &&
                            head == nullptr);
    ReregisterRobustList();
    TRAFFICRATE_CHILD_CHECK(syscall(SYS_get_robust_list, 0, &head, &len) == 0 &&
                            head == parent_head);
    TRAFFICRATE_CHILD_CHECK(TimedLock(other, kWaitNs) == 0);
    HeldMutex held;
    held.Hold(other, page_, kPageBytes);
    TRAFFICRATE_CHILD_CHECK(held.Release());
    _exit(0);
  }
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(ExitedWith(WaitChild(pid), 0));
  EXPECT_EQ(pthread_mutex_unlock(mutex_), 0);
}

}  // namespace
}  // namespace trafficrate
