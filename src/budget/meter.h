// The metering model: what the watcher knows of one connection's sending,
// from the kernel's counts taken at spaced measurements, and its estimate in
// between. Pure: the counts, the pacing and the time come in as arguments.
// The Governor meters real sockets with it (src/runtime/budget_ticks.cc);
// the budget controller's simulation (tests/budget/budget_sim.h) meters
// its simulated connections with the same code.
//
//   ConnMeter meter;  // per connection; Reset() at its registration
//   // At a measurement: left bytes had left, unsent still queued, at pace.
//   const bool under = meter.UnderPace(left, unsent, pace, now_ns);
//   meter.Record(left, cpu.stretch(), now_ns);
//   next_ns = now_ns + MeasureGapNs(piece, pace, cpu);
//   // Between measurements: what has probably left by now.
//   uint64_t count = meter.Estimate(pace, counted, handed, now_ns);
//
// Thread safety: the fields are relaxed atomics, so that a registration on
// any thread may reset them while the watcher reads; one thread measures.

#ifndef TRAFFICRATE_SRC_BUDGET_METER_H_
#define TRAFFICRATE_SRC_BUDGET_METER_H_

#include <atomic>
#include <cstdint>

#include "src/budget/budget.h"
#include "src/budget/cpu_budget.h"

namespace trafficrate {

// A connection is measured about every packet at its pacing rate (two
// segments at least), and at least every 2 s: a syscall per connection per
// tick would cost more than the whole budget allows at 10 000 connections
// (1% of a core: about 1 us per connection and second, and a syscall costs
// 1.3-2 us here). Between measurements Estimate counts it at the rate it was
// leaving, at most its pace.
inline constexpr int64_t kMaxMeasureGapNs = kBudgetMaxMeasureGapNs;
inline constexpr uint64_t kTwoSegmentsBytes = 2 * kSegmentBytes;
// The largest packet the kernel builds (GSO), the most one step counts as.
inline constexpr uint64_t kMaxPacketBytes = 65536;
// A connection that sends less than this part of its pace (over a second
// and eight packet gaps at least) is counted as using less than its share.
inline constexpr double kSlowPart = 0.85;

// The packet size a connection is scheduled by: what was measured, at
// least two segments, and two segments until measured (a slow connection
// takes seconds to get past its unpaced first segments, which do not
// count). The packet shaper's pieces are smaller at low levels (256 B at a
// few KB/s); the count then moves in small steps, and visiting by their gap
// would cost the watcher several times what it costs for the kernel's own
// two-segment packets, for no better count (the controller sizes its band
// and speed by two segments at least too: budget.cc).
uint32_t PacketOrTwoSegments(uint32_t packet_bytes);

// The gap to a connection's next measurement (see meter.cc).
int64_t MeasureGapNs(uint32_t piece_bytes, uint64_t pacing_bytes_per_sec,
                     const CpuBudget& cpu);

struct ConnMeter {
  // Forgets everything: a new registration.
  void Reset();
  // Judges afresh whether it sends under its pace (UnderPace), keeping
  // what was measured: a connection that rejoins after being idle, whose
  // idle time says nothing about it.
  void RestartUnderPace();

  // At a measurement (left bytes had left, unsent still queued, at pace),
  // before Record: whether the connection sends less than its pacing
  // allows (KeySlotShm::under_pace): nothing queued (the host gave it
  // nothing more), or under kSlowPart of what its pacing allowed over a
  // span long enough that whole packets do not decide it.
  bool UnderPace(uint64_t left, int64_t unsent, uint64_t pace, int64_t now_ns);

  // Records a measurement: the rate it left at since the one before, and
  // the size of the packets it leaves in (the smallest step between two
  // measurements; `stretch`, the watcher's CPU stretch, spaces them out).
  void Record(uint64_t left, double stretch, int64_t now_ns);

  // Between measurements: what has probably left by now_ns, at the rate it
  // was leaving (at most pace) since the last measurement, at most `handed`
  // (what the host gave the kernel). 0 when that is not a segment more than
  // `counted` (what was counted of it already): not worth a write to the
  // key's shared line.
  uint64_t Estimate(uint64_t pace, uint64_t counted, uint64_t handed,
                    int64_t now_ns) const;

  // What left at the last measurement, and when (0: never measured); the
  // rate it left at (bytes/s, 0: unknown); the packet size (0: not yet).
  std::atomic<uint64_t> measured_left;
  std::atomic<int64_t> measured_ns;
  std::atomic<uint64_t> left_rate;
  std::atomic<uint32_t> packet_bytes;
  // UnderPace's interval: begun at slow_since_ns (0: none begun) with
  // slow_since_left bytes left, in which its pacing allowed slow_allowed
  // bytes up to the last measurement, at slow_last_pace then; and its last
  // verdict.
  std::atomic<int64_t> slow_since_ns;
  std::atomic<uint64_t> slow_since_left;
  std::atomic<uint64_t> slow_allowed;
  std::atomic<uint64_t> slow_last_pace;
  std::atomic<bool> slow;
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_BUDGET_METER_H_
