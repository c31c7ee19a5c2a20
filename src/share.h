// The share math: what one connection of a key may send.

#ifndef TRAFFICRATE_SRC_SHARE_H_
#define TRAFFICRATE_SRC_SHARE_H_

#include <cstdint>

namespace trafficrate {

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

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_SHARE_H_
