// The Governor on real TCP sockets over loopback and a real zone, without
// LD_PRELOAD (the test plays the interposers; the Governor is driven, see
// governor_fixture.h).
//
// This file: the watcher's budget tick (TickBudget, budget.h), which the
// test calls at the times it asks for: it expires idle connections (the
// idle pass does not, in budget mode), sleeps up to a tenth of a second
// with nothing due, and publishes the watcher's CPU and stretch. Closed
// connections still draining are in governor_drain_test.cc.

#include <cstdint>

#include "gtest/gtest.h"
#include "src/budget/budget.h"
#include "src/runtime/governor.h"
#include "src/shm/zone.h"
#include "tests/runtime/governor_fixture.h"

namespace trafficrate {
namespace {

using testing_util::Conn;
using testing_util::QueueEmpties;

using GovernorBudgetTest = testing_util::GovernorFixture;

TEST_F(GovernorBudgetTest,
       BudgetModeExpiresIdleConnectionsInTheTickNotThePass) {
  constexpr int64_t kIdleNs = 300 * kNsPerMs;
  StartGovernor(kIdleNs);
  zone_->settings().SetShare(ShareMode::kBudget, 0);
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  ASSERT_EQ(Send(c.server, 100), 100);
  const uint32_t key = KeyIndex(c.server);
  EXPECT_EQ(zone_->keys().slot(key).active.load(), 1u);
  ASSERT_TRUE(QueueEmpties(c.server));
  // The idle pass does nothing in budget mode (the tick visits the sending
  // connections and expires them there), even long after the last send.
  gov_->ExpireIdle(Now() + 10 * kNsPerSec);
  EXPECT_EQ(ConnOf(c.server).active.load(), 1u);
  // The watcher's ticks do, once the 100 bytes are acknowledged and the
  // idle time has passed.
  const int64_t last = gov_->LastSendNs(c.server);
  EXPECT_TRUE(TickBudgetUntil(
      [&] { return zone_->keys().slot(key).active.load() == 0; }));
  EXPECT_GE(Now(), last + kIdleNs) << "expired before its idle time";
  gov_->BeforeSend(c.server);
  EXPECT_EQ(zone_->keys().slot(key).active.load(), 1u);
}

TEST_F(GovernorBudgetTest, BudgetTickWithNothingDueSleepsUpToATenthOfASecond) {
  // Nothing here has joined.
  StartGovernor();
  zone_->settings().SetShare(ShareMode::kBudget, 0);
  const int64_t now = Now();
  const int64_t next = gov_->TickBudget(now);
  EXPECT_GT(next, now + Governor::kMaxBudgetSleepNs - 2 * kBudgetTickNs);
  EXPECT_LE(next, now + Governor::kMaxBudgetSleepNs);
}

TEST_F(GovernorBudgetTest, BudgetWatcherPublishesItsCpuAndStretch) {
  StartGovernor();
  zone_->settings().SetShare(ShareMode::kBudget, 0);
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  ASSERT_EQ(Send(c.server, 100), 100);
  const uint32_t proc = gov_->proc_index();
  ASSERT_LT(proc, zone_->procs().capacity());
  // Published from its first tick (stretch 1, no CPU measured yet), then
  // once a second of its clock (the CPU is the calling thread's). With a
  // single connection nothing is spaced out whatever it costs.
  gov_->TickBudget(Now());
  EXPECT_NE(zone_->procs().slot(proc).watcher_stretch.load(), 0u);
  const int64_t until = Now() + 1'200 * kNsPerMs;
  ASSERT_TRUE(TickBudgetUntil([&] { return Now() >= until; }));
  EXPECT_EQ(zone_->procs().slot(proc).watcher_stretch.load(), 100u);
  EXPECT_LT(zone_->procs().slot(proc).watcher_cpu.load(), 10000u);  // < a core
}

}  // namespace
}  // namespace trafficrate
