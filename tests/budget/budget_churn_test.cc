// The budget controller, driven by simulation (budget_sim.h), while
// connections come and go: unpaced starts forgiven or repaid within the
// horizon, short connections next to long ones (plain and through the
// packet shaper), ticks that see no packet, joins and leaves.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "src/budget/budget.h"
#include "tests/budget/budget_sim.h"

namespace trafficrate {
namespace {

using testing_util::kInf;
using testing_util::kMss;
using testing_util::Sim;

TEST(BudgetTest, DebtsAreRepaidWithinAboutTheHorizon) {
  Sim sim(512000, /*big_packets=*/false);
  for (int i = 0; i < 4; ++i) sim.Join();
  sim.Run(3);
  // 4 new connections each send their first 10 segments unpaced at once
  // (~57 KiB), then leave: forgiven from the allowance (refilled while no
  // new connection joined), not repaid.
  for (int i = 0; i < 4; ++i) sim.Join(kInf, 10 * kMss);
  sim.Run(0.1);
  EXPECT_LE(BudgetDebtBytes(sim.state()), DefaultBurstBytes(512000));
  EXPECT_LT(sim.state().start_allowance_bytes, 512000u / 5 - 50'000);
  sim.Run(2.9);
  EXPECT_GE(sim.Ratio(4.1, 5.1), 0.97);
  // 16 more at once (~226 KiB): beyond the allowance left, a debt.
  for (int i = 0; i < 16; ++i) sim.Join(kInf, 10 * kMss);
  sim.Run(0.1);
  EXPECT_GT(BudgetDebtBytes(sim.state()), 100'000u);
  sim.Run(kBudgetHorizonNs / 1e9);
  // Most of it is repaid within the horizon, and all of it down to about
  // the dead band of half a burst soon after.
  EXPECT_LE(BudgetDebtBytes(sim.state()), 50'000u);
  sim.Run(0.5);
  EXPECT_LE(BudgetDebtBytes(sim.state()), DefaultBurstBytes(512000));
  sim.Run(5.5);
  // Over the rate by what was forgiven (0.2 s of the rate, 2% of these
  // 11 s), no more.
  EXPECT_NEAR(sim.Ratio(2, 13), 1.02, 0.02);
  // Repaid, not forgiven: the second after the burst sends less than the
  // rate by about what was owed, and then the rate again.
  EXPECT_LE(sim.Ratio(6.1, 7.1), 0.95);
  const auto [lo, hi] = sim.WindowRange(8, 13);
  EXPECT_GE(lo, 0.95);
  EXPECT_LE(hi, 1.05);
}

// Connections that start together at a key's start each send their first
// 10 segments unpaced: 64 of them 1.8 s of the rate in a moment. That is
// forgiven (repaying it would hold the key far below its rate for the
// seconds after), and the level stays the equal share.
TEST(BudgetTest, ConnectionsStartingTogetherAreNotMadeToRepayTheirStart) {
  Sim sim(512000, /*big_packets=*/false);
  for (int i = 0; i < 64; ++i) sim.Join();
  sim.Run(1);
  // (The simulated connections send in exact step, so its 1 s windows hold
  // two or three rounds of packets, in any mode; the level is what the
  // controller answers for.)
  uint64_t lowest = UINT64_MAX;
  for (int i = 0; i < 110; ++i) {
    sim.Run(0.1);
    lowest = std::min(lowest, sim.state().level_bytes_per_sec);
  }
  EXPECT_GE(lowest, 512000 / 64 * 9 / 10);
  EXPECT_NEAR(sim.Ratio(2, 12), 1.0, 0.03);
}

TEST(BudgetTest, ShortConnectionsNextToLongOnesDoNotRaiseTheTotal) {
  for (int per_sec : {10, 20}) {
    Sim sim(512000, /*big_packets=*/false);
    for (int i = 0; i < 4; ++i) sim.Join();
    // As in the benchmark, the requests start with the downloads. The
    // first few are forgiven their unpaced start (BudgetInput): measured
    // from 2 s, as the benchmark does.
    sim.Run(0.1);
    for (int s = 0; s < 12 * per_sec; ++s) {
      sim.Join(kInf, 65536);  // a 64 KiB Range request on a new connection
      sim.Run(1.0 / per_sec);
    }
    // At 20 per second the Range requests alone want 1.25 MiB/s of a
    // 500 KiB/s budget: they pile up (200 at once after 10 s), each
    // starting with 10 unpaced segments, and the level of so many falls so
    // low that a packet holds a connection for seconds: the controller
    // then keeps near the equal share (KeyPace::min_boost). Known limit:
    // only a bound on the total is held there.
    if (per_sec > 10) {
      EXPECT_LE(sim.Ratio(2, 11), 1.40) << per_sec;
      continue;
    }
    EXPECT_LE(sim.Ratio(2, 11), 1.03) << per_sec;
    EXPECT_GE(sim.Ratio(2, 11), 0.97) << per_sec;
    // (Without the shaper, its windows reach 1.085, metered as the
    // Governor meters (meter.h): the repaid starts hold the level low,
    // where the count lags by its measuring gap and the controller follows
    // it more slowly, BudgetCountLagNs, and between measurements a short
    // connection is estimated at most at its pace, so the count of its
    // unpaced start comes at the next measurement. Through the shaper, the
    // default, 5%: the next test.)
    const auto [lo, hi] = sim.WindowRange(2, 11);
    EXPECT_LE(hi, 1.09) << per_sec;
    EXPECT_GE(lo, 0.94) << per_sec;
  }
}

// Through the packet shaper the requests' first flights are 10 pieces of
// 100 B, their packets small and out of step: at 20 new connections a
// second as well, the total holds within 3% and every window within 5%.
TEST(BudgetTest, ShapedShortConnectionsNextToLongOnesHoldTheTotal) {
  for (int per_sec : {10, 20}) {
    Sim sim(512000, /*big_packets=*/false);
    sim.set_shaped();
    for (int i = 0; i < 4; ++i) sim.Join();
    sim.Run(0.1);
    for (int s = 0; s < 12 * per_sec; ++s) {
      sim.Join(kInf, 65536);
      sim.Run(1.0 / per_sec);
    }
    EXPECT_LE(sim.Ratio(2, 11), 1.03) << per_sec;
    EXPECT_GE(sim.Ratio(2, 11), 0.97) << per_sec;
    const auto [lo, hi] = sim.WindowRange(2, 11);
    EXPECT_LE(hi, 1.05) << per_sec;
    EXPECT_GE(lo, 0.94) << per_sec;
  }
}

// CI's watcher, busy, once held a stream of new connections to 1.10x: the
// ticks' visits held no measured packet, the size fell back to unknown
// (64 KiB), and with it the controller's reach below the equal share.
TEST(BudgetTest, ATickThatSeesNoPacketKeepsTheSizeLastSeen) {
  const BudgetSettings settings{512000, DefaultBurstBytes(512000)};
  BudgetState state =
      BudgetTick(BudgetState(), {1'000'000'000, 0, 8, 3584}, settings);
  EXPECT_EQ(state.packet_bytes, 3584u);
  state = BudgetTick(state, {1'020'000'000, 10240, 8, 0}, settings);
  EXPECT_EQ(state.packet_bytes, 3584u);
  state = BudgetTick(state, {1'040'000'000, 20480, 8, 2896}, settings);
  EXPECT_EQ(state.packet_bytes, 2896u);
  // A fresh start (idle past kBudgetMaxGapNs) forgets it.
  state = BudgetTick(state, {9'000'000'000, 30000, 8, 0}, settings);
  EXPECT_EQ(state.packet_bytes, 0u);

  Sim sim(512000, /*big_packets=*/false);
  sim.set_packet_seen_every(25);  // once every 0.5 s
  for (int i = 0; i < 4; ++i) sim.Join();
  sim.Run(0.1);
  for (int s = 0; s < 120; ++s) {
    sim.Join(kInf, 65536);
    sim.Run(0.1);
  }
  EXPECT_LE(sim.Ratio(2, 11), 1.03);
  EXPECT_GE(sim.Ratio(2, 11), 0.97);
}

TEST(BudgetTest, JoinsAndLeavesHoldEveryWindowAfterTheChange) {
  for (bool big : {false, true}) {
    Sim sim(5 << 20, big);
    std::vector<size_t> extra;
    sim.Join();
    sim.Join();
    sim.Run(4);
    for (int i = 0; i < 6; ++i) extra.push_back(sim.Join());
    sim.Run(5);
    for (size_t i : extra) sim.Leave(i);
    sim.Run(5);
    // With 64 KiB packets a window holds whole packets: +-8% there.
    const double tolerance = big ? 0.08 : 0.05;
    for (double change : {4.0, 9.0}) {
      const auto [lo, hi] = sim.WindowRange(change + 1, change + 5);
      EXPECT_GE(lo, 1 - tolerance) << "big=" << big << " after " << change;
      EXPECT_LE(hi, 1 + tolerance) << "big=" << big << " after " << change;
    }
    // No dip right after the leave either. With 64 KiB packets the
    // survivors first wait out the gaps scheduled at the old level (0.1 s
    // here), which the burst allowance can only partly make up.
    EXPECT_GE(sim.Ratio(9, 10), big ? 0.92 : 0.95) << "big=" << big;
  }
}

}  // namespace
}  // namespace trafficrate
