// The per-process fd table: for every fd number, whether the socket behind it
// is governed, which zone connection slot it belongs to, and the pacing last
// applied to it. Read on every send without a lock.
//
//   FdTable* table = FdTable::Create(65536);  // reserved, not committed
//   FdEntry* e = table->Get(fd);              // nullptr beyond capacity
//   FdState state = FdState::From(e->state.load(std::memory_order_acquire));
//   if (!state.empty()) uint32_t conn = state.conn();
//
// Races between the host closing (or reusing) an fd and the watcher thread
// touching it are settled with `busy`: the watcher pins an entry, re-checks
// its state, acts, unpins; a close first clears the state, then waits until
// the entry is unpinned, and only then lets the real close run. So the
// watcher never touches an fd number after the host has closed it.
//
// Thread safety: every field is atomic; entries may be read and written from
// any thread. The memory is private to the process and copied by fork.

#ifndef TRAFFICRATE_SRC_RUNTIME_FD_TABLE_H_
#define TRAFFICRATE_SRC_RUNTIME_FD_TABLE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace trafficrate {

struct FdEntry {
  std::atomic<uint64_t> state;    // an FdState; 0: not governed
  std::atomic<uint64_t> applied;  // the ShareGenerations last applied
  std::atomic<uint32_t> busy;     // 1 while a thread acts on the socket
  // Budget mode: the watcher's tick skips this fd until its tick number
  // reaches this (0: visit at the next tick). Here, beside `state`, so that
  // a skipped fd costs the watcher no other cache line.
  std::atomic<uint32_t> visit_tick;
};
static_assert(sizeof(FdEntry) == 24);

// FdEntry::state, as a value: what an fd is to the library. One of
//
//   0                           not governed (FdState(), empty())
//   1 | cookie:31 | conn:32     a registered connection: its zone connection
//                               slot and that slot's cookie (ConnTable::
//                               CookieOf) when registered (Conn)
//   01 | slot:30 | ~0:32        the library's own fd that keeps a closed
//                               connection's socket open while its queue
//                               drains (KeptDrain)
//   001 | first_fd+1:29 | ~0:32 a connection not registered yet (Pending):
//                               first_fd+1 is 0, or for an inherited socket
//                               its first fd + 1 (PendingGroup)
//
// (from bit 63 down). A kept drain and a pending connection have a
// connection index no zone has, so every pass over the table that bounds
// conn() by the zone's capacity skips them.
//
//   const FdState s = FdState::From(entry.state.load());
//   if (!s.empty() && s.conn() < capacity) Use(s.conn(), s.cookie());
//   entry.state.store(FdState::Conn(conn, cookie).word());
//
// Trivially copyable, one uint64_t; constexpr throughout. Hot path: no
// allocation, errno untouched.
class FdState {
 public:
  constexpr FdState() = default;  // not governed
  static constexpr FdState From(uint64_t word) { return FdState(word); }

  // A registered connection. The cookie keeps its low 31 bits (zone cookies
  // have no more: the top bit is the tag).
  static constexpr FdState Conn(uint32_t conn_index, uint32_t cookie) {
    return FdState(kConnTag | uint64_t{cookie & kCookieMask} << 32 |
                   conn_index);
  }
  // The Governor's kept fd of drain slot `drain_slot` (budget mode). A close
  // or dup2 of that fd number by the host (a close-everything loop) finds
  // the mark and tells the Governor, which then stops using it.
  // REQUIRES: drain_slot < 2^30.
  static constexpr FdState KeptDrain(uint32_t drain_slot) {
    return FdState(kKeptDrainTag | uint64_t{drain_slot & kDrainSlotMask} << 32 |
                   kNoConn);
  }
  // An fd whose connection could not be registered when it was accepted
  // (the zone lock was held too long, or the watcher had not started): its
  // next send tries again.
  static constexpr FdState Pending() { return FdState(kPendingTag | kNoConn); }
  // A socket the process inherited (Governor::AdoptInherited) waits in that
  // state too, until its first send: a process that never sends on it (a
  // shell that execs the program that does) takes no process slot. Its fds
  // (inetd's 0 and 1) carry its first fd, so that the first send through
  // any of them registers the socket once for all. REQUIRES: 0 <= first_fd
  // < 2^29 - 1.
  static constexpr FdState PendingGroup(int first_fd) {
    return FdState(kPendingTag |
                   (static_cast<uint64_t>(first_fd + 1) & kGroupMask) << 32 |
                   kNoConn);
  }

  constexpr uint64_t word() const { return word_; }
  constexpr bool empty() const { return word_ == 0; }
  // A registered connection (Conn).
  constexpr bool is_conn() const { return (word_ & kConnTag) != 0; }
  // The zone connection slot: the low 32 bits of any state, beyond every
  // zone's capacity (kNoSlot) for a kept drain or a pending connection.
  constexpr uint32_t conn() const { return static_cast<uint32_t>(word_); }
  constexpr uint32_t cookie() const {
    return static_cast<uint32_t>(word_ >> 32) & kCookieMask;
  }
  constexpr bool kept_drain() const {
    return (word_ & (kConnTag | kKeptDrainTag)) == kKeptDrainTag;
  }
  // REQUIRES: kept_drain().
  constexpr uint32_t drain_slot() const {
    return static_cast<uint32_t>(word_ >> 32) & kDrainSlotMask;
  }
  // Pending, on its own or of a group.
  constexpr bool pending() const {
    return (word_ & ~(kGroupMask << 32)) == (kPendingTag | kNoConn);
  }
  // A pending inherited socket's first fd; -1 for Pending() itself.
  // REQUIRES: pending().
  constexpr int pending_first_fd() const {
    return static_cast<int>((word_ >> 32) & kGroupMask) - 1;
  }

