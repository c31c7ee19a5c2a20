// The zone's handoff table (HandoffSlotShm): sockets passed between
// processes of the zone. A sender publishes a governed connection before the
// socket leaves it (SCM_RIGHTS); the receiver takes it over by the socket's
// inode; a send that failed withdraws it; the sender's watcher expires what
// nobody took. A connection slot names its handoff (ConnSlotShm::handoff),
// and the header counts the pending ones (handoffs_pending), which lets the
// lock-free peeks skip the table when nothing is pending.
//
//   {
//     ZoneLock lock(zone);
//     if (!zone.handoffs().PublishLocked(inode, conn, cookie, proc, now_ns))
//       ...  // every slot holds another pending handoff
//   }
//   sendmsg(...);  // after unlocking
//
// Thread and process safety: functions ending in Locked need the zone lock
// held (REQUIRES); the peeks are lock-free. Every index is checked against
// the capacities validated at attach; every walk is bounded. No allocation,
// no system call.

#ifndef TRAFFICRATE_SRC_SHM_HANDOFF_TABLE_H_
#define TRAFFICRATE_SRC_SHM_HANDOFF_TABLE_H_

#include <cstdint>

#include "src/shm/zone_layout.h"
#include "src/shm/zone_segment.h"

namespace trafficrate {

class HandoffTable {
 public:
  // The tables' mapping must outlive the HandoffTable.
  explicit HandoffTable(const ZoneTables& tables) : t_(tables) {}

  uint32_t capacity() const { return t_.handoff_capacity; }
  // REQUIRES: index < capacity().
  HandoffSlotShm& slot(uint32_t index) const { return t_.handoffs[index]; }

  // Notes that proc passes connection conn (cookie), whose socket has
  // `inode`; false if every slot holds another pending handoff.
  bool PublishLocked(uint64_t inode, uint32_t conn, uint32_t cookie,
                     uint32_t proc, int64_t now_ns);
  // Takes the handoff of socket `inode`: its connection slot (and *cookie),
  // if that connection is still the one passed; else kNoSlot.
  uint32_t TakeLocked(uint64_t inode, uint32_t* cookie);
  // Withdraws proc's handoff of `inode` (the send failed).
  void WithdrawLocked(uint64_t inode, uint32_t proc);
  // Whether connection conn (cookie) is passed and not yet received.
  bool PendingLocked(uint32_t conn, uint32_t cookie) const;
  // Removes up to `max` of proc's handoffs made before before_ns, storing
  // each as a ConnRef word (conn_table.h) in out (the rest stay for another
  // call).
  // Returns how many it removed.
  uint32_t ExpireLocked(uint32_t proc, int64_t before_ns, uint64_t* out,
                        uint32_t max);
  // Frees every handoff of proc (a dead process's: their connections are
  // gone).
  void ClearProcLocked(uint32_t proc);

  // Lock-free peeks: whether any handoff is pending at all (a bound that
  // skips the others); whether a handoff of `inode` may be waiting; whether
  // proc has one made before before_ns; whether conn (cookie) may be passed.
  bool AnyPending() const;
  bool MayHave(uint64_t inode) const;
  bool HasOld(uint32_t proc, int64_t before_ns) const;
  bool MayBeHandedOff(uint32_t conn, uint32_t cookie) const;

 private:
  // Frees slot `index` (and its connection's mark of it).
  void ClearLocked(uint32_t index);

  const ZoneTables t_;
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_SHM_HANDOFF_TABLE_H_
