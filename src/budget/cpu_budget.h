// The watcher's own CPU allowance in budget mode. Its cost is per
// connection: a measurement (one ioctl), a level applied (one setsockopt)
// and a visit, each every so often. With thousands of slow connections
// (a few KB/s each) that adds up to more than the allowance of 1% of a core
// per 10 000 governed connections. So the watcher reads its own thread's
// CPU time about once a second, and while it spends more than its
// allowance it spaces its per-connection work out by a common factor, the
// stretch (>= 1): connections are measured, visited and re-applied less
// often. Between measurements the budget estimates what left each
// connection at the rate it was leaving, so the totals hold; what is lost
// is speed of reaction, on a machine busy with that many connections.
// Below the allowance the stretch goes back towards 1. Plain code: times
// and counts in, a factor out.
//
//   CpuBudget cpu;
//   cpu.Update(now_ns, ThreadCpuNs(), governed);  // about once a second
//   gap_ns = cpu.Stretch(gap_ns);

#ifndef TRAFFICRATE_SRC_BUDGET_CPU_BUDGET_H_
#define TRAFFICRATE_SRC_BUDGET_CPU_BUDGET_H_

#include <cstdint>

namespace trafficrate {

// CPU time, per second of wall time, the watcher may spend per governed
// connection (0.8 us: 80% of 1% of a core per 10 000), and at least in all
// (0.2% of a core), below which it never stretches.
inline constexpr int64_t kCpuPerConnNsPerSec = 800;
inline constexpr int64_t kCpuFloorNsPerSec = 2'000'000;
// The most the per-connection work is spaced out: 8, and 1 for every
// kCpuStretchConns governed connections. With a few hundred connections
// what the watcher spends is mostly its ticks' own cost (waking, deciding
// keys, modelling drains), which spacing their work out would not lower,
// only slow the controller down. One per 300: a watcher of 2 500
// connections reaches 8 (at 5, 10 000 connections over 4 workers cost
// their watchers twice what 8 costs; their totals were the same).
inline constexpr double kMaxCpuStretch = 8;
inline constexpr uint32_t kCpuStretchConns = 300;

class CpuBudget {
 public:
  // One look: the calling thread's CPU time now (ever, ns; -1: unknown,
  // ignored) and how many connections it governs. Acts once per interval
  // of at least a second; the first call only starts one.
  void Update(int64_t now_ns, int64_t cpu_ns, uint32_t governed);
  // The factor (>= 1, <= kMaxCpuStretch and governed / kCpuStretchConns)
  // by which per-connection gaps are spaced out.
  double stretch() const { return stretch_; }
  // gap_ns times the stretch.
  int64_t Stretch(int64_t gap_ns) const {
    return static_cast<int64_t>(static_cast<double>(gap_ns) * stretch_);
  }
  // Whether an Update now would act (a second has passed since the last
  // interval began), so that the caller reads the CPU clock only then.
  bool Due(int64_t now_ns) const;
  // The CPU per second of wall time spent in the last interval, ns (0 until
  // one was measured).
  int64_t used_ns_per_sec() const { return used_; }

 private:
  int64_t since_ns_ = 0;  // when the current interval began; 0: none yet
  int64_t since_cpu_ns_ = 0;
  int64_t used_ = 0;
  double stretch_ = 1;
};

// The calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID), ns; -1 if the
// clock cannot be read.
int64_t ThreadCpuNs();

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_BUDGET_CPU_BUDGET_H_
