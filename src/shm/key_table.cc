#include "src/shm/key_table.h"

#include <cstring>

#include "src/base/siphash.h"
#include "src/budget/budget.h"
#include "src/net/key.h"
#include "src/shm/key_budget.h"

namespace trafficrate {

uint32_t KeyTable::BucketOf(const uint8_t* key_bytes) const {
  const SipKey seed{t_.header->hash_seed[0], t_.header->hash_seed[1]};
  return static_cast<uint32_t>(SipHash24(seed, key_bytes, kKeyBytes)) &
         (t_.bucket_count - 1);
}

uint32_t KeyTable::FindLocked(const uint8_t* key_bytes) const {
  uint32_t i = t_.buckets[BucketOf(key_bytes)];
  for (uint32_t steps = 0; i < capacity() && steps < capacity(); ++steps) {
    if (std::memcmp(t_.keys[i].key, key_bytes, kKeyBytes) == 0) return i;
    i = t_.keys[i].next;
  }
  return kNoSlot;
}

uint32_t KeyTable::FindOrInsertLocked(const uint8_t* key_bytes,
                                      int64_t now_ns) {
  const uint32_t found = FindLocked(key_bytes);
  if (found != kNoSlot) return found;
  ZoneHeaderShm& h = *t_.header;
  const uint32_t i = h.key_free_head;
  if (i >= capacity()) {
    h.table_full.fetch_add(1, std::memory_order_relaxed);
    return kNoSlot;
  }
  KeySlotShm& k = t_.keys[i];
  h.key_free_head = k.next;
  StoreBytesRelaxed(k.key, key_bytes, kKeyBytes);
  k.refs.store(0, std::memory_order_relaxed);
  k.active.store(0, std::memory_order_relaxed);
  k.bytes_closed.store(0, std::memory_order_relaxed);
  k.last_active_ns.store(now_ns, std::memory_order_relaxed);
  k.connections_served.store(0, std::memory_order_relaxed);
  k.sent_bytes.store(0, std::memory_order_relaxed);
  k.lease.store(0, std::memory_order_relaxed);
  ClearUnderPace(k);
  k.start_pending.store(0, std::memory_order_relaxed);
  StoreBudget(k, BudgetState());
  const uint32_t bucket = BucketOf(key_bytes);
  k.next = t_.buckets[bucket];
  k.in_use.store(1, std::memory_order_release);
  t_.buckets[bucket] = i;
  ++h.keys_used;
  return i;
}

void KeyTable::ReleaseIfUnusedLocked(uint32_t key_index) {
  if (key_index >= capacity()) return;
  KeySlotShm& k = t_.keys[key_index];
  if (!k.in_use.load(std::memory_order_relaxed) ||
      k.refs.load(std::memory_order_relaxed) != 0) {
    return;
  }
  UnlinkLocked(key_index);
  FreeLocked(key_index);
}

void KeyTable::UnlinkLocked(uint32_t key_index) {
  uint32_t* link = &t_.buckets[BucketOf(t_.keys[key_index].key)];
  for (uint32_t steps = 0; *link < capacity() && steps < capacity(); ++steps) {
    if (*link == key_index) {
      *link = t_.keys[key_index].next;
      return;
    }
    link = &t_.keys[*link].next;
  }
}

void KeyTable::FreeLocked(uint32_t key_index) {
  ZoneHeaderShm& h = *t_.header;
  KeySlotShm& k = t_.keys[key_index];
  k.in_use.store(0, std::memory_order_release);
  k.refs.store(0, std::memory_order_relaxed);
  k.active.store(0, std::memory_order_relaxed);
  ClearUnderPace(k);
  k.generation.fetch_add(1, std::memory_order_release);
  static constexpr uint8_t kZeros[kKeyBytes] = {};
  StoreBytesRelaxed(k.key, kZeros, kKeyBytes);
  k.next = h.key_free_head;
  h.key_free_head = key_index;
  if (h.keys_used > 0) --h.keys_used;
}

}  // namespace trafficrate
