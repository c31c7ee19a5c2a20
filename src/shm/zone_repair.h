// Repair after a dead holder: when a process died holding the zone lock
// (EOWNERDEAD), anything it was writing may be half-written. The next taker
// rebuilds, before anyone else sees the tables, everything that can be
// derived from the connection slots (written in full before they are
// published, ConnTable): each key's counts, the hash chains, both free
// lists, each process's count and the count of pending handoffs. Every
// key's generation moves, so every watcher re-applies its shares
// (ZoneLock wakes them after unlocking).
//
// Thread and process safety: REQUIRES the zone lock, taken over from a dead
// owner. A walk over every slot of every table; no allocation, no system
// call.

#ifndef TRAFFICRATE_SRC_SHM_ZONE_REPAIR_H_
#define TRAFFICRATE_SRC_SHM_ZONE_REPAIR_H_

#include "src/shm/key_table.h"
#include "src/shm/zone_segment.h"

namespace trafficrate {

// Rebuilds keys, chains and free lists from the connection slots of
// `tables`, whose keys `keys` hashes; counts the repair in
// header().lock_repairs.
void RepairZoneLocked(const ZoneTables& tables, const KeyTable& keys);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_SHM_ZONE_REPAIR_H_
