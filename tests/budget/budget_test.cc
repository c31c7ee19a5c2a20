// The budget controller as a function of its inputs (BudgetTick,
// BudgetMembershipChange): late and lagging counts, connections held back
// by their pacing, fresh starts and long gaps, pending starts, and the
// small helpers (LevelWorthApplying, PaceNearLevel, DefaultBurstBytes).
// Driven tick by tick with chosen inputs; the simulations of connections
// are budget_sharing_test.cc and budget_churn_test.cc. No sockets, no
// sleeps.

#include "src/budget/budget.h"

#include <algorithm>
#include <cstdint>

#include "gtest/gtest.h"

namespace trafficrate {
namespace {

// The count of connections at a few KB/s moves in steps of two segments
// each (their measuring gap): 8 connections at 4 KB/s measured 0.93-1.08
// of the rate in 1 s windows in 2-3 of 8 runs when the controller took it
// to lag 250 ms, and followed those steps.
TEST(BudgetTest, TheCountLagsByTheMeasuringGapOfTheLevel) {
  EXPECT_EQ(BudgetCountLagNs(0), kBudgetCountLagNs);
  EXPECT_EQ(BudgetCountLagNs(512000), kBudgetCountLagNs);
  EXPECT_NEAR(BudgetCountLagNs(4000), 2 * 1448 / 4000.0 * 1e9, 1e3);
  EXPECT_EQ(BudgetCountLagNs(1), kBudgetMaxMeasureGapNs);
}

TEST(BudgetTest, ALateCountHoldsTheDecisionForALimitedTime) {
  const BudgetSettings settings{512000, DefaultBurstBytes(512000)};
  BudgetInput in{1'000'000'000, 0, 4, 2896, 1};
  BudgetState state = BudgetTick(BudgetState(), in, settings);
  for (int i = 0; i < 10; ++i) {
    in.now_ns += kBudgetTickNs;
    in.sent_bytes += 512000 / 50;
    state = BudgetTick(state, in, settings);
  }
  const BudgetState before = state;
  in.count_late_ns = kBudgetLateHoldNs + 1;
  // Held: nothing moves while part of the count is missing.
  while (in.now_ns + kBudgetTickNs - before.last_ns < kBudgetMaxHoldNs) {
    in.now_ns += kBudgetTickNs;
    state = BudgetTick(state, in, settings);
    EXPECT_EQ(state.last_ns, before.last_ns);
    EXPECT_EQ(state.balance_bytes, before.balance_bytes);
    EXPECT_EQ(state.boost, before.boost);
  }
  // Not for longer: decided with what is in (the unsent span banked).
  in.now_ns += kBudgetTickNs;
  state = BudgetTick(state, in, settings);
  EXPECT_EQ(state.last_ns, in.now_ns);
  EXPECT_GT(state.balance_bytes, before.balance_bytes);
  // A lag within kBudgetCountLagNs is no reason to wait.
  in.count_late_ns = kBudgetLateHoldNs;
  in.now_ns += kBudgetTickNs;
  state = BudgetTick(state, in, settings);
  EXPECT_EQ(state.last_ns, in.now_ns);
}

// Every connection held back by its pacing (under 0): the equal share is
// the max-min level, whatever the count's lumps say. Bytes that leave in
// packets sent in step (nothing for a while, then a lump) must not move
// the level above it.
TEST(BudgetTest, ConnectionsAllHeldBackByTheirPacingKeepTheEqualShare) {
  const BudgetSettings settings{512000, DefaultBurstBytes(512000)};
  const uint32_t n = 16;
  const uint64_t equal = 512000 / n;
  BudgetState state;
  uint64_t sent = 0;
  int64_t now = 1'000'000'000;
  state = BudgetTick(state, {now, sent, n, 2896, 0}, settings);
  uint64_t lo = UINT64_MAX, hi = 0;
  for (int tick = 1; tick <= 500; ++tick) {
    now += kBudgetTickNs;
    // 10 s at exactly the rate on average: a lump of 5 ticks' worth every
    // fifth tick.
    if (tick % 5 == 0) sent += 512000 / 10;
    state = BudgetTick(state, {now, sent, n, 2896, 0}, settings);
    if (tick > 50) {
      lo = std::min(lo, state.level_bytes_per_sec);
      hi = std::max(hi, state.level_bytes_per_sec);
    }
  }
  EXPECT_LE(hi, equal);
  EXPECT_GE(lo, equal * 9 / 10);
  // The integral behind the level may float above 1 (its room while the
  // level is clipped at the equal share), never far.
  EXPECT_LE(state.boost, kBoostOne * 5 / 4);
  // The same lumps with half the connections using less than their share:
  // the level may rise, but never beyond the rate over those held back.
  state = BudgetState();
  now += 2'000'000'000;
  state = BudgetTick(state, {now, sent, n, 2896, n / 2}, settings);
  hi = 0;
  for (int tick = 1; tick <= 500; ++tick) {
    now += kBudgetTickNs;
    if (tick % 5 == 0) sent += 512000 * 3 / 40;  // 3/4 of the rate
    state = BudgetTick(state, {now, sent, n, 2896, n / 2}, settings);
    hi = std::max(hi, state.level_bytes_per_sec);
  }
  EXPECT_GT(hi, equal * 3 / 2);
  // At most 2 x equal, plus what the balance adds for its bank.
  EXPECT_LE(hi, 2 * equal * 3 / 2);
  EXPECT_LE(state.boost, 2 * kBoostOne);
}

TEST(BudgetTest, MembershipChangeTakesTheJoinersShareAtOnce) {
  const BudgetSettings settings{400'000, DefaultBurstBytes(400'000)};
  BudgetState state;
  state.last_ns = 1;
  state.boost = kBoostOne;  // 4 connections at 100k
  EXPECT_EQ(BudgetMembershipChange(state, settings, 4, 5).level_bytes_per_sec,
            80'000u);
  // A leave never lowers the level, and gives at least rate / active.
  EXPECT_EQ(BudgetMembershipChange(state, settings, 4, 2).level_bytes_per_sec,
            200'000u);
  state.boost = 3 * kBoostOne;  // 300k: others use little
  EXPECT_EQ(BudgetMembershipChange(state, settings, 4, 3).level_bytes_per_sec,
            300'000u);
  // A key not held back stays so while it is known to send little: its
  // connections, each sending what the whole key sent, would not send half
  // its rate.
  state.boost = kBoostUnbound;
  state.start_ns = 0;
  state.last_ns = 3'000'000'000;
  state.measured_bytes_per_sec = 20'000;
  EXPECT_EQ(BudgetMembershipChange(state, settings, 4, 9).level_bytes_per_sec,
            400'000u);
  // Else joiners would each send the whole rate until the next tick: an
  // equal split at once.
  state.measured_bytes_per_sec = 30'000;
  BudgetState joined = BudgetMembershipChange(state, settings, 4, 9);
  EXPECT_EQ(joined.boost, kBoostOne);
  EXPECT_EQ(joined.level_bytes_per_sec, 400'000u / 9);
  // In the first ticks of a run nothing is known yet: a client's first
  // connection is unbound alone, and those it opens a moment later join it
  // one at a time.
  state.measured_bytes_per_sec = 0;
  state.last_ns = state.start_ns + 3 * kBudgetTickNs;
  EXPECT_EQ(BudgetMembershipChange(state, settings, 1, 2).level_bytes_per_sec,
            200'000u);
  // A leave keeps it unbound.
  EXPECT_EQ(BudgetMembershipChange(state, settings, 2, 1).boost, kBoostUnbound);
  // A fresh key: the whole rate for one, an equal split for more.
  EXPECT_EQ(
      BudgetMembershipChange(BudgetState(), settings, 0, 1).level_bytes_per_sec,
      400'000u);
  EXPECT_EQ(
      BudgetMembershipChange(BudgetState(), settings, 1, 2).level_bytes_per_sec,
      200'000u);
}

TEST(BudgetTest, AFreshOrIdleKeyStartsAfresh) {
  const BudgetSettings settings{512000, DefaultBurstBytes(512000)};
  BudgetState state =
      BudgetTick(BudgetState(), {5'000'000'000, 1000, 2}, settings);
  EXPECT_EQ(state.level_bytes_per_sec, 256000u);
  EXPECT_EQ(state.balance_bytes, 0);
  // After a gap of more than a second the old balance means nothing.
  state.balance_bytes = -100000;
  state = BudgetTick(state, {8'000'000'000, 5000, 4}, settings);
  EXPECT_EQ(state.balance_bytes, 0);
  EXPECT_EQ(state.level_bytes_per_sec, 128000u);
}

// A key decided seconds apart by a busy watcher (BudgetInput::max_gap_ns)
// was not idle: no fresh start, and what it sent over the gap is its
// measured rate.
TEST(BudgetTest, ALongGapTheWatcherAllowsIsNoFreshStart) {
  const BudgetSettings settings{2048, DefaultBurstBytes(2048)};
  BudgetState state =
      BudgetTick(BudgetState(), {5'000'000'000, 1000, 1}, settings);
  state.balance_bytes = -800;
  BudgetInput input{13'000'000'000, 1000 + 8 * 2048, 1};
  input.max_gap_ns = 10'000'000'000;
  state = BudgetTick(state, input, settings);
  EXPECT_EQ(state.start_ns, 5'000'000'000);  // not started afresh
  EXPECT_EQ(state.balance_bytes, -800);      // 8 s at the rate: as it was
  EXPECT_NEAR(static_cast<double>(state.measured_bytes_per_sec), 2048, 100);
  EXPECT_EQ(state.level_bytes_per_sec, 2048u);
  // Past the gap it allows: afresh.
  input.now_ns = 24'000'000'000;
  input.sent_bytes += 100;
  state = BudgetTick(state, input, settings);
  EXPECT_EQ(state.start_ns, 24'000'000'000);
  EXPECT_EQ(state.balance_bytes, 0);
}

TEST(BudgetTest, PendingStartsNeverGrowEvenWhenTooLargeForADouble) {
  // What the zone's start_pending holds may be anything (garbage): the
  // caller subtracts what the tick forgave, so it must not come out larger.
  const BudgetSettings settings{512000, DefaultBurstBytes(512000)};
  BudgetState state =
      BudgetTick(BudgetState(), {5'000'000'000, 1000, 2}, settings);
  for (const uint64_t pending : {(uint64_t{1} << 60) + 255, UINT64_MAX - 1,
                                 uint64_t{18'100'000'000'000'000'000u}}) {
    BudgetInput input{5'001'000'000, 1000, 2};
    input.start_pending_bytes = pending;
    EXPECT_LE(BudgetTick(state, input, settings).start_pending_bytes, pending)
        << pending;
  }
}

TEST(BudgetTest, LevelWorthApplyingIgnoresSmallChanges) {
  EXPECT_TRUE(LevelWorthApplying(0, 100));
  EXPECT_FALSE(LevelWorthApplying(100'000, 103'000));
  EXPECT_TRUE(LevelWorthApplying(100'000, 105'000));
  EXPECT_TRUE(LevelWorthApplying(100'000, 95'000));
}

TEST(BudgetTest, PaceNearLevelIsWithinASixteenthOfAPaceInForce) {
  EXPECT_TRUE(PaceNearLevel(160'000, 160'000));
  EXPECT_TRUE(PaceNearLevel(160'000, 169'999));
  EXPECT_FALSE(PaceNearLevel(160'000, 170'000));
  EXPECT_TRUE(PaceNearLevel(160'000, 150'001));
  EXPECT_FALSE(PaceNearLevel(160'000, 150'000));
  // One join among 5 000 connections: not worth a setsockopt.
  EXPECT_TRUE(PaceNearLevel(10'000'000 / 5000, 10'000'000 / 5001));
  // Not paced yet: always worth one.
  EXPECT_FALSE(PaceNearLevel(0, 0));
  EXPECT_FALSE(PaceNearLevel(0, 1000));
}

TEST(BudgetTest, DefaultBurstIsFiftyMillisecondsOfTheRate) {
  EXPECT_EQ(DefaultBurstBytes(20 << 20), uint64_t{1} << 20);
  EXPECT_EQ(DefaultBurstBytes(1000), 16u * 1024);
}

}  // namespace
}  // namespace trafficrate
