// SipHash-2-4: a keyed hash, so that clients cannot choose addresses that
// collide in the zone's key table (the key is a random seed stored in the
// zone header).
//
//   uint64_t h = SipHash24(seed, bytes, sizeof(bytes));

#ifndef TRAFFICRATE_SRC_BASE_SIPHASH_H_
#define TRAFFICRATE_SRC_BASE_SIPHASH_H_

#include <cstddef>
#include <cstdint>

namespace trafficrate {

struct SipKey {
  uint64_t k0;
  uint64_t k1;
};

// Hot path: no allocation, errno untouched, async-signal-safe.
uint64_t SipHash24(const SipKey& key, const void* data, size_t len);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_BASE_SIPHASH_H_
