#include "src/shm/conn_table.h"

#include <cstring>

#include "src/base/clock.h"
#include "src/budget/budget.h"
#include "src/budget/share.h"
#include "src/shm/key_budget.h"

namespace trafficrate {

uint32_t ConnTable::FindLocked(uint32_t key_index, const uint8_t peer[16],
                               uint16_t peer_port) const {
  if (key_index >= t_.key_capacity) return kNoSlot;
  uint32_t left = t_.keys[key_index].refs.load(std::memory_order_relaxed);
  for (uint32_t i = 0; i < capacity() && left > 0; ++i) {
    const ConnSlotShm& c = t_.conns[i];
    if ((c.seq.load(std::memory_order_relaxed) & 1) == 0 ||
        c.key_index.load(std::memory_order_relaxed) != key_index) {
      continue;
    }
    --left;
    if (__atomic_load_n(&c.peer_port, __ATOMIC_RELAXED) == peer_port &&
        std::memcmp(c.peer, peer, sizeof(c.peer)) == 0) {
      return i;
    }
  }
  return kNoSlot;
}

uint32_t ConnTable::RegisterLocked(uint32_t key_index, uint32_t proc_index,
                                   int fd, const uint8_t peer[16],
                                   uint16_t peer_port) {
  const uint32_t i = t_.header->conn_free_head;
  if (i >= capacity() || key_index >= t_.key_capacity ||
      proc_index >= t_.proc_capacity) {
    t_.header->table_full.fetch_add(1, std::memory_order_relaxed);
    return kNoSlot;
  }
  ConnSlotShm& c = t_.conns[i];
  t_.header->conn_free_head = c.next_free;
  c.next_free = kNoSlot;
  c.key_index.store(key_index, std::memory_order_relaxed);
  c.proc_index.store(proc_index, std::memory_order_relaxed);
  c.fd.store(fd, std::memory_order_relaxed);
  c.active.store(0, std::memory_order_relaxed);
  c.share_bytes_per_sec.store(0, std::memory_order_relaxed);
  c.bytes_sent.store(0, std::memory_order_relaxed);
  c.bytes_left.store(0, std::memory_order_relaxed);
  c.drain_bytes.store(0, std::memory_order_relaxed);
  c.under_pace.store(0, std::memory_order_relaxed);
  StoreBytesRelaxed(c.peer, peer, sizeof(c.peer));
  __atomic_store_n(&c.peer_port, peer_port, __ATOMIC_RELAXED);
  // Odd: in use. The release store publishes the fields above.
  c.seq.store(c.seq.load(std::memory_order_relaxed) | 1u,
              std::memory_order_release);
  t_.keys[key_index].refs.fetch_add(1, std::memory_order_relaxed);
  t_.keys[key_index].connections_served.fetch_add(1, std::memory_order_relaxed);
  t_.procs[proc_index].conns.fetch_add(1, std::memory_order_relaxed);
  ++t_.header->conns_used;
  return i;
}

ConnSlotShm* ConnTable::InUseLocked(uint32_t conn_index, uint32_t* key) const {
  if (conn_index >= capacity()) return nullptr;
  ConnSlotShm& c = t_.conns[conn_index];
  const uint32_t k = c.key_index.load(std::memory_order_relaxed);
  if ((c.seq.load(std::memory_order_relaxed) & 1) == 0 ||
      k >= t_.key_capacity) {
    return nullptr;
  }
  *key = k;
  return &c;
}

void ConnTable::CountLeft(ConnSlotShm& conn, uint64_t left) const {
  const uint64_t before = conn.bytes_left.load(std::memory_order_relaxed);
  if (left <= before) return;
  conn.bytes_left.store(left, std::memory_order_relaxed);
  const uint32_t k = conn.key_index.load(std::memory_order_relaxed);
  if (k >= keys_->capacity()) return;
  keys_->slot(k).sent_bytes.fetch_add(left - before, std::memory_order_relaxed);
}

void ConnTable::MembershipChangedLocked(KeySlotShm& key) const {
  key.last_active_ns.store(clock_->NowNs(), std::memory_order_relaxed);
  key.generation.fetch_add(1, std::memory_order_release);
}

bool ConnTable::JoinLocked(uint32_t conn_index) {
  uint32_t k = kNoSlot;
  ConnSlotShm* const slot = InUseLocked(conn_index, &k);
  if (slot == nullptr || slot->active.load(std::memory_order_relaxed)) {
    return false;
  }
  ConnSlotShm& c = *slot;
  c.active.store(1, std::memory_order_relaxed);
  if (c.bytes_sent.load(std::memory_order_relaxed) == 0 &&
      settings_->share_mode() == ShareMode::kBudget) {
    // New: its first segments leave unpaced (BudgetInput).
    t_.keys[k].start_pending.fetch_add(kUnpacedStartBytes,
                                       std::memory_order_relaxed);
  }
  const uint32_t before =
      t_.keys[k].active.fetch_add(1, std::memory_order_relaxed);
  AdjustLevelLocked(t_.keys[k], before, before + 1);
  MembershipChangedLocked(t_.keys[k]);
  return true;
}

bool ConnTable::LeaveLocked(uint32_t conn_index) {
  uint32_t k = kNoSlot;
  ConnSlotShm* const slot = InUseLocked(conn_index, &k);
  if (slot == nullptr) return false;
  ConnSlotShm& c = *slot;
  DropUnderPace(c);
  if (!c.active.load(std::memory_order_relaxed)) return false;
  c.active.store(0, std::memory_order_relaxed);
  const uint32_t before = t_.keys[k].active.load(std::memory_order_relaxed);
  if (before > 0) {
    t_.keys[k].active.fetch_sub(1, std::memory_order_relaxed);
    AdjustLevelLocked(t_.keys[k], before, before - 1);
  }
  MembershipChangedLocked(t_.keys[k]);
  return true;
}

bool ConnTable::DeregisterLocked(uint32_t conn_index) {
  if (conn_index >= capacity()) return false;
  ConnSlotShm& c = t_.conns[conn_index];
  if ((c.seq.load(std::memory_order_relaxed) & 1) == 0) return false;
  const bool changed = LeaveLocked(conn_index);
  const uint32_t k = c.key_index.load(std::memory_order_relaxed);
  const uint32_t p = c.proc_index.load(std::memory_order_relaxed);
  if (k < t_.key_capacity) {
    t_.keys[k].bytes_closed.fetch_add(
        c.bytes_sent.load(std::memory_order_relaxed),
        std::memory_order_relaxed);
    if (t_.keys[k].refs.load(std::memory_order_relaxed) > 0) {
      t_.keys[k].refs.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  if (p < t_.proc_capacity &&
      t_.procs[p].conns.load(std::memory_order_relaxed) > 0) {
    t_.procs[p].conns.fetch_sub(1, std::memory_order_relaxed);
  }
  // Even: free. Any fd entry holding the old cookie now sees it is stale.
  c.seq.fetch_add(1, std::memory_order_release);
  c.key_index.store(kNoSlot, std::memory_order_relaxed);
  c.proc_index.store(kNoSlot, std::memory_order_relaxed);
  c.active.store(0, std::memory_order_relaxed);
  c.next_free = t_.header->conn_free_head;
  t_.header->conn_free_head = conn_index;
  if (t_.header->conns_used > 0) --t_.header->conns_used;
  keys_->ReleaseIfUnusedLocked(k);
  return changed;
}

void ConnTable::TransferLocked(uint32_t conn_index, uint32_t proc_index,
                               int fd) {
  if (conn_index >= capacity() || proc_index >= t_.proc_capacity) return;
  ConnSlotShm& c = t_.conns[conn_index];
  const uint32_t old = c.proc_index.load(std::memory_order_relaxed);
  if (old == proc_index) return;
  if (old < t_.proc_capacity &&
      t_.procs[old].conns.load(std::memory_order_relaxed) > 0) {
    t_.procs[old].conns.fetch_sub(1, std::memory_order_relaxed);
  }
  t_.procs[proc_index].conns.fetch_add(1, std::memory_order_relaxed);
  c.proc_index.store(proc_index, std::memory_order_relaxed);
  c.fd.store(fd, std::memory_order_relaxed);
}

void ConnTable::SetUnderPace(uint32_t conn_index, bool under) {
  if (conn_index >= capacity()) return;
  ConnSlotShm& c = t_.conns[conn_index];
  const uint32_t k = c.key_index.load(std::memory_order_relaxed);
  if (k >= t_.key_capacity) return;
  if (!under) {
    DropUnderPace(c);
    return;
  }
  if (!c.active.load(std::memory_order_relaxed) ||
      c.under_pace.load(std::memory_order_relaxed) != 0 ||
      !AddUnderPace(t_.keys[k])) {
    return;
  }
  c.under_pace.store(1, std::memory_order_relaxed);
}

void ConnTable::DropUnderPace(ConnSlotShm& conn) {
  if (conn.under_pace.exchange(0, std::memory_order_relaxed) == 0) return;
  const uint32_t k = conn.key_index.load(std::memory_order_relaxed);
  if (k < t_.key_capacity) trafficrate::DropUnderPace(t_.keys[k]);
}

void ConnTable::AdjustLevelLocked(KeySlotShm& key, uint32_t before,
                                  uint32_t after) {
  if (settings_->share_mode() != ShareMode::kBudget) return;
  const BudgetState next = BudgetMembershipChange(
      LoadBudget(key), settings_->key_budget_settings(key), before, after);
  key.boost.store(next.boost, std::memory_order_relaxed);
  key.level_bytes_per_sec.store(next.level_bytes_per_sec,
                                std::memory_order_relaxed);
}

}  // namespace trafficrate
