// When the watcher's budget tick looks at what: visit and decision gaps,
// visit rounds and count lags, at the watcher's CPU stretch 1 and
// stretched (a CpuBudget driven over its allowance, as cpu_budget_test.cc
// drives it): exact values, their bounds, and that each moves the way the
// header says with the packet, the pace, the level and the stretch.

#include "src/budget/visit_timing.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "src/budget/budget.h"
#include "src/budget/cpu_budget.h"
#include "src/budget/meter.h"

namespace trafficrate {
namespace {

constexpr int64_t kMs = kNsPerMs;

// A CpuBudget whose watcher has used a whole core for half a minute while
// governing `governed` connections: its stretch then is the most allowed
// for that many, governed / kCpuStretchConns (within 1 and kMaxCpuStretch).
CpuBudget Stretched(uint32_t governed) {
  CpuBudget cpu;
  int64_t now = kNsPerSec;
  int64_t used = 0;
  cpu.Update(now, used, governed);
  for (int i = 0; i < 30; ++i) {
    now += kNsPerSec;
    used += kNsPerSec;
    cpu.Update(now, used, governed);
  }
  return cpu;
}

TEST(VisitTimingTest, TheStretchedBudgetsAreAtTheirLimits) {
  // What the tests below take for granted.
  EXPECT_EQ(CpuBudget().stretch(), 1);
  EXPECT_EQ(Stretched(450).stretch(), 1.5);
  EXPECT_EQ(Stretched(600).stretch(), 2);
  EXPECT_EQ(Stretched(1200).stretch(), 4);
  EXPECT_EQ(Stretched(100'000).stretch(), kMaxCpuStretch);
}

TEST(VisitTimingTest, DecideGapIsCappedThenStretchedThenCappedAgain) {
  const CpuBudget one;
  EXPECT_EQ(StretchedDecideGapNs(0, one), 0);
  EXPECT_EQ(StretchedDecideGapNs(100 * kMs, one), 100 * kMs);
  EXPECT_EQ(StretchedDecideGapNs(kMaxDecideGapNs, one), kMaxDecideGapNs);
  EXPECT_EQ(StretchedDecideGapNs(10 * kNsPerSec, one), kMaxDecideGapNs);
  const CpuBudget two = Stretched(600);
  EXPECT_EQ(StretchedDecideGapNs(100 * kMs, two), 200 * kMs);
  // Capped before it is stretched: 2 s is 500 ms, then 1 s.
  EXPECT_EQ(StretchedDecideGapNs(2 * kNsPerSec, two), 1000 * kMs);
  const CpuBudget eight = Stretched(100'000);
  EXPECT_EQ(StretchedDecideGapNs(100 * kMs, eight), 800 * kMs);
  EXPECT_EQ(StretchedDecideGapNs(kMaxDecideGapNs, eight),
            kMaxStretchedDecideGapNs);
}

TEST(VisitTimingTest, DecideGapGrowsWithTheGapAndTheStretchWithinBounds) {
  for (const uint32_t governed : {0u, 450u, 600u, 1200u, 100'000u}) {
    const CpuBudget cpu = Stretched(governed);
    int64_t last = -1;
    for (int64_t gap = 0; gap <= 4 * kNsPerSec; gap += 10 * kMs) {
      const int64_t stretched = StretchedDecideGapNs(gap, cpu);
      EXPECT_GE(stretched, last) << governed << " " << gap;
      EXPECT_GE(stretched, gap < kMaxDecideGapNs ? gap : kMaxDecideGapNs)
          << "a stretch never shortens it";
      EXPECT_LE(stretched, kMaxStretchedDecideGapNs);
      EXPECT_LE(StretchedDecideGapNs(gap, CpuBudget()), stretched)
          << governed << " " << gap;
      last = stretched;
    }
  }
}

TEST(VisitTimingTest, VisitGapIsAQuarterOfThePacketGap) {
  // (The packet gap is computed in floating point: within a nanosecond or
  // two, times the stretch.)
  const CpuBudget one;
  // 64 KiB packets at 1 MB/s: 65.536 ms apart, visited every 16.384 ms.
  EXPECT_NEAR(VisitGapNs(65536, 1'000'000, one), 16'384'000, 2);
  // Not measured yet: two segments (2 x 1448 B) at 289.6 KB/s, 10 ms apart.
  EXPECT_NEAR(VisitGapNs(0, 289'600, one), 2'500'000, 2);
  // Smaller packets count as two segments.
  EXPECT_EQ(VisitGapNs(100, 289'600, one), VisitGapNs(0, 289'600, one));
  EXPECT_EQ(VisitGapNs(kTwoSegmentsBytes, 289'600, one),
            VisitGapNs(0, 289'600, one));
  EXPECT_GT(VisitGapNs(kTwoSegmentsBytes + 1448, 289'600, one),
            VisitGapNs(0, 289'600, one));
  // Slow: at most kMaxDecideGapNs.
  EXPECT_EQ(VisitGapNs(65536, 1000, one), kMaxDecideGapNs);
  // Not paced: at once.
  EXPECT_EQ(VisitGapNs(65536, 0, one), 0);
  EXPECT_EQ(VisitGapNs(0, 0, Stretched(100'000)), 0);
  // Stretched: times the stretch, up to kMaxStretchedDecideGapNs.
  EXPECT_NEAR(VisitGapNs(65536, 1'000'000, Stretched(600)), 32'768'000, 4);
  EXPECT_NEAR(VisitGapNs(65536, 1'000'000, Stretched(1200)), 65'536'000, 8);
  EXPECT_EQ(VisitGapNs(65536, 1000, Stretched(600)), 2 * kMaxDecideGapNs);
  EXPECT_EQ(VisitGapNs(65536, 1000, Stretched(100'000)),
            kMaxStretchedDecideGapNs);
}

TEST(VisitTimingTest, VisitGapShrinksWithThePaceAndGrowsWithThePacket) {
  const uint64_t paces[] = {1,          100,         2896,
                            10'000,     100'000,     1'000'000,
                            12'500'000, 125'000'000, 1ull << 40};
  const uint32_t packets[] = {0, 1448, 2896, 16384, 65536, 1u << 20};
  for (const uint32_t governed : {0u, 600u, 100'000u}) {
    const CpuBudget cpu = Stretched(governed);
    for (const uint32_t packet : packets) {
      int64_t last = kMaxStretchedDecideGapNs + 1;
      for (const uint64_t pace : paces) {
        const int64_t gap = VisitGapNs(packet, pace, cpu);
        EXPECT_LE(gap, last) << "faster, visited no less often: " << pace;
        EXPECT_GE(gap, 0);
        EXPECT_LE(gap, kMaxStretchedDecideGapNs);
        if (cpu.stretch() == 1) {
          EXPECT_LE(gap, kMaxDecideGapNs);
        }
        last = gap;
      }
    }
    for (const uint64_t pace : paces) {
      int64_t last = 0;
      for (const uint32_t packet : packets) {
        const int64_t gap = VisitGapNs(packet, pace, cpu);
        EXPECT_GE(gap, last) << "bigger packets, further apart: " << packet;
        EXPECT_GE(gap, VisitGapNs(packet, pace, CpuBudget()))
            << "the stretch never brings a visit forward";
        last = gap;
      }
    }
  }
}

TEST(VisitTimingTest, VisitRoundsLengthenInStepsWithTheStretch) {
  EXPECT_EQ(VisitRoundTicks(CpuBudget()), kVisitRoundTicks);
  EXPECT_EQ(VisitRoundTicks(Stretched(450)), kVisitRoundTicks);
  EXPECT_EQ(VisitRoundTicks(Stretched(600)), 2 * kVisitRoundTicks);
  EXPECT_EQ(VisitRoundTicks(Stretched(900)), 2 * kVisitRoundTicks);
  EXPECT_EQ(VisitRoundTicks(Stretched(1200)), kMaxVisitRoundTicks);
  EXPECT_EQ(VisitRoundTicks(Stretched(100'000)), kMaxVisitRoundTicks);
  uint32_t last = 0;
  for (const uint32_t governed :
       {0u, 300u, 450u, 600u, 750u, 900u, 1200u, 1500u, 2400u, 100'000u}) {
    const uint32_t round = VisitRoundTicks(Stretched(governed));
    EXPECT_GE(round, last) << governed;
    EXPECT_GE(round, kVisitRoundTicks);
    EXPECT_LE(round, kMaxVisitRoundTicks);
    last = round;
  }
}

TEST(VisitTimingTest, CountLagIsTheMeasuringGapOrTheStretchedLagIfMore) {
  const CpuBudget one;
  EXPECT_EQ(CountLagNs(0, one), kBudgetCountLagNs);
  EXPECT_EQ(CountLagNs(512'000, one), kBudgetCountLagNs);
  // Two segments at 4 KB/s: 724 ms.
  EXPECT_EQ(CountLagNs(4000, one), BudgetCountLagNs(4000));
  EXPECT_NEAR(static_cast<double>(CountLagNs(4000, one)), 724e6, 1e3);
  EXPECT_EQ(CountLagNs(1, one), kBudgetMaxMeasureGapNs);
  // Stretched: the lag times the stretch, not the gap times the stretch.
  const CpuBudget four = Stretched(1200);
  EXPECT_EQ(CountLagNs(512'000, four), 4 * kBudgetCountLagNs);
  EXPECT_EQ(CountLagNs(0, four), 4 * kBudgetCountLagNs);
  EXPECT_EQ(CountLagNs(4000, four), 4 * kBudgetCountLagNs);
  EXPECT_EQ(CountLagNs(1, four), kBudgetMaxMeasureGapNs);
  const CpuBudget eight = Stretched(100'000);
  EXPECT_EQ(CountLagNs(1, eight), 8 * kBudgetCountLagNs);
}

TEST(VisitTimingTest, CountLagFallsWithTheLevelAndRisesWithTheStretch) {
  const std::vector<uint64_t> levels = {
      1, 100, 1000, 4000, 10'000, 100'000, 1'000'000, 100'000'000, 1ull << 40};
  // The most it can be: the longest measuring gap, or the lag at the
  // largest stretch.
  const int64_t most = std::max<int64_t>(
      kBudgetMaxMeasureGapNs,
      static_cast<int64_t>(kMaxCpuStretch * kBudgetCountLagNs));
  std::vector<int64_t> at_lower_stretch(levels.size(), 0);
  for (const uint32_t governed : {0u, 450u, 600u, 1200u, 100'000u}) {
    const CpuBudget cpu = Stretched(governed);
    int64_t last = INT64_MAX;
    for (size_t i = 0; i < levels.size(); ++i) {
      const int64_t lag = CountLagNs(levels[i], cpu);
      EXPECT_LE(lag, last) << "faster, measured no less often: " << levels[i];
      EXPECT_GE(lag, kBudgetCountLagNs);
      EXPECT_LE(lag, most);
      EXPECT_GE(lag, at_lower_stretch[i]) << governed << " " << levels[i];
      last = lag;
      at_lower_stretch[i] = lag;
    }
  }
}

}  // namespace
}  // namespace trafficrate
