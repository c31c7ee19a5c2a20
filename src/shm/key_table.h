// The zone's key table: one slot per client key (KeySlotShm), chained from
// hash buckets under the zone's random seed (SipHash-2-4, so that clients
// cannot choose keys that collide), and a free list of the unused slots.
// A key lives while connections refer to it (KeySlotShm::refs, kept by
// ConnTable); the last one's owner frees it.
//
//   ZoneLock lock(zone);
//   const uint32_t key = zone.keys().FindOrInsertLocked(key_bytes, now_ns);
//   if (key == kNoSlot) return;  // full: counted in header().table_full
//
// Thread and process safety: functions ending in Locked need the zone lock
// held (REQUIRES); slot() and BucketOf are safe anywhere. Every index read
// from the zone is checked against the capacity validated at attach, and
// every chain walk is bounded by it. No allocation, no system call.

#ifndef TRAFFICRATE_SRC_SHM_KEY_TABLE_H_
#define TRAFFICRATE_SRC_SHM_KEY_TABLE_H_

#include <cstdint>

#include "src/shm/zone_layout.h"
#include "src/shm/zone_segment.h"

namespace trafficrate {

class KeyTable {
 public:
  // The tables' mapping must outlive the KeyTable.
  explicit KeyTable(const ZoneTables& tables) : t_(tables) {}

  uint32_t capacity() const { return t_.key_capacity; }
  // REQUIRES: index < capacity().
  KeySlotShm& slot(uint32_t index) const { return t_.keys[index]; }

  // Hash bucket of key bytes under this zone's seed.
  uint32_t BucketOf(const uint8_t* key_bytes) const;
  // Returns the key's slot, or kNoSlot.
  uint32_t FindLocked(const uint8_t* key_bytes) const;
  // Returns the key's slot, inserting it (refs 0) if absent; kNoSlot if full.
  uint32_t FindOrInsertLocked(const uint8_t* key_bytes, int64_t now_ns);
  // Frees the key if it is in use and no connection refers to it (refs 0).
  void ReleaseIfUnusedLocked(uint32_t key_index);

 private:
  void UnlinkLocked(uint32_t key_index);
  void FreeLocked(uint32_t key_index);

  const ZoneTables t_;
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_SHM_KEY_TABLE_H_