  friend constexpr bool operator==(FdState a, FdState b) {
    return a.word_ == b.word_;
  }
  friend constexpr bool operator!=(FdState a, FdState b) {
    return a.word_ != b.word_;
  }

 private:
  static constexpr uint64_t kConnTag = uint64_t{1} << 63;
  static constexpr uint64_t kKeptDrainTag = uint64_t{1} << 62;
  static constexpr uint64_t kPendingTag = uint64_t{1} << 61;
  static constexpr uint64_t kNoConn = 0xffffffffu;
  static constexpr uint32_t kCookieMask = 0x7fffffffu;
  static constexpr uint32_t kDrainSlotMask = 0x3fffffffu;
  static constexpr uint64_t kGroupMask = 0x1fffffffu;

  explicit constexpr FdState(uint64_t word) : word_(word) {}

  uint64_t word_ = 0;
};
static_assert(std::is_trivially_copyable_v<FdState> &&
              sizeof(FdState) == sizeof(uint64_t));

// FdEntry::applied, as a value: the generations a socket's pacing was
// computed from, the settings' (ZoneHeaderShm::settings_generation) in the
// high half and its key's (KeySlotShm::generation) in the low half. A socket
// whose token differs from its key's current one has a share to re-apply.
// NeverApplied() matches no token a zone gives out in practice.
//
//   if (ShareGenerations::Of(settings_gen, key_gen).word() !=
//       entry.applied.load(std::memory_order_relaxed)) ...  // re-apply
//
// Trivially copyable, one uint64_t; constexpr throughout.
class ShareGenerations {
 public:
  constexpr ShareGenerations() = default;
  static constexpr ShareGenerations From(uint64_t word) {
    return ShareGenerations(word);
  }
  static constexpr ShareGenerations Of(uint32_t settings_generation,
                                       uint32_t key_generation) {
    return ShareGenerations(uint64_t{settings_generation} << 32 |
                            key_generation);
  }
  // The mark of a socket nothing was applied to yet.
  static constexpr ShareGenerations NeverApplied() {
    return ShareGenerations(~uint64_t{0});
  }

  constexpr uint64_t word() const { return word_; }
  constexpr uint32_t settings_generation() const {
    return static_cast<uint32_t>(word_ >> 32);
  }
  constexpr uint32_t key_generation() const {
    return static_cast<uint32_t>(word_);
  }

  friend constexpr bool operator==(ShareGenerations a, ShareGenerations b) {
    return a.word_ == b.word_;
  }
  friend constexpr bool operator!=(ShareGenerations a, ShareGenerations b) {
    return a.word_ != b.word_;
  }

 private:
  explicit constexpr ShareGenerations(uint64_t word) : word_(word) {}

  uint64_t word_ = 0;
};
static_assert(std::is_trivially_copyable_v<ShareGenerations> &&
              sizeof(ShareGenerations) == sizeof(uint64_t));

class FdTable {
 public:
  // Reserves address space for `capacity` entries (zero-filled pages are
  // committed on first touch). Returns nullptr if the mapping fails.
  static FdTable* Create(int capacity);
  ~FdTable();
  FdTable(const FdTable&) = delete;
  FdTable& operator=(const FdTable&) = delete;

  // Hot path: no allocation, errno untouched.
  FdEntry* Get(int fd) const {
    return fd >= 0 && fd < capacity_ ? &entries_[fd] : nullptr;
  }
  int capacity() const { return capacity_; }
  // One past the highest fd ever tracked: the bound of watcher scans.
  int high_water() const { return high_water_.load(std::memory_order_acquire); }
  void NoteTracked(int fd);

  // Pins `entry` if its state still equals `state`. Returns false (and does
  // not pin) if another thread holds it or the state changed. Bounded spins
  // when `wait` is true.
  static bool TryPin(FdEntry& entry, uint64_t state, bool wait);
  static void Unpin(FdEntry& entry) {
    entry.busy.store(0, std::memory_order_release);
  }
  // Clears the entry and waits until no thread has it pinned (bounded: about
  // a second, however long the pin holder stays preempted). Returns the
  // state it had.
  static uint64_t Untrack(FdEntry& entry);

  // In a forked child: no thread of the parent survives to unpin an entry.
  void ClearPinsAfterFork();

 private:
  FdTable(FdEntry* entries, int capacity)
      : entries_(entries), capacity_(capacity) {}

  FdEntry* entries_;
  int capacity_;
  std::atomic<int> high_water_{0};
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_FD_TABLE_H_
