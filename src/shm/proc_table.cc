#include "src/shm/proc_table.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>

#include "src/base/clock.h"

namespace trafficrate {

uint32_t ProcTable::ClaimLocked(int32_t pid, int64_t now_ns,
                                HeldMutex* liveness, uint32_t* conns_reaped) {
  uint32_t reaped = 0;
  const uint32_t high_water = std::min(
      t_.header->procs_high_water.load(std::memory_order_relaxed), capacity());
  for (uint32_t i = 0; i < high_water; ++i) {
    const ProcSlotShm& p = t_.procs[i];
    uint32_t conns = 0;
    // The kernel marks a robust mutex owner-died when its owner exits or
    // execs (a slot whose owner let it go on purpose is left alone here).
    const bool owner_died = MutexOwnerDied(p.liveness);
    if (p.state.load(std::memory_order_relaxed) == kProcLive &&
        p.pid.load(std::memory_order_relaxed) == pid && owner_died &&
        ReapIfDeadLocked(i, &conns)) {
      reaped += conns;
    }
  }
  uint32_t slot = ClaimFreeLocked(pid, now_ns, liveness);
  for (uint32_t i = 0; slot == kNoSlot && i < capacity(); ++i) {
    uint32_t conns = 0;
    if (t_.procs[i].state.load(std::memory_order_relaxed) == kProcLive &&
        MaybeDead(t_.procs[i]) && ReapIfDeadLocked(i, &conns)) {
      reaped += conns;
      slot = ClaimFreeLocked(pid, now_ns, liveness);
    }
  }
  if (conns_reaped != nullptr) *conns_reaped = reaped;
  if (slot == kNoSlot) {
    t_.header->table_full.fetch_add(1, std::memory_order_relaxed);
  }
  return slot;
}

uint32_t ProcTable::ClaimFreeLocked(int32_t pid, int64_t now_ns,
                                    HeldMutex* liveness) {
  for (uint32_t i = 0; i < capacity(); ++i) {
    ProcSlotShm& p = t_.procs[i];
    if (p.state.load(std::memory_order_relaxed) != kProcFree) continue;
    int rc = pthread_mutex_trylock(&p.liveness);
    if (rc == EOWNERDEAD) {
      // A reaper died between freeing the slot and unlocking it.
      pthread_mutex_consistent(&p.liveness);
      rc = 0;
    }
    if (rc != 0) continue;
    if (liveness != nullptr) liveness->Hold(&p.liveness, t_.base, t_.size);
    p.pid.store(pid, std::memory_order_relaxed);
    p.conns.store(0, std::memory_order_relaxed);
    p.watcher_cpu.store(0, std::memory_order_relaxed);
    p.watcher_stretch.store(0, std::memory_order_relaxed);
    p.watcher_due_ms.store(0, std::memory_order_relaxed);
    p.started_ns = now_ns;
    p.uid.store(static_cast<uint32_t>(geteuid()), std::memory_order_relaxed);
    p.rules_seen.store(0, std::memory_order_relaxed);
    p.rules_status.store(kReloadNone, std::memory_order_relaxed);
    p.rules_errno.store(0, std::memory_order_relaxed);
    p.shaped_calls.store(0, std::memory_order_relaxed);
    p.shaper_syscalls.store(0, std::memory_order_relaxed);
    p.shaped_pieces.store(0, std::memory_order_relaxed);
    p.state.store(kProcLive, std::memory_order_release);
    if (t_.header->procs_high_water.load(std::memory_order_relaxed) <= i) {
      t_.header->procs_high_water.store(i + 1, std::memory_order_release);
    }
    return i;
  }
  return kNoSlot;
}

int64_t ProcTable::LatestWatcherLateNs(int64_t now_ns,
                                       int64_t max_late_ns) const {
  const uint32_t high_water = std::min(
      t_.header->procs_high_water.load(std::memory_order_relaxed), capacity());
  const uint32_t now_ms = static_cast<uint32_t>(now_ns / kNsPerMs);
  int64_t latest = 0;
  for (uint32_t i = 0; i < high_water; ++i) {
    const ProcSlotShm& p = t_.procs[i];
    const uint32_t due_ms = p.watcher_due_ms.load(std::memory_order_relaxed);
    if (due_ms == 0 || p.state.load(std::memory_order_relaxed) != kProcLive ||
        p.conns.load(std::memory_order_relaxed) == 0) {
      continue;
    }
    // Milliseconds wrap every 49 days; their difference does not.
    const int64_t late_ns =
        int64_t{static_cast<int32_t>(now_ms - due_ms)} * kNsPerMs;
    if (late_ns > latest && late_ns <= max_late_ns) latest = late_ns;
  }
  return latest;
}

bool ProcTable::ReapIfDeadLocked(uint32_t proc_index, uint32_t* conns_reaped) {
  if (proc_index >= capacity()) return false;
  ProcSlotShm& p = t_.procs[proc_index];
  if (p.state.load(std::memory_order_relaxed) != kProcLive) return false;
  const int rc = pthread_mutex_trylock(&p.liveness);
  if (rc == EBUSY) return false;  // its watcher holds it: alive
  if (rc == 0) {
    // Held by nobody while marked live: the owner unlocked it on purpose
    // (never done) or a claim was torn. Treat as dead.
  } else if (rc != EOWNERDEAD) {
    return false;
  }
  if (rc == EOWNERDEAD) pthread_mutex_consistent(&p.liveness);
  HeldMutex held;
  held.Hold(&p.liveness, t_.base, t_.size);
  uint32_t reaped = 0;
  for (uint32_t i = 0; i < t_.conn_capacity; ++i) {
    ConnSlotShm& c = t_.conns[i];
    if ((c.seq.load(std::memory_order_relaxed) & 1) &&
        c.proc_index.load(std::memory_order_relaxed) == proc_index) {
      conns_->DeregisterLocked(i);
      ++reaped;
    }
  }
  // Its sockets passed and not yet received: their connections are gone.
  handoffs_->ClearProcLocked(proc_index);
  p.pid.store(0, std::memory_order_relaxed);
  p.conns.store(0, std::memory_order_relaxed);
  p.state.store(kProcFree, std::memory_order_release);
  if (!held.Release())
    segment_->MarkCorrupt("a process slot's mutex changed while held");
  t_.header->procs_reaped.fetch_add(1, std::memory_order_relaxed);
  t_.header->conns_reaped.fetch_add(reaped, std::memory_order_relaxed);
  if (conns_reaped != nullptr) *conns_reaped = reaped;
  return true;
}

bool ProcTable::MaybeDead(const ProcSlotShm& proc) {
  // glibc keeps the owner's TID in the low bits of __lock and sets
  // FUTEX_OWNER_DIED when the kernel releases a dead owner's robust mutex.
  const int word =
      __atomic_load_n(&proc.liveness.__data.__lock, __ATOMIC_ACQUIRE);
  return (word & FUTEX_OWNER_DIED) != 0 || (word & FUTEX_TID_MASK) == 0;
}

uint32_t ProcTable::NextReapScanLimit() {
  // Only the slots ever claimed, but all of them now and then: a process of
  // an older version claims slots without raising the high water.
  uint32_t limit = capacity();
  const uint32_t high_water =
      t_.header->procs_high_water.load(std::memory_order_acquire);
  if (high_water != 0 && high_water < limit &&
      reap_passes_.fetch_add(1, std::memory_order_relaxed) % kFullReapEvery !=
          0) {
    limit = high_water;
  }
  return limit;
}

}  // namespace trafficrate
