// Idle expiry: a sending connection of this process leaves its key once
// nothing was sent on it for TRAFFICRATE_IDLE and its socket has nothing
// queued, so that its siblings take its share; a connection at rest is
// looked at now and then in case a process that cannot reach the zone
// writes it (then it joins again). Also joins the connections whose
// TRAFFICRATE_AFTER bytes left the socket since their last send.
//
//   IdleExpiry idle(context, registry);
//   idle.ExpireIdle(now_ns);            // the watcher, every idle tick
//
// Thread safety: the watcher thread (ExpireIdle, NoteWatcherLate,
// LookAtRest); ExpireIfIdle also from the budget tick, on that thread.

#ifndef TRAFFICRATE_SRC_RUNTIME_IDLE_EXPIRY_H_
#define TRAFFICRATE_SRC_RUNTIME_IDLE_EXPIRY_H_

#include <atomic>
#include <cstdint>

#include "src/runtime/governor_context.h"
#include "src/runtime/registry.h"

namespace trafficrate {

class IdleExpiry : private GovernorPart {
 public:
  // REQUIRES: registry outlives the IdleExpiry.
  IdleExpiry(const GovernorContext& context, Registry& registry)
      : GovernorPart(context), registry_(registry) {}

  // One pass over this process's connections (equal mode; in budget mode
  // only TRAFFICRATE_AFTER's joins, the tick's visits expire the rest).
  void ExpireIdle(int64_t now_ns);
  // The watcher woke this late (its process got no CPU meanwhile: stopped,
  // frozen, starved). From a quarter of TRAFFICRATE_IDLE on, no connection
  // of this process counts as idle before as long again as the stall (at
  // most TRAFFICRATE_IDLE) has passed from now, since the server could not
  // write either.
  void NoteWatcherLate(int64_t late_ns, int64_t now_ns);
  // One connection's idle check: it leaves its key when nothing was sent
  // for TRAFFICRATE_IDLE and its socket has nothing queued. Sets *push if
  // siblings must be told, and *quiet_until_ns (if given) to a time before
  // which another look would find nothing to do (0: none known). False if
  // the zone lock could not be had (try again next pass).
  bool ExpireIfIdle(int fd, FdEntry& entry, uint64_t state,
                    const ConnSlotShm& conn, int64_t now_ns, bool* push,
                    int64_t* quiet_until_ns = nullptr);
  // One look at a connection of this process that is registered but not
  // sending by its sends (it left its key, or never joined): a process that
  // cannot reach the zone (a CGI child running as another user) may be
  // writing it. The socket's own count of bytes written says so, and then
  // it joins (Registry::JoinSlow). The looks come further apart the longer
  // it rests (kRestFirstLookNs doubling up to kRestLastLookNs, stretched
  // with the watcher's CPU), so that idle keep-alive connections cost
  // little. Returns the time of the next look: now_ns if it joined (visit
  // it again at once), 0 if it is not at rest here.
  int64_t LookAtRest(int fd, FdEntry& entry, uint64_t state,
                     const ConnSlotShm& conn, int64_t now_ns);

  // A connection at rest is looked at this long after its rest began, then
  // at twice the gap each time, up to the last. A write by a process that
  // cannot reach the zone starts within about the first gap (the CGI child
  // that writes a response its parent began); the gap then bounds how long
  // it goes at the pace it had when it left, while its siblings take its
  // share.
  static constexpr int64_t kRestFirstLookNs = 100'000'000;   // 100 ms
  static constexpr int64_t kRestLastLookNs = 6'400'000'000;  // 6.4 s

 private:
  Registry& registry_;
  // No connection of this process is idle before then, after a stall
  // (NoteWatcherLate).
  std::atomic<int64_t> not_idle_before_ns_{0};
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_IDLE_EXPIRY_H_
