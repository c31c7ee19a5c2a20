// The per-process fd table: for every fd number, whether the socket behind it
// is governed, which zone connection slot it belongs to, and the pacing last
// applied to it. Read on every send without a lock.
//
//   FdTable* table = FdTable::Create(65536);  // reserved, not committed
//   FdEntry* e = table->Get(fd);              // nullptr beyond capacity
//   uint64_t state = e->state.load(std::memory_order_acquire);
//   if (state != 0) uint32_t conn = StateConn(state);
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

namespace trafficrate {

struct FdEntry {
  // 0: not governed. Else kTracked | cookie << 32 | zone connection index.
  std::atomic<uint64_t> state;
  // Share token (settings generation << 32 | key generation) last applied.
  std::atomic<uint64_t> applied;
  std::atomic<uint32_t> busy;  // 1 while a thread acts on the socket
  // Budget mode: the watcher's tick skips this fd until its tick number
  // reaches this (0: visit at the next tick). Here, beside `state`, so that
  // a skipped fd costs the watcher no other cache line.
  std::atomic<uint32_t> visit_tick;
};
static_assert(sizeof(FdEntry) == 24);

inline constexpr uint64_t kTracked = 1ULL << 63;
inline constexpr uint64_t kNeverApplied = ~0ULL;

// The state of the library's own fd that keeps a closed connection's socket
// open while its queue drains (Governor, budget mode): drain slot << 32,
// and a connection index no zone has, so that every pass over the table
// that looks for connections skips it. A close or dup2 of that fd number
// by the host (a close-everything loop) finds the mark and tells the
// Governor, which then stops using it.
inline constexpr uint64_t kKeptDrain = 1ULL << 62;
inline uint64_t KeptDrainState(uint32_t slot) {
  return kKeptDrain | uint64_t{slot} << 32 | 0xffffffffu;
}
inline bool IsKeptDrain(uint64_t state) {
  return (state & (kTracked | kKeptDrain)) == kKeptDrain;
}
inline uint32_t KeptDrainSlot(uint64_t state) {
  return static_cast<uint32_t>(state >> 32) & 0x3fffffffu;
}

// An fd whose connection could not be registered when it was accepted (the
// zone lock was held too long, or the watcher had not started): its next
// send tries again. Like a kept drain's, a connection index no zone has.
inline constexpr uint64_t kRegisterPending = (1ULL << 61) | 0xffffffffu;
// A socket the process inherited (Governor::AdoptInherited) waits in that
// state too, until its first send: a process that never sends on it (a
// shell that execs the program that does) takes no process slot. Its fds
// (inetd's 0 and 1) carry its first fd + 1, in bits 32..60, so that the
// first send through any of them registers the socket once for all.
inline uint64_t PendingGroupState(int first_fd) {
  return kRegisterPending | (uint64_t(first_fd + 1) & 0x1fffffffu) << 32;
}
inline bool IsRegisterPending(uint64_t state) {
  return (state & ~(uint64_t{0x1fffffffu} << 32)) == kRegisterPending;
}
inline uint64_t PackState(uint32_t conn_index, uint32_t cookie) {
  return kTracked | (uint64_t{cookie & 0x7fffffffu} << 32) | conn_index;
}
inline uint32_t StateConn(uint64_t state) {
  return static_cast<uint32_t>(state);
}
inline uint32_t StateCookie(uint64_t state) {
  return static_cast<uint32_t>(state >> 32) & 0x7fffffffu;
}

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
