// The change word: a bump without waiters makes no wake, a waiter returns
// at once when the word already moved, after its timeout when nothing moves,
// and at once when another process wakes it.

#include "src/shm/change_word.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <memory>

#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "src/shm/zone.h"
#include "src/shm/zone_layout.h"
#include "tests/shm/zone_fixture.h"

namespace trafficrate {
namespace {

using testing_util::ExitedWith;
using testing_util::kWaitNs;
using testing_util::PollUntil;
using testing_util::WaitChild;

using ChangeWordTest = testing_util::ZoneFixture;

TEST_F(ChangeWordTest, EveryWakeMovesTheWordByOne) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ChangeWord& changes = zone->changes();
  const uint32_t seen = changes.Current();
  EXPECT_EQ(seen, zone->header().change_word.load());
  changes.WakeWatchers();
  changes.WakeWatchers();
  EXPECT_EQ(changes.Current(), seen + 2);
  EXPECT_EQ(zone->header().watchers_waiting.load(), 0u);
}

TEST_F(ChangeWordTest, AWaitEndsAfterItsTimeoutWhenNothingMoves) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ChangeWord& changes = zone->changes();
  constexpr int64_t kTimeoutNs = 30 * kNsPerMs;
  int64_t start = MonotonicNowNs();
  changes.WaitForChange(changes.Current(), kTimeoutNs);
  EXPECT_GE(MonotonicNowNs() - start, kTimeoutNs - kNsPerMs);
  EXPECT_LT(MonotonicNowNs() - start, kWaitNs);
  EXPECT_EQ(zone->header().watchers_waiting.load(), 0u);
  // No time to wait: no wait, and no waiter counted.
  start = MonotonicNowNs();
  changes.WaitForChange(changes.Current(), 0);
  changes.WaitForChange(changes.Current(), -kNsPerSec);
  EXPECT_LT(MonotonicNowNs() - start, kTimeoutNs);
  EXPECT_EQ(zone->header().watchers_waiting.load(), 0u);
}

TEST_F(ChangeWordTest, WaitForChangeReturnsAtOnceWhenTheWordAlreadyMoved) {
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

TEST_F(ChangeWordTest, WakeWatchersWakesAWaiterInAnotherProcess) {
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

}  // namespace
}  // namespace trafficrate
