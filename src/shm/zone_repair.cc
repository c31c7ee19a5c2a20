#include "src/shm/zone_repair.h"

#include <cstdint>

#include "src/shm/key_budget.h"
#include "src/shm/zone_layout.h"

namespace trafficrate {
namespace {

// Keys: recount refs and active from the connections, which are written
// before they are published; drop half-built connections.
void RecountFromConnsLocked(const ZoneTables& t) {
  ZoneHeaderShm& h = *t.header;
  for (uint32_t i = 0; i < t.key_capacity; ++i) {
    t.keys[i].refs.store(0, std::memory_order_relaxed);
    t.keys[i].active.store(0, std::memory_order_relaxed);
    ClearUnderPace(t.keys[i]);
  }
  for (uint32_t i = 0; i < t.proc_capacity; ++i) {
    t.procs[i].conns.store(0, std::memory_order_relaxed);
  }
  h.conn_free_head = kNoSlot;
  h.conns_used = 0;
  for (uint32_t n = t.conn_capacity; n-- > 0;) {
    ConnSlotShm& c = t.conns[n];
    const uint32_t k = c.key_index.load(std::memory_order_relaxed);
    const uint32_t p = c.proc_index.load(std::memory_order_relaxed);
    const bool in_use = c.seq.load(std::memory_order_relaxed) & 1;
    if (in_use && k < t.key_capacity && t.keys[k].in_use.load() &&
        p < t.proc_capacity) {
      t.keys[k].refs.fetch_add(1, std::memory_order_relaxed);
      if (c.active.load(std::memory_order_relaxed)) {
        t.keys[k].active.fetch_add(1, std::memory_order_relaxed);
        if (c.under_pace.load(std::memory_order_relaxed) &&
            !AddUnderPace(t.keys[k])) {
          c.under_pace.store(0, std::memory_order_relaxed);
        }
      } else {
        c.under_pace.store(0, std::memory_order_relaxed);
      }
      t.procs[p].conns.fetch_add(1, std::memory_order_relaxed);
      ++h.conns_used;
      continue;
    }
    if (in_use) c.seq.fetch_add(1, std::memory_order_release);
    c.active.store(0, std::memory_order_relaxed);
    c.under_pace.store(0, std::memory_order_relaxed);
    c.key_index.store(kNoSlot, std::memory_order_relaxed);
    c.proc_index.store(kNoSlot, std::memory_order_relaxed);
    c.next_free = h.conn_free_head;
    h.conn_free_head = n;
  }
}

// Chains and the key free list, rebuilt from the keys still referenced.
void RelinkKeysLocked(const ZoneTables& t, const KeyTable& keys) {
  ZoneHeaderShm& h = *t.header;
  for (uint32_t b = 0; b < t.bucket_count; ++b) t.buckets[b] = kNoSlot;
  h.key_free_head = kNoSlot;
  h.keys_used = 0;
  for (uint32_t n = t.key_capacity; n-- > 0;) {
    KeySlotShm& k = t.keys[n];
    k.generation.fetch_add(1, std::memory_order_release);
    if (k.in_use.load() && k.refs.load() > 0) {
      const uint32_t bucket = keys.BucketOf(k.key);
      k.next = t.buckets[bucket];
      t.buckets[bucket] = n;
      ++h.keys_used;
      continue;
    }
    k.in_use.store(0);
    k.refs.store(0);
    k.next = h.key_free_head;
    h.key_free_head = n;
  }
}

}  // namespace

void RepairZoneLocked(const ZoneTables& tables, const KeyTable& keys) {
  RecountFromConnsLocked(tables);
  RelinkKeysLocked(tables, keys);
  uint32_t pending = 0;
  for (uint32_t i = 0; i < tables.handoff_capacity; ++i) {
    pending += tables.handoffs[i].inode.load(std::memory_order_relaxed) != 0;
  }
  tables.header->handoffs_pending.store(pending, std::memory_order_relaxed);
  tables.header->lock_repairs.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace trafficrate
