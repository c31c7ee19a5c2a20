// What this process knows of each zone connection slot it has fds on: how
// many of its fds hold the registration (the refs word), when it last sent,
// what the budget's measurements learnt of it, where the idle check and the
// rest looks stand, and the packet shaper's piece. Idle time is kept per
// connection, not per fd: a connection written through a dup only is still
// sending.
//
//   LocalConns local(zone.conns().capacity());  // ok() false if no memory
//   local.AddRef(conn, cookie);                 // an fd of ours on it
//   local[conn].last_send_ns.store(now, ...);
//   if (local.DropRef(conn, cookie)) ...        // our last fd on it went
//
// The memory is private to the process (copied by fork), reserved for the
// zone's connection capacity and committed as it is touched. Thread
// safety: every field is atomic; any thread may use any entry.

#ifndef TRAFFICRATE_SRC_RUNTIME_LOCAL_CONNS_H_
#define TRAFFICRATE_SRC_RUNTIME_LOCAL_CONNS_H_

#include <atomic>
#include <cstdint>

#include "src/budget/meter.h"
#include "src/runtime/fd_table.h"
#include "src/runtime/local_refs.h"
#include "src/shm/conn_table.h"
#include "src/shm/zone_layout.h"

namespace trafficrate {

// LocalConn::kernel_base and rest_written before their first reading.
inline constexpr uint64_t kNoKernelBase = ~uint64_t{0};

struct LocalConn {
  std::atomic<uint64_t> refs;  // a LocalRefs word (local_refs.h)
  std::atomic<int64_t> last_send_ns;
  // Budget mode: when it is next measured; while it drains, when the
  // drain began.
  std::atomic<int64_t> next_measure_ns;
  std::atomic<int64_t> drain_last_ns;  // budget mode, draining
  // Budget mode: what the measurements learnt of its sending (the last
  // one, the rate bytes left at, the packet size, whether it sends less
  // than its pacing allows), from which the ticks between measurements
  // estimate what left since (meter.h).
  ConnMeter meter;
  // Budget mode: no idle check before this time (the next measurement
  // looks at its queue anyway).
  std::atomic<int64_t> next_idle_check_ns;
  // What its queue held at the last look (an idle check, or a budget
  // measurement), and when. The next idle check waits for that queue to
  // leave at the pace then in force, so that a raise of its pace brings
  // it forward.
  std::atomic<uint64_t> idle_queued;
  std::atomic<int64_t> idle_queued_ns;
  // Budget mode: when the watcher last applied a level to it.
  std::atomic<int64_t> applied_ns;
  // The packet shaper (shaper.h): the piece size for the pacing applied
  // (0: none), its first pieces still to go, and its socket's MSS (0:
  // not read yet).
  std::atomic<uint32_t> piece;
  std::atomic<uint32_t> first_left;
  std::atomic<uint32_t> mss;
  // Budget mode: what the kernel had sent of its socket before this
  // registration (MeasureConn; kNoKernelBase until its first measurement).
  std::atomic<uint64_t> kernel_base;
  // At rest (IdleExpiry::LookAtRest): the bytes written to its socket at
  // the first look of this rest (kNoKernelBase: not looked yet), the next
  // look, and the gap before it.
  std::atomic<uint64_t> rest_written;
  std::atomic<int64_t> rest_look_ns;
  std::atomic<int64_t> rest_gap_ns;
};

class LocalConns {
 public:
  // Reserves `capacity` entries (the zone's connection slots).
  explicit LocalConns(uint32_t capacity);
  ~LocalConns();
  LocalConns(const LocalConns&) = delete;
  LocalConns& operator=(const LocalConns&) = delete;

  // False if the memory could not be reserved: nothing is governed then.
  bool ok() const { return conns_ != nullptr; }
  uint32_t capacity() const { return capacity_; }
  // REQUIRES: ok(), index < capacity().
  LocalConn& operator[](uint32_t index) const { return conns_[index]; }

  // One more fd of this process on registration (index, cookie); an entry
  // holding an older registration's count starts again at one.
  void AddRef(uint32_t index, uint32_t cookie) const;
  // One fd less; true if it was the last. False, and nothing changes, if
  // the entry counts another registration (this fd's ended already).
  bool DropRef(uint32_t index, uint32_t cookie) const;
  // How many fds of this process hold registration (index, cookie).
  uint32_t Refs(uint32_t index, uint32_t cookie) const;

  // A registration this process now holds, accepted or taken over at
  // now_ns: everything it knew of the slot is forgotten. first_pieces: the
  // shaper's first pieces it may still send (shaper.h).
  void Reset(uint32_t index, int64_t now_ns, uint32_t first_pieces) const;
  // Forgets what the rest looks knew of the slot: a new rest starts.
  void StartRest(uint32_t index) const;

 private:
  const uint32_t capacity_;
  LocalConn* const conns_;
};

// Whether fd state `state` (fd_table.h) still names the registration in
// zone slot `conn` (the slot was not freed and reused since).
inline bool ConnValid(const ConnSlotShm& conn, uint64_t state) {
  return ConnTable::CookieOf(conn.seq.load(std::memory_order_acquire)) ==
         FdState::From(state).cookie();
}

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_LOCAL_CONNS_H_
