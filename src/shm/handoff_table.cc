#include "src/shm/handoff_table.h"

#include "src/base/clock.h"
#include "src/shm/conn_table.h"

namespace trafficrate {
namespace {

// A handoff this old (or dated this far ahead) is free for another: its
// sender's watcher expires its own after 2 s.
constexpr int64_t kHandoffStaleNs = 10 * kNsPerSec;

}  // namespace

void HandoffTable::ClearLocked(uint32_t index) {
  HandoffSlotShm& slot = t_.handoffs[index];
  const uint32_t conn = slot.conn.load(std::memory_order_relaxed);
  if (conn < t_.conn_capacity &&
      t_.conns[conn].handoff.load(std::memory_order_relaxed) == index + 1) {
    t_.conns[conn].handoff.store(0, std::memory_order_relaxed);
  }
  if (slot.inode.load(std::memory_order_relaxed) != 0) {
    const uint32_t pending =
        t_.header->handoffs_pending.load(std::memory_order_relaxed);
    t_.header->handoffs_pending.store(pending > 0 ? pending - 1 : 0,
                                      std::memory_order_relaxed);
  }
  slot.inode.store(0, std::memory_order_relaxed);
  slot.conn.store(kNoSlot, std::memory_order_relaxed);
  slot.cookie.store(0, std::memory_order_relaxed);
  slot.proc.store(kNoSlot, std::memory_order_relaxed);
  slot.since_ns.store(0, std::memory_order_relaxed);
}

bool HandoffTable::PublishLocked(uint64_t inode, uint32_t conn, uint32_t cookie,
                                 uint32_t proc, int64_t now_ns) {
  if (inode == 0 || conn >= t_.conn_capacity) return false;
  uint32_t free_slot = kNoSlot;
  for (uint32_t i = 0; i < capacity(); ++i) {
    HandoffSlotShm& slot = t_.handoffs[i];
    const uint64_t held = slot.inode.load(std::memory_order_relaxed);
    if (held == inode) {  // passed again (to another process, or onward)
      free_slot = i;
      break;
    }
    // Free, or beyond any use: no process of the zone would ever clear it
    // (its sender expires its own after kHandoffStaleNs at most; anything
    // else was written by something other than this library).
    const int64_t since = slot.since_ns.load(std::memory_order_relaxed);
    const bool stale =
        held == 0 ||
        slot.proc.load(std::memory_order_relaxed) >= t_.proc_capacity ||
        slot.conn.load(std::memory_order_relaxed) >= t_.conn_capacity ||
        since > now_ns + kHandoffStaleNs || since < now_ns - kHandoffStaleNs;
    if (stale && free_slot == kNoSlot) free_slot = i;
  }
  if (free_slot == kNoSlot) return false;
  ClearLocked(free_slot);
  HandoffSlotShm& slot = t_.handoffs[free_slot];
  slot.conn.store(conn, std::memory_order_relaxed);
  slot.cookie.store(cookie, std::memory_order_relaxed);
  slot.proc.store(proc, std::memory_order_relaxed);
  slot.since_ns.store(now_ns, std::memory_order_relaxed);
  // A connection passed on before it was received keeps only its newest
  // handoff.
  const uint32_t before =
      t_.conns[conn].handoff.load(std::memory_order_relaxed);
  if (before != 0 && before - 1 < capacity() && before - 1 != free_slot &&
      t_.handoffs[before - 1].conn.load(std::memory_order_relaxed) == conn) {
    ClearLocked(before - 1);
  }
  t_.conns[conn].handoff.store(free_slot + 1, std::memory_order_relaxed);
  t_.header->handoffs_pending.fetch_add(1, std::memory_order_relaxed);
  slot.inode.store(inode, std::memory_order_release);
  return true;
}

uint32_t HandoffTable::TakeLocked(uint64_t inode, uint32_t* cookie) {
  if (inode == 0) return kNoSlot;
  for (uint32_t i = 0; i < capacity(); ++i) {
    HandoffSlotShm& slot = t_.handoffs[i];
    if (slot.inode.load(std::memory_order_relaxed) != inode) continue;
    const uint32_t conn = slot.conn.load(std::memory_order_relaxed);
    const uint32_t passed = slot.cookie.load(std::memory_order_relaxed);
    ClearLocked(i);
    if (conn >= t_.conn_capacity) return kNoSlot;
    const uint32_t seq = t_.conns[conn].seq.load(std::memory_order_relaxed);
    // Ended meanwhile (reaped, or expired by its sender): nothing to take.
    if ((seq & 1) == 0 || ConnTable::CookieOf(seq) != passed) return kNoSlot;
    *cookie = passed;
    return conn;
  }
  return kNoSlot;
}

void HandoffTable::WithdrawLocked(uint64_t inode, uint32_t proc) {
  for (uint32_t i = 0; i < capacity(); ++i) {
    const HandoffSlotShm& slot = t_.handoffs[i];
    if (inode != 0 && slot.inode.load(std::memory_order_relaxed) == inode &&
        slot.proc.load(std::memory_order_relaxed) == proc) {
      ClearLocked(i);
    }
  }
}

bool HandoffTable::PendingLocked(uint32_t conn, uint32_t cookie) const {
  return MayBeHandedOff(conn, cookie);
}

uint32_t HandoffTable::ExpireLocked(uint32_t proc, int64_t before_ns,
                                    uint64_t* out, uint32_t max) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < capacity() && n < max; ++i) {
    const HandoffSlotShm& slot = t_.handoffs[i];
    if (slot.inode.load(std::memory_order_relaxed) == 0 ||
        slot.proc.load(std::memory_order_relaxed) != proc ||
        slot.since_ns.load(std::memory_order_relaxed) >= before_ns) {
      continue;
    }
    out[n++] = ConnRef::Of(slot.conn.load(std::memory_order_relaxed),
                           slot.cookie.load(std::memory_order_relaxed))
                   .word();
    ClearLocked(i);
  }
  return n;
}

