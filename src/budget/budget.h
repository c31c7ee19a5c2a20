// The shared byte budget: one controller per key turns what the key's
// connections really sent (bytes that left their sockets, summed over every
// process) into one pacing cap, the *level*, for each of its sending
// connections. Plain code: byte counts and times in, a level out; no sockets
// and no clock, so tests drive it by simulation.
//
//   BudgetState state;                        // kept in the key's zone slot
//   BudgetSettings settings{rate, burst};
//   state = BudgetTick(state, {now_ns, key_sent_bytes, active}, settings);
//   cap = state.level_bytes_per_sec;          // SO_MAX_PACING_RATE of each
//
// How it decides, once per tick (~20 ms):
// * A token bucket of the key's rate: the balance gains rate x dt and loses
//   what left the sockets; it holds at most `burst` bytes of unused
//   allowance, and a negative balance is a debt (first unpaced segments of
//   new connections, 64 KiB TSO packets, a lag after a change). While
//   every connection is held back by its pacing it may also bank up to the
//   band (below): the count's lumps go both ways.
// * New connections' first 10 segments leave unpaced, at once: a client
//   opening 64 connections together sends 1.8 s of a 500 KB/s rate in a
//   moment, which no pacing can prevent, and repaying it would hold the
//   client far below its rate for seconds. So those bytes are forgiven as
//   they show as a debt (and left out of the measured rate): all of them
//   in the first kStartGraceNs of a run of sending, and after that from an
//   allowance of at most 0.2 s of the rate, refilled at a tenth of the
//   rate per second only while no new connection joins (a few connections
//   opened together now and then). A stream of new connections is counted.
// * Under max-min fairness every constrained connection gets the same level
//   L, and L >= rate / active (equality when all want more). So the level is
//   the equal share rate / active times a boost, which integrates the gap
//   between the rate and what the key sends (>= 0.5 s). While every
//   sending connection is held back by its pacing (BudgetInput::under is
//   0) the equal share is the max-min level: the level uses a boost of 1
//   at most, below only while the key sends more than its rate even so.
//   The boost itself may float up to 1.25 then, so that the count's lumps
//   (packets sent in step, seconds apart) move it both ways around where
//   the key sends its rate instead of only down from 1, and it follows
//   them down only slowly. While some use less than their
//   share it rises while the rest split what they leave (at most to the
//   rate over those that do not) and falls while the key sends more than
//   its rate.
// * The balance corrects the level at once, in proportion: a debt beyond
//   the band lowers it until repaid over the horizon (>= 1 s), a bank beyond
//   it raises it; a lasting one moves the boost too, slowly (5 s). The band
//   covers how far the count may be off: each connection is sampled about
//   every two segments, and bytes leave in whole packets.
// * While the key sends clearly less than its rate (under half of it, with
//   allowance banked, for a while) the boost doubles per tick until the
//   level is the whole rate: the key is then *unbound*, and nothing is held
//   back, so request/response traffic runs as without the library. It is
//   bound again as soon as it sends 90% of its rate or owes.
//
// * Each process's watcher counts its own connections. While one of them
//   is late (its process got no CPU for a while, BudgetInput::
//   count_late_ns) the key is not decided: its count lacks what that
//   process's connections sent meanwhile, and would take it for unused and
//   then, when it comes, for a burst over the rate. At most
//   kBudgetMaxHoldNs.
//
// A departure time the kernel already scheduled cannot be pulled back (a
// packet's gap is fixed at the rate in force when it leaves). So the
// controller's speed and reach follow the gap between a connection's
// packets (BudgetInput::packet_bytes at the level): while packets are close
// together the level may go down to a quarter of the equal share; when a
// packet holds a connection for seconds (64 KiB TSO packets at a few KB/s),
// it stays near the equal share and acts slowly, since a lower level would
// stall connections for longer than any window it could correct.

#ifndef TRAFFICRATE_SRC_BUDGET_BUDGET_H_
#define TRAFFICRATE_SRC_BUDGET_BUDGET_H_

#include <algorithm>
#include <cstdint>

