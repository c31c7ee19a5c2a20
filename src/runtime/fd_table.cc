#include "src/runtime/fd_table.h"

#include <sched.h>

#include "src/base/clock.h"
#include "src/base/private_array.h"

namespace trafficrate {
namespace {

// A pin is held for one setsockopt or ioctl (about a microsecond); if the
// holder was preempted, yield rather than burn the core.
constexpr int kPinSpins = 64;
constexpr int kPinYields = 20000;
// Untrack must not give up while the holder is merely preempted (on a loaded
// machine that lasts far longer than kPinYields yields): a close that goes
// ahead lets the holder act on a reused fd number. So its bound is time.
constexpr int64_t kUntrackWaitNs = kNsPerSec;

}  // namespace

FdTable* FdTable::Create(int capacity) {
  if (capacity <= 0) return nullptr;
  FdEntry* entries = MapPrivateArray<FdEntry>(static_cast<size_t>(capacity));
  if (entries == nullptr) return nullptr;
  return new FdTable(entries, capacity);
}

FdTable::~FdTable() {
  UnmapPrivateArray(entries_, static_cast<size_t>(capacity_));
}

void FdTable::NoteTracked(int fd) {
  int seen = high_water_.load(std::memory_order_relaxed);
  while (fd + 1 > seen && !high_water_.compare_exchange_weak(
                              seen, fd + 1, std::memory_order_acq_rel)) {
  }
}

bool FdTable::TryPin(FdEntry& entry, uint64_t state, bool wait) {
  const int attempts = wait ? kPinSpins + kPinYields : 1;
  for (int i = 0; i < attempts; ++i) {
    uint32_t free = 0;
    if (entry.busy.compare_exchange_strong(free, 1,
                                           std::memory_order_seq_cst)) {
      // Seen after the pin: a close that cleared the state before we pinned
      // is caught here; one that clears it later waits for our unpin.
      if (entry.state.load(std::memory_order_seq_cst) == state) return true;
      Unpin(entry);
      return false;
    }
    if (i >= kPinSpins) sched_yield();
  }
  return false;
}

uint64_t FdTable::Untrack(FdEntry& entry) {
  const uint64_t old = entry.state.exchange(0, std::memory_order_seq_cst);
  if (old == 0) return 0;
  for (int i = 0; i < kPinSpins; ++i) {
    if (entry.busy.load(std::memory_order_seq_cst) == 0) return old;
  }
  const int64_t deadline = MonotonicNowNs() + kUntrackWaitNs;
  while (entry.busy.load(std::memory_order_seq_cst) != 0 &&
         MonotonicNowNs() < deadline) {
    sched_yield();
  }
  return old;
}

void FdTable::ClearPinsAfterFork() {
  const int hw = high_water();
  for (int fd = 0; fd < hw; ++fd) {
    entries_[fd].busy.store(0, std::memory_order_relaxed);
  }
}

}  // namespace trafficrate