void HandoffTable::ClearProcLocked(uint32_t proc) {
  for (uint32_t i = 0; i < capacity(); ++i) {
    if (t_.handoffs[i].proc.load(std::memory_order_relaxed) == proc) {
      ClearLocked(i);
    }
  }
}

bool HandoffTable::AnyPending() const {
  return t_.header->handoffs_pending.load(std::memory_order_acquire) != 0;
}

bool HandoffTable::MayHave(uint64_t inode) const {
  if (inode == 0 || !AnyPending()) return false;
  for (uint32_t i = 0; i < capacity(); ++i) {
    if (t_.handoffs[i].inode.load(std::memory_order_acquire) == inode) {
      return true;
    }
  }
  return false;
}

bool HandoffTable::HasOld(uint32_t proc, int64_t before_ns) const {
  if (!AnyPending()) return false;
  for (uint32_t i = 0; i < capacity(); ++i) {
    const HandoffSlotShm& slot = t_.handoffs[i];
    if (slot.inode.load(std::memory_order_relaxed) != 0 &&
        slot.proc.load(std::memory_order_relaxed) == proc &&
        slot.since_ns.load(std::memory_order_relaxed) < before_ns) {
      return true;
    }
  }
  return false;
}

bool HandoffTable::MayBeHandedOff(uint32_t conn, uint32_t cookie) const {
  if (conn >= t_.conn_capacity) return false;
  const uint32_t h = t_.conns[conn].handoff.load(std::memory_order_relaxed);
  if (h == 0 || h - 1 >= capacity()) return false;
  const HandoffSlotShm& slot = t_.handoffs[h - 1];
  return slot.inode.load(std::memory_order_relaxed) != 0 &&
         slot.conn.load(std::memory_order_relaxed) == conn &&
         slot.cookie.load(std::memory_order_relaxed) == cookie;
}

}  // namespace trafficrate
