#include "src/budget/cpu_budget.h"

#include <gtest/gtest.h>

#include "src/base/clock.h"

namespace trafficrate {
namespace {

// A watcher whose CPU per second is `fixed` plus `spaced` / stretch: the
// part of its work that the stretch spaces out, and the part it does not.
struct Model {
  double fixed_ns = 0;
  double spaced_ns = 0;
  int64_t now_ns = kNsPerSec;
  int64_t cpu_ns = 0;
  void Second(CpuBudget& cpu, uint32_t governed) {
    now_ns += kNsPerSec;
    cpu_ns += static_cast<int64_t>(fixed_ns + spaced_ns / cpu.stretch());
    cpu.Update(now_ns, cpu_ns, governed);
  }
  // The first look, then `seconds` of them.
  void Run(CpuBudget& cpu, uint32_t governed, int seconds) {
    cpu.Update(now_ns, cpu_ns, governed);
    for (int i = 0; i < seconds; ++i) Second(cpu, governed);
  }
};

TEST(CpuBudgetTest, WithinTheAllowanceNothingIsSpacedOut) {
  CpuBudget cpu;
  // 10 000 connections may take 8 ms per second.
  Model m{.fixed_ns = 1e6, .spaced_ns = 6e6};
  m.Run(cpu, 10000, 30);
  EXPECT_EQ(cpu.stretch(), 1);
  EXPECT_NEAR(cpu.used_ns_per_sec(), 7e6, 1e3);
}

TEST(CpuBudgetTest, AFewConnectionsMayUseTheFloor) {
  CpuBudget cpu;
  // 100 connections at 15 us each: 1.5 ms/s, under the 2 ms floor.
  Model m{.spaced_ns = 1.5e6};
  m.Run(cpu, 100, 30);
  EXPECT_EQ(cpu.stretch(), 1);
}

TEST(CpuBudgetTest, OverTheAllowanceTheWorkIsSpacedOutUntilWithin) {
  CpuBudget cpu;
  // 4 500 connections (3.6 ms/s allowed) costing 3 us each: 13.5 ms/s.
  Model m{.fixed_ns = 0.5e6, .spaced_ns = 13e6};
  cpu.Update(m.now_ns, m.cpu_ns, 4500);
  double used = 0;
  for (int i = 0; i < 20; ++i) {
    m.Second(cpu, 4500);
    used = static_cast<double>(cpu.used_ns_per_sec());
  }
  EXPECT_GT(cpu.stretch(), 3);
  EXPECT_LE(used, 4500 * kCpuPerConnNsPerSec * 1.0001);
  // and stays: no swinging back and forth once within.
  const double settled = cpu.stretch();
  for (int i = 0; i < 20; ++i) m.Second(cpu, 4500);
  EXPECT_NEAR(cpu.stretch(), settled, settled * 0.01);
}

TEST(CpuBudgetTest, TheStretchIsBoundedAndComesBackWhenTheLoadGoes) {
  CpuBudget cpu;
  Model m{.fixed_ns = 5e6, .spaced_ns = 50e6};
  m.Run(cpu, 5000, 30);
  EXPECT_EQ(cpu.stretch(), kMaxCpuStretch);  // the fixed part alone is over
  // Most connections closed: the cost falls, the stretch goes back to 1.
  m.fixed_ns = 0.2e6;
  m.spaced_ns = 1e6;
  for (int i = 0; i < 30; ++i) m.Second(cpu, 5000);
  EXPECT_EQ(cpu.stretch(), 1);
}

TEST(CpuBudgetTest, AFewHundredConnectionsAreNeverSpacedOutMuch) {
  // 40 connections whose watcher costs 5 ms/s, mostly its ticks' own:
  // spacing them out would not help, so it does not.
  CpuBudget cpu;
  Model m{.fixed_ns = 4e6, .spaced_ns = 1e6};
  m.Run(cpu, 40, 30);
  EXPECT_EQ(cpu.stretch(), 1);
  // 900: at most 3.
  for (int i = 0; i < 30; ++i) m.Second(cpu, 900);
  EXPECT_EQ(cpu.stretch(), 3);
  // Fewer again: the bound comes down with them.
  m.Second(cpu, 360);
  EXPECT_DOUBLE_EQ(cpu.stretch(), 1.2);
}

TEST(CpuBudgetTest, ActsOncePerSecondAndIgnoresAnUnreadableClock) {
  CpuBudget cpu;
  EXPECT_TRUE(cpu.Due(kNsPerSec));
  cpu.Update(kNsPerSec, 0, 5000);
  EXPECT_FALSE(cpu.Due(kNsPerSec + kNsPerSec / 2));
  // Half a second of a whole core: not yet looked at.
  cpu.Update(kNsPerSec + kNsPerSec / 2, kNsPerSec / 2, 5000);
  EXPECT_EQ(cpu.used_ns_per_sec(), 0);
  cpu.Update(3 * kNsPerSec, -1, 5000);
  EXPECT_EQ(cpu.stretch(), 1);
  cpu.Update(3 * kNsPerSec, kNsPerSec, 5000);
  EXPECT_NEAR(cpu.used_ns_per_sec(), kNsPerSec / 2, 1);
  EXPECT_GT(cpu.stretch(), 1);
}

TEST(CpuBudgetTest, ThreadCpuTimeGrowsWithWork) {
  const int64_t before = ThreadCpuNs();
  ASSERT_GE(before, 0);
  volatile uint64_t x = 0;
  for (int i = 0; i < 20'000'000; ++i) x = x + i;
  EXPECT_GT(ThreadCpuNs(), before);
}

}  // namespace
}  // namespace trafficrate
