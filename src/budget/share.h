// The share math: what one connection of a key may send.

#ifndef TRAFFICRATE_SRC_BUDGET_SHARE_H_
#define TRAFFICRATE_SRC_BUDGET_SHARE_H_

#include <cstdint>

namespace trafficrate {

// The rates and bursts a key may have: what TRAFFICRATE_RATE and
// TRAFFICRATE_BURST (and a rules file's rate and burst) accept, and what
// the zone clamps the figures it holds to.
inline constexpr uint64_t kMinRateBytesPerSec = 1;
inline constexpr uint64_t kMaxRateBytesPerSec = uint64_t{1} << 40;  // 1048576m
inline constexpr uint64_t kMinBurstBytes = uint64_t{1} << 10;       // 1k
inline constexpr uint64_t kMaxBurstBytes = uint64_t{1} << 30;       // 1g

// Share of one sending connection: max(1, rate / active), in bytes/s. With no
// active connection counted (a join not yet visible) the connection may use
// the whole rate. The floor of 1 keeps a huge key from disabling pacing, as
// the nginx module's floor does.
// Hot path: no allocation, errno untouched.
inline uint64_t ShareBytesPerSec(uint64_t rate_bytes_per_sec, uint32_t active) {
  if (active <= 1) return rate_bytes_per_sec > 0 ? rate_bytes_per_sec : 1;
  const uint64_t share = rate_bytes_per_sec / active;
  return share > 0 ? share : 1;
}

// How long a connection with `queued` bytes still in its socket, paced at
// `pace` bytes/s, surely stays busy: three quarters of the time they take to
// leave, at most 8 s. The caller computes it from the pace in force when the
// check is due, so that a raise brings the check forward; the bound covers a
// pace that is wrong otherwise (an idle connection then holds its share a
// few seconds longer, never for good).
inline int64_t IdleCheckDelayNs(uint64_t queued, uint64_t pace) {
  constexpr int64_t kMaxDelayNs = 8'000'000'000;
  if (pace == 0) return 0;
  const double ns =
      static_cast<double>(queued) * 0.75 * 1e9 / static_cast<double>(pace);
  return ns >= kMaxDelayNs ? kMaxDelayNs : static_cast<int64_t>(ns);
}

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_BUDGET_SHARE_H_
