// The zone's process table: one slot per process that owns connections
// (ProcSlotShm), each with a robust liveness mutex that the process's watcher
// thread holds for the life of the process, so that the kernel releases it
// (owner-died) when the process exits, execs or is killed, whatever killed
// it. A dead process's slot is reaped: its connections deregistered, its
// pending handoffs dropped, the slot freed.
//
//   HeldMutex liveness;  // held by this thread from now on
//   uint32_t proc = kNoSlot;
//   {
//     ZoneLock lock(zone);
//     proc = zone.procs().ClaimLocked(getpid(), now_ns, &liveness);
//   }
//
// Zone::ReapDead is the scan that takes the lock per dead process.
//
// Thread and process safety: functions ending in Locked need the zone lock
// held (REQUIRES); the peeks are lock-free and bounded. Every index is
// checked against the capacities validated at attach. No allocation. Only
// the claim and the reaping call into pthread (trylock, consistent, unlock);
// nothing else makes a system call.

#ifndef TRAFFICRATE_SRC_SHM_PROC_TABLE_H_
#define TRAFFICRATE_SRC_SHM_PROC_TABLE_H_

#include <atomic>
#include <cstdint>

#include "src/shm/conn_table.h"
#include "src/shm/handoff_table.h"
#include "src/shm/robust_mutex.h"
#include "src/shm/zone_layout.h"
#include "src/shm/zone_segment.h"

namespace trafficrate {

class ProcTable {
 public:
  // `segment` (whose tables these are), `conns` and `handoffs` must outlive
  // the ProcTable.
  ProcTable(ZoneSegment& segment, ConnTable& conns, HandoffTable& handoffs)
      : t_(segment.tables()),
        segment_(&segment),
        conns_(&conns),
        handoffs_(&handoffs) {}

  uint32_t capacity() const { return t_.proc_capacity; }
  // REQUIRES: index < capacity().
  ProcSlotShm& slot(uint32_t index) const { return t_.procs[index]; }

  // Claims a free process slot for pid and locks its liveness mutex from the
  // calling thread, which must hold it for the life of the process (and
  // release it through *liveness). Reaps first the slots of the same pid
  // whose owner died (this process before an exec: the kernel marked its
  // liveness mutex owner-died then, and this process registers its
  // connections anew) and, if
  // no slot is free, dead slots of other processes until one is: a dead
  // process never keeps a live one from its slot. *conns_reaped (if given)
  // gets the connections those held (the caller wakes the watchers).
  uint32_t ClaimLocked(int32_t pid, int64_t now_ns,
                       HeldMutex* liveness = nullptr,
                       uint32_t* conns_reaped = nullptr);
  // How far past its due time (ProcSlotShm::watcher_due_ms) the latest
  // watcher of a live process that owns connections is, at now_ns; 0 if
  // none is late. One later than max_late_ns is left out: its process is
  // stopped or frozen, not late. A bounded walk, no lock.
  int64_t LatestWatcherLateNs(int64_t now_ns, int64_t max_late_ns) const;
  // If proc_index's owner died (its liveness mutex reports EOWNERDEAD),
  // deregisters everything it owned, frees the slot and returns true.
  bool ReapIfDeadLocked(uint32_t proc_index, uint32_t* conns_reaped);
  // Lock-free peek at a live process's liveness mutex: true if its owner
  // may have died. ReapIfDeadLocked gives the authoritative answer.
  static bool MaybeDead(const ProcSlotShm& proc);

  // A reaping scan (Zone::ReapDead) looks at every process slot once in this
  // many passes (about a minute at the watcher's pass every 250 ms), and
  // only those below the header's procs_high_water in between. A full scan
  // touches every slot (3.3 MB in a 32 MB zone: 3 ms), and each watcher
  // makes its own: at 16 passes, four watchers' scans were 5% of their run
  // time at 10 000 connections (an eighth of their work outside interrupts).
  // Only a slot claimed by a process of an older version can lie above the
  // high water.
  static constexpr uint32_t kFullReapEvery = 256;
  // Counts a reaping pass and returns how many slots, from 0, it scans.
  // Safe from any thread.
  uint32_t NextReapScanLimit();

 private:
  // ClaimLocked's claim of a free slot; kNoSlot if none is free.
  uint32_t ClaimFreeLocked(int32_t pid, int64_t now_ns, HeldMutex* liveness);

  const ZoneTables t_;
  ZoneSegment* segment_;
  ConnTable* conns_;
  HandoffTable* handoffs_;
  // Any thread may reap (the watcher, a test, the CLI).
  std::atomic<uint32_t> reap_passes_{0};
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_SHM_PROC_TABLE_H_
