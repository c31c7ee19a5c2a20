// When the watcher's budget tick looks at what (budget_ticks.h,
// key_decisions.h): how far apart it may visit a sending connection,
// decide a key, re-apply a level; how many ticks a visit round has; how far
// a key's count may lag. Pure functions of a connection's packets, its pace
// and the watcher's CPU stretch (cpu_budget.h).
//
//   int64_t gap = VisitGapNs(packet_bytes, pace, cpu);
//
// Thread-safe.

#ifndef TRAFFICRATE_SRC_BUDGET_VISIT_TIMING_H_
#define TRAFFICRATE_SRC_BUDGET_VISIT_TIMING_H_

#include <cstdint>

#include "src/base/clock.h"
#include "src/budget/budget.h"
#include "src/budget/cpu_budget.h"

namespace trafficrate {

// A key is decided at least this often (its connections' packets are 2 s
// apart or more then, and every time constant of the controller is two
// packet gaps or more: KeyPace), and well within kBudgetMaxGapNs.
inline constexpr int64_t kMaxDecideGapNs = 500 * kNsPerMs;
// The most the watcher's CPU stretch makes of it: a visit is rounded up to
// a visit round (VisitRoundTicks) and may come a little late, and a key not
// decided for that long and two rounds more starts afresh (BudgetInput::
// max_gap_ns; at rounds of kVisitRoundTicks that is within kBudgetMaxGapNs).
inline constexpr int64_t kMaxStretchedDecideGapNs = 1600 * kNsPerMs;
// Connections visited this many ticks apart or more are visited in ticks
// whose number is a multiple of it (more while the watcher's work is spaced
// out: VisitRoundTicks), so that the watcher sleeps in between.
inline constexpr uint32_t kVisitRoundTicks = 5;
// The most that is: half a second.
inline constexpr uint32_t kMaxVisitRoundTicks = 5 * kVisitRoundTicks;
static_assert(kMaxStretchedDecideGapNs + 2 * kVisitRoundTicks * kBudgetTickNs <
              kBudgetMaxGapNs);
// A connection that is not sending here is looked at this many ticks
// apart (half a second); its join makes it due at once.
inline constexpr uint32_t kNotSendingVisitTicks = 25;
// A watcher's visit re-applies a changed level at least this often.
inline constexpr int64_t kMaxApplyGapNs = 4 * kNsPerSec;
// The window for the largest packet of a key's connections (three seconds:
// every sending connection is visited in it, even at the longest stretched
// gap rounded up to the longest visit round, and late by a round).
inline constexpr uint32_t kPacketWindowTicks = 3 * kNsPerSec / kBudgetTickNs;
static_assert(kMaxStretchedDecideGapNs +
                  2 * kMaxVisitRoundTicks * kBudgetTickNs <
              kPacketWindowTicks * kBudgetTickNs);
// A watcher this late or more is not waited for (BudgetInput::
// count_late_ns): its process is stopped or frozen, and its part of the
// count will not come soon.
inline constexpr int64_t kStoppedWatcherNs = 2 * kBudgetMaxHoldNs;

// A decision or visit interval: gap_ns up to kMaxDecideGapNs, times the
// watcher's CPU stretch, up to kMaxStretchedDecideGapNs.
int64_t StretchedDecideGapNs(int64_t gap_ns, const CpuBudget& cpu);

// How long the tick may skip a connection sending `packet_bytes` packets
// (0: not measured yet) at `pace`: a quarter of its packet gap, the interval
// at which its key is decided, and at most kMaxDecideGapNs; all of it times
// the watcher's CPU stretch, up to kMaxStretchedDecideGapNs. A new level
// reaches the connection only at its next packet anyway; joins and leaves
// reach it at once (Governor::ApplyChangedShares).
int64_t VisitGapNs(uint32_t packet_bytes, uint64_t pace, const CpuBudget& cpu);

// The visit round at the watcher's CPU stretch: a watcher spacing its work
// out wakes fewer times, each with more to do (a wakeup costs about as much
// as a measurement: 10 a second were a fifth of what 10 000 connections
// cost).
uint32_t VisitRoundTicks(const CpuBudget& cpu);

// How far a key's count at `level` may lag (BudgetInput::count_lag_ns):
// its connections' measuring gap (BudgetCountLagNs), or kBudgetCountLagNs
// times the watcher's CPU stretch if that is more. Not the gap times the
// stretch: a watcher that spaces its work out has thousands of connections,
// whose steps do not come in step, and a controller that slow (16 s at
// 50 000 connections of 10 clients) held keys at 0.95 of their rate.
int64_t CountLagNs(uint64_t level, const CpuBudget& cpu);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_BUDGET_VISIT_TIMING_H_
