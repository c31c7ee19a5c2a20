// The zone's connection table: one slot per governed connection
// (ConnSlotShm), owned by one process, referring to its key and counted in
// it (KeySlotShm::refs; ::active while it sends). The connection slots are
// the truth the keys' counts are rebuilt from (zone_repair.h). A slot's seq
// is odd while it is in use and moves on every free, so an fd entry that
// keeps the cookie of its slot (CookieOf) sees when the slot was reused.
//
//   uint32_t conn = kNoSlot;
//   bool changed = false;
//   {
//     ZoneLock lock(zone);
//     conn = zone.conns().RegisterLocked(key, proc, fd, peer, peer_port);
//     changed = conn != kNoSlot && zone.conns().JoinLocked(conn);
//   }
//   if (changed) zone.changes().WakeWatchers();  // after unlocking
//
// Join and leave bump the key's generation, and in budget mode set its level
// at once (BudgetMembershipChange) rather than at the next tick.
//
// Thread and process safety: functions ending in Locked need the zone lock
// held (REQUIRES); the rest are lock-free. Every index passed in or read from
// the zone is checked against the capacities validated at attach. No
// allocation, no system call: the hot path's.

#ifndef TRAFFICRATE_SRC_SHM_CONN_TABLE_H_
#define TRAFFICRATE_SRC_SHM_CONN_TABLE_H_

#include <cstdint>
#include <type_traits>

#include "src/base/clock.h"
#include "src/shm/key_table.h"
#include "src/shm/zone_layout.h"
#include "src/shm/zone_segment.h"
#include "src/shm/zone_settings.h"

namespace trafficrate {

// One registration of a connection slot, as a word: the slot's index in the
// high half, and the slot's cookie (ConnTable::CookieOf) when it was
// registered in the low half. HandoffTable::ExpireLocked hands back the
// handoffs it expires so, and a Governor's drain slot holds one (0: free;
// a slot in use has an odd seq, so a live registration's word is never 0).
//
//   const ConnRef ref = ConnRef::From(word);
//   if (ref.conn() < conns.capacity() &&
//       ConnTable::CookieOf(conns.slot(ref.conn()).seq.load()) == ref.cookie())
//     ...  // still that registration
//
// Trivially copyable, one uint64_t; constexpr throughout.
class ConnRef {
 public:
  constexpr ConnRef() = default;
  static constexpr ConnRef From(uint64_t word) { return ConnRef(word); }
  static constexpr ConnRef Of(uint32_t conn_index, uint32_t cookie) {
    return ConnRef(uint64_t{conn_index} << 32 | cookie);
  }

  constexpr uint64_t word() const { return word_; }
  constexpr uint32_t conn() const { return static_cast<uint32_t>(word_ >> 32); }
  constexpr uint32_t cookie() const { return static_cast<uint32_t>(word_); }

  friend constexpr bool operator==(ConnRef a, ConnRef b) {
    return a.word_ == b.word_;
  }
  friend constexpr bool operator!=(ConnRef a, ConnRef b) {
    return a.word_ != b.word_;
  }

 private:
  explicit constexpr ConnRef(uint64_t word) : word_(word) {}

  uint64_t word_ = 0;
};
static_assert(std::is_trivially_copyable_v<ConnRef> &&
              sizeof(ConnRef) == sizeof(uint64_t));

class ConnTable {
 public:
  // The tables' mapping, `keys` and `settings` must outlive the ConnTable.
  ConnTable(const ZoneTables& tables, KeyTable& keys,
            const ZoneSettings& settings)
      : t_(tables), keys_(&keys), settings_(&settings) {}

  // Where a join or leave takes its stamp from (Zone::UseClock).
  void UseClock(const Clock* clock) { clock_ = clock; }

  uint32_t capacity() const { return t_.conn_capacity; }
  // REQUIRES: index < capacity().
  ConnSlotShm& slot(uint32_t index) const { return t_.conns[index]; }
  // REQUIRES: conn is one of this zone's connection slots.
  uint32_t IndexOf(const ConnSlotShm& conn) const {
    return static_cast<uint32_t>(&conn - t_.conns);
  }
  // The cookie an fd entry keeps for a connection slot in use.
  static uint32_t CookieOf(uint32_t seq) { return seq & 0x7fffffffu; }

  // The registration of key_index's connection from peer:peer_port, made by
  // another process (the one that accepted a socket an exec'd process
  // inherited); kNoSlot if there is none. Looks at the connection slots in
  // use until it has seen the key's; not for the hot path.
  uint32_t FindLocked(uint32_t key_index, const uint8_t peer[16],
                      uint16_t peer_port) const;
  // Takes a connection slot for key_index owned by proc_index, not active.
  // Returns kNoSlot if the connection table is full. The caller frees an
  // unused key (refs 0) with KeyTable::ReleaseIfUnusedLocked.
  uint32_t RegisterLocked(uint32_t key_index, uint32_t proc_index, int fd,
                          const uint8_t peer[16], uint16_t peer_port);
  // Join/Leave return true when the key's membership changed (generation
  // bumped); the caller wakes watchers after unlocking.
  bool JoinLocked(uint32_t conn_index);
  bool LeaveLocked(uint32_t conn_index);
  // Leaves, then frees the connection, and its key once unused.
  bool DeregisterLocked(uint32_t conn_index);
  // Gives the connection to proc_index, as its fd there.
  void TransferLocked(uint32_t conn_index, uint32_t proc_index, int fd);
  // Budget mode, lock-free, by the connection's owner: whether it sends
  // less than its pacing allows (KeySlotShm::under_pace). Only an active
  // connection is counted; a leave takes it off the count.
  void SetUnderPace(uint32_t conn_index, bool under);
  // Budget mode, lock-free, by the connection's owner: `left` bytes have
  // left conn's socket in all; what is new since it was last counted
  // (ConnSlotShm::bytes_left) is added to its key's count.
  void CountLeft(ConnSlotShm& conn, uint64_t left) const;

 private:
  // Connection slot conn_index if it is in use and its key (*key) within
  // the table; else nullptr.
  ConnSlotShm* InUseLocked(uint32_t conn_index, uint32_t* key) const;
  // A join or leave: the key was active now, and its generation moves.
  void MembershipChangedLocked(KeySlotShm& key) const;
  // Takes a connection off its key's under_pace count if it is on it.
  void DropUnderPace(ConnSlotShm& conn);
  // Budget mode: a join or leave sets the key's level at once
  // (BudgetMembershipChange), before the next tick.
  void AdjustLevelLocked(KeySlotShm& key, uint32_t before, uint32_t after);

  const ZoneTables t_;
  KeyTable* keys_;
  const ZoneSettings* settings_;
  const Clock* clock_ = &MonotonicClock();
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_SHM_CONN_TABLE_H_
