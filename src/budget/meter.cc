#include "src/budget/meter.h"

#include <algorithm>

#include "src/base/clock.h"

namespace trafficrate {

uint32_t PacketOrTwoSegments(uint32_t packet_bytes) {
  return std::max(packet_bytes, static_cast<uint32_t>(kTwoSegmentsBytes));
}

// Two segments at the pace, or three quarters of the shaper's piece (each
// piece is a packet) if that is more, in [a tick, kMaxMeasureGapNs], times
// the watcher's CPU stretch. Less than a packet gap, so that the smallest
// step between two measurements stays one packet (Record learns the packet
// size from it); more often would only see the same packet again. A key's
// pieces are about a thousandth of its rate (shaper.h): a key with many
// connections sends each a piece seconds apart, and measuring those every
// two segments cost the watcher 6% of a core per 10 000 connections. The
// piece, not the measured packet: that one is learnt from these
// measurements' steps, and the gap must not grow with it.
int64_t MeasureGapNs(uint32_t piece_bytes, uint64_t pacing_bytes_per_sec,
                     const CpuBudget& cpu) {
  if (pacing_bytes_per_sec == 0) return kBudgetTickNs;
  const uint64_t bytes =
      std::max<uint64_t>(kTwoSegmentsBytes, uint64_t{piece_bytes} * 3 / 4);
  const uint64_t gap = bytes * kNsPerSec / pacing_bytes_per_sec;
  return cpu.Stretch(std::clamp<int64_t>(static_cast<int64_t>(gap),
                                         kBudgetTickNs, kMaxMeasureGapNs));
}

void ConnMeter::Reset() {
  measured_left.store(0, std::memory_order_relaxed);
  measured_ns.store(0, std::memory_order_relaxed);
  left_rate.store(0, std::memory_order_relaxed);
  packet_bytes.store(0, std::memory_order_relaxed);
  slow_since_left.store(0, std::memory_order_relaxed);
  slow_allowed.store(0, std::memory_order_relaxed);
  slow_last_pace.store(0, std::memory_order_relaxed);
  RestartUnderPace();
}

void ConnMeter::RestartUnderPace() {
  slow_since_ns.store(0, std::memory_order_relaxed);
  slow.store(false, std::memory_order_relaxed);
}

bool ConnMeter::UnderPace(uint64_t left, int64_t unsent, uint64_t pace,
                          int64_t now_ns) {
  const int64_t since = slow_since_ns.load(std::memory_order_relaxed);
  const uint64_t since_left = slow_since_left.load(std::memory_order_relaxed);
  if (since == 0 || pace == 0 || left < since_left) {
    slow_since_ns.store(now_ns, std::memory_order_relaxed);
    slow_since_left.store(left, std::memory_order_relaxed);
    slow_allowed.store(0, std::memory_order_relaxed);
  } else {
    // What its pacing allowed since the last measurement: the lower of
    // its pace then and now (a raise reaches it only at its next packet).
    const uint64_t last_pace = slow_last_pace.load(std::memory_order_relaxed);
    const int64_t last_ns = measured_ns.load(std::memory_order_relaxed);
    const uint64_t low = std::min(last_pace, pace);
    const uint64_t allowed =
        slow_allowed.load(std::memory_order_relaxed) +
        static_cast<uint64_t>(static_cast<double>(low) *
                              std::max<int64_t>(0, now_ns - last_ns) /
                              kNsPerSec);
    // Long enough that whole packets do not decide it (an eighth of what
    // was allowed at most), and a second at least.
    const int64_t span = std::max<int64_t>(
        kNsPerSec,
        static_cast<int64_t>(
            8 * PacketGapNs(PacketOrTwoSegments(
                                packet_bytes.load(std::memory_order_relaxed)),
                            static_cast<double>(std::max<uint64_t>(1, low)))));
    if (now_ns - since >= span) {
      // Under kSlowPart of that: held back by something else (its client's
      // window, the path, the host), so it uses less than its share.
      slow.store(static_cast<double>(left - since_left) <
                     kSlowPart * static_cast<double>(allowed),
                 std::memory_order_relaxed);
      slow_since_ns.store(now_ns, std::memory_order_relaxed);
      slow_since_left.store(left, std::memory_order_relaxed);
      slow_allowed.store(0, std::memory_order_relaxed);
    } else {
      slow_allowed.store(allowed, std::memory_order_relaxed);
    }
  }
  slow_last_pace.store(pace, std::memory_order_relaxed);
  // Nothing queued: the host has given it nothing more to send.
  return unsent == 0 || slow.load(std::memory_order_relaxed);
}

void ConnMeter::Record(uint64_t left, double stretch, int64_t now_ns) {
  const int64_t prev_ns = measured_ns.load(std::memory_order_relaxed);
  const uint64_t prev_left = measured_left.load(std::memory_order_relaxed);
  uint64_t rate = 0;
  if (prev_ns != 0 && left >= prev_left) {
    const uint64_t step = left - prev_left;
    if (now_ns > prev_ns) {
      const uint64_t inst = static_cast<uint64_t>(
          static_cast<double>(step) * kNsPerSec / (now_ns - prev_ns));
      const uint64_t before = left_rate.load(std::memory_order_relaxed);
      rate = before == 0 ? inst : (before + inst) / 2;
    }
    if (step > 0 && prev_left >= kUnpacedStartBytes) {
      // Bytes leave in whole packets (TSO: up to 64 KiB on fast paths), and
      // a connection is measured about every two segments at its pace:
      // what left between two measurements of a slow connection is a
      // packet. Not its first segments, which the kernel sends at once
      // (they are no packet of its pace). A visit that comes late sees two
      // packets or more at once, so the smallest step is the packet: a
      // smaller one is taken at once, a larger one a quarter at a time.
      // A measurement spaced out by the watcher's CPU stretch comes that
      // many times later, and sees that many times the bytes: as many
      // packets, not a larger one (a larger packet would slow the key's
      // controller, and 10 000 keys at 2 KB/s fell to 0.8 of their rate).
      const uint32_t before = packet_bytes.load(std::memory_order_relaxed);
      const uint32_t seen = static_cast<uint32_t>(
          std::min(static_cast<uint64_t>(static_cast<double>(step) / stretch),
                   kMaxPacketBytes));
      packet_bytes.store(
          before == 0 ? seen : std::min(seen, before + before / 4),
          std::memory_order_relaxed);
    }
  }
  measured_left.store(left, std::memory_order_relaxed);
  measured_ns.store(now_ns, std::memory_order_relaxed);
  left_rate.store(rate, std::memory_order_relaxed);
}

uint64_t ConnMeter::Estimate(uint64_t pace, uint64_t counted, uint64_t handed,
                             int64_t now_ns) const {
  const int64_t since = measured_ns.load(std::memory_order_relaxed);
  // At most its pace: bytes leave in packets, so what was seen between two
  // measurements may be a packet sent at once, and extrapolating that would
  // count ahead of what really left.
  uint64_t rate = left_rate.load(std::memory_order_relaxed);
  if (pace > 0) rate = std::min(rate, pace);
  if (since == 0 || rate == 0 || now_ns <= since || counted == 0) return 0;
  // What left since the last measurement, at the rate it was leaving; at
  // most what was handed to the kernel. An estimate too high holds the
  // count until the real bytes catch up (the count only grows).
  const uint64_t estimate = measured_left.load(std::memory_order_relaxed) +
                            static_cast<uint64_t>(static_cast<double>(rate) *
                                                  (now_ns - since) / kNsPerSec);
  // Less than a segment more: not worth a write to the key's shared line.
  if (estimate < counted + kSegmentBytes) return 0;
  return std::min(estimate, handed);
}

}  // namespace trafficrate