namespace trafficrate {

// How connections of a key share its rate (TRAFFICRATE_SHARE). Stored in
// the zone header: 0, what a fresh zone holds, is the default mode.
enum class ShareMode : uint32_t {
  kEqual = 0,   // max(1, rate / active) per connection, always
  kBudget = 1,  // this controller
};

inline constexpr int64_t kBudgetTickNs = 20'000'000;        // 20 ms
inline constexpr int64_t kBudgetHorizonNs = 1'000'000'000;  // debts repaid over
// The number of the tick that holds time now_ns; never 0 (0 means "never"
// where tick numbers are stored). Numbers wrap; differences do not.
inline uint32_t BudgetTickOf(int64_t now_ns) {
  const uint32_t tick = static_cast<uint32_t>(now_ns / kBudgetTickNs);
  return tick != 0 ? tick : 1;
}
// A tick after a gap longer than this starts the key afresh (it was idle).
// Keys of slow connections are decided up to 1.6 s apart when the watcher
// spaces its work out (cpu_budget.h), and a visit round later
// (BudgetInput::max_gap_ns).
inline constexpr int64_t kBudgetMaxGapNs = 2'000'000'000;
// The debt is bounded, so that a rate lowered by `trafficrate set` or a
// flood of new connections is not paid for over minutes.
inline constexpr int64_t kBudgetMaxDebtNs = 500'000'000;  // 0.5 s of rate
inline constexpr uint32_t kBoostOne = 1 << 16;            // fixed point 16.16
// New connections' unpaced starts are all forgiven this long after a key's
// fresh start (BudgetInput::start_pending_bytes).
inline constexpr int64_t kStartGraceNs = 500'000'000;
// The boost of a key that is not held back at all: its level is the rate.
inline constexpr uint32_t kBoostUnbound = UINT32_MAX;

// How long a connection's part of the count may lag what left: the watcher
// samples it about every two segments, at least every 2 s, and estimates
// in between; a quarter second of its level covers that on average.
inline constexpr int64_t kBudgetCountLagNs = 250'000'000;

// A watcher holding part of a key's count that is later than this past its
// due time (BudgetInput::count_late_ns) holds the key's decisions: its
// connections went on sending, and their bytes would show up at once when
// it runs, after ticks that took them for unused (the bank clipped, the
// boost raised) as a lump over the rate (a debt, a cut). A shorter lag is
// within kBudgetCountLagNs.
inline constexpr int64_t kBudgetLateHoldNs = 2 * kBudgetTickNs;
// A key is held at most this long since its last decision: a watcher that
// does not come back (its process stopped) must not freeze the others, and
// the next try, up to half a second later (the Governor holds only keys it
// decides that often), must come before kBudgetMaxGapNs.
inline constexpr int64_t kBudgetMaxHoldNs = 1'200'000'000;

// A full segment on a 1500-byte path (the kernel's MSS there).
inline constexpr uint64_t kSegmentBytes = 1448;

// What a new connection sends before the kernel paces it: 10 segments
// (tcp_update_skb_after_send).
inline constexpr uint64_t kUnpacedStartBytes = 10 * kSegmentBytes;

// The time between two packets of `packet_bytes` of one connection paced at
// `level_bytes_per_sec` (> 0): a new level reaches the connection only
// after the gap of the packet it sent last.
inline double PacketGapNs(double packet_bytes, double level_bytes_per_sec) {
  return packet_bytes / level_bytes_per_sec * 1e9;
}

// How far a key's count may lag what left (BudgetInput::count_lag_ns) for
// connections paced at `level_bytes_per_sec` (0: not known), before the
// watcher's CPU stretch: each is measured about every two segments at its
// pace, at most every kBudgetMaxMeasureGapNs, and estimated in between
// (Governor::MeasureConn), so the count comes in steps that far apart at
// slow levels (0.7 s at 4 KB/s), and lags by kBudgetCountLagNs at least.
inline constexpr int64_t kBudgetMaxMeasureGapNs = 2'000'000'000;
inline int64_t BudgetCountLagNs(uint64_t level_bytes_per_sec) {
  if (level_bytes_per_sec == 0) return kBudgetCountLagNs;
  const double gap =
      PacketGapNs(2 * kSegmentBytes, static_cast<double>(level_bytes_per_sec));
  return static_cast<int64_t>(
      std::clamp<double>(gap, kBudgetCountLagNs, kBudgetMaxMeasureGapNs));
}

struct BudgetSettings {
  uint64_t rate_bytes_per_sec = 0;
  // Unused allowance a key may bank (TRAFFICRATE_BURST).
  uint64_t burst_bytes = 0;
};

// One key's controller state. Stored in the zone (KeySlotShm) by the
// process holding the key's lease; any process may read it for stat.
struct BudgetState {
  int64_t last_ns = 0;        // time of the last tick; 0: never ticked
  uint64_t sent_bytes = 0;    // the key's sent bytes at the last tick
  int64_t balance_bytes = 0;  // allowance minus use; <= burst; < 0 is debt
  uint64_t level_bytes_per_sec = 0;     // 0: none yet
  uint64_t measured_bytes_per_sec = 0;  // sent rate, smoothed over ~0.2 s
  // Level over the equal share rate / active, 16.16; kBoostUnbound: the
  // level is the whole rate.
  uint32_t boost = kBoostOne;
  uint32_t under_ticks = 0;  // ticks in a row clearly under the rate
  // BudgetInput::packet_bytes of the last tick that saw one.
  uint32_t packet_bytes = 0;
  // When the key's current run of sending began (its fresh start).
  int64_t start_ns = 0;
  // What may still be forgiven of new connections' unpaced starts outside
  // the first kStartGraceNs of a run: empty at a fresh start, refilled
  // while no new connection joins (budget.cc).
  uint64_t start_allowance_bytes = 0;
  // Out: what is left of BudgetInput::start_pending_bytes after this tick
  // (what it forgave taken off, what lapsed dropped); the caller stores it.
  uint64_t start_pending_bytes = 0;
};

struct BudgetInput {
  int64_t now_ns = 0;
  uint64_t sent_bytes = 0;  // the key's bytes that left its sockets, ever
  uint32_t active = 0;      // its sending connections, in all processes
  // The largest packet its connections send (TSO: up to 64 KiB on fast
  // paths); 0: unknown, taken as 64 KiB. A level change reaches a
  // connection only after the packet in flight's gap: the controller is
  // slower when that gap is long.
  uint32_t packet_bytes = 0;
  // Of `active`, how many send less than their pacing allows (the host has
  // nothing queued for them, or their client reads slowly), as last seen.
  // 0: all are held back by their pacing, so the max-min level is the
  // equal share and only the balance moves the level off it.
  uint32_t under = 0;
  // The unpaced first segments of connections that joined new (10 each)
  // and are not forgiven yet. The kernel sends them at once, so a client
  // that opens many connections together goes over its rate in that first
  // moment whatever the pacing; what would make it pay that back for
  // seconds afterwards is forgiven: all of it in the first kStartGraceNs of
  // a run of sending, and from an allowance after that that refills only
  // while no new connection joins, so that a stream of new connections is
  // still held to the rate.
  uint64_t start_pending_bytes = 0;
  // How long a connection's part of `sent_bytes` may lag what really left,
  // at most (BudgetCountLagNs of the level, or kBudgetCountLagNs times the
  // watcher's stretch while it spaces its measurements out, cpu_budget.h,
  // if that is more). The balance does not act on what is within that much
  // of the level for each connection, and the boost follows a count that
  // lags more, more slowly.
  int64_t count_lag_ns = 0;
  // Its connections send through the packet shaper (TRAFFICRATE_SHAPE):
  // small MSG_EOR pieces, sized differently for each connection, so they
  // are not in step and the count moves in small steps. Without it, the
  // kernel's packets (up to 64 KiB) of connections that started together
  // leave in step, seconds apart, and the count comes in lumps; the
  // controller then lets the boost fall more slowly than it rises while
  // the balance is within the band, or the lumps would hold the key under
  // its rate. With it that slowness is a bias: the key's new connections'
  // unpaced first bytes would go uncorrected.
  bool shaped = false;
  // The longest gap the watcher leaves between two decisions of this key
  // while it is sending (0 or less than kBudgetMaxGapNs: that). A gap
  // longer than that is a fresh start (the key was idle); a watcher that
  // spaces its work out (cpu_budget.h) visits in rounds up to half a
  // second apart, and its keys keep their state across them.
  int64_t max_gap_ns = 0;
  // How long past its due time the latest watcher holding part of this
  // count is (0: none is): its connections went on sending meanwhile, and
  // their bytes show up in the count only once it runs.
  int64_t count_late_ns = 0;
};

// One decision. Pure; safe from any thread.
BudgetState BudgetTick(const BudgetState& state, const BudgetInput& input,
                       const BudgetSettings& settings);

// The state to use at once when the key's sending connections go from
// old_active to new_active (a join or a leave), before the next tick: a
// joiner takes its share from the others now rather than sending at the old
// level for a tick (the boost stays, so the level is level x old / new), and
// survivors of a leave keep their level or get the equal share if that is
// more. A key that is not held back stays so on a leave, and on a join
// only while it is known to send little (each of its connections sending
// what the whole key sent would not make half its rate); else joiners,
// each paced at the whole rate until the next tick, would send that many
// times its rate meanwhile, so it is bound at an equal split. Pure.
BudgetState BudgetMembershipChange(const BudgetState& state,
                                   const BudgetSettings& settings,
                                   uint32_t old_active, uint32_t new_active);

// Debt in bytes (>= 0) of a state.
inline uint64_t BudgetDebtBytes(const BudgetState& state) {
  // Unsigned negation: defined for INT64_MIN too (zone state may be any).
  return state.balance_bytes < 0
             ? 0 - static_cast<uint64_t>(state.balance_bytes)
             : 0;
}

// Whether a new level differs enough from the one applied to be worth a
// setsockopt on every connection of the key (and a wake of every watcher).
// A step back to the key's equal share exactly (every connection held back
// by its pacing, nothing owed; 0: not known) is, however small: a level a
// little off it would stay off for good.
bool LevelWorthApplying(uint64_t applied_bytes_per_sec,
                        uint64_t level_bytes_per_sec,
                        uint64_t equal_bytes_per_sec = 0);

// Whether one connection paced at pace_bytes_per_sec (0: not paced yet) is
// within a sixteenth of level_bytes_per_sec: not worth a setsockopt of its
// own. Its key's level moves by that much with every packet, and a join or
// leave among many connections by less; the controller answers for the
// total.
bool PaceNearLevel(uint64_t pace_bytes_per_sec, uint64_t level_bytes_per_sec);

// The default TRAFFICRATE_BURST for a rate: 50 ms of it, at least 16 KiB
// (about ten segments, what a new connection sends unpaced anyway).
uint64_t DefaultBurstBytes(uint64_t rate_bytes_per_sec);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_BUDGET_BUDGET_H_
