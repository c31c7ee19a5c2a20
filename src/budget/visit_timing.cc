#include "src/budget/visit_timing.h"

#include <algorithm>

#include "src/budget/meter.h"
#include "src/budget/share.h"

namespace trafficrate {

int64_t StretchedDecideGapNs(int64_t gap_ns, const CpuBudget& cpu) {
  return std::min(cpu.Stretch(std::min(gap_ns, kMaxDecideGapNs)),
                  kMaxStretchedDecideGapNs);
}

int64_t VisitGapNs(uint32_t packet_bytes, uint64_t pace, const CpuBudget& cpu) {
  if (pace == 0) return 0;
  packet_bytes = PacketOrTwoSegments(packet_bytes);
  return std::max<int64_t>(
      0, StretchedDecideGapNs(
             static_cast<int64_t>(PacketGapNs(packet_bytes, pace) / 4), cpu));
}

uint32_t VisitRoundTicks(const CpuBudget& cpu) {
  if (cpu.stretch() >= 4) return kMaxVisitRoundTicks;
  return cpu.stretch() >= 2 ? 2 * kVisitRoundTicks : kVisitRoundTicks;
}

int64_t CountLagNs(uint64_t level, const CpuBudget& cpu) {
  return std::max(cpu.Stretch(kBudgetCountLagNs), BudgetCountLagNs(level));
}

}  // namespace trafficrate
