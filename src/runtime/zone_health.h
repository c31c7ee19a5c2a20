// Zone health, from the watcher once per loop: looks again at a stalled zone
// lock, finishes the work deferred because of it (releases, pending
// registrations, expired handoffs), reloads the rules when asked, and once
// a second checks the zone's header and says what happened with the lock.
// A lock held for seconds by a thread that does not exist, or a header that
// no longer checks, marks the zone corrupt: the process then passes every
// connection through unpaced (PassThroughAll), said once.
//
//   if (!health.Check(now_ns)) ...  // corrupt: nothing more to do
//
// Thread safety: the watcher thread only.

#ifndef TRAFFICRATE_SRC_RUNTIME_ZONE_HEALTH_H_
#define TRAFFICRATE_SRC_RUNTIME_ZONE_HEALTH_H_

#include <atomic>
#include <cstdint>

#include "src/runtime/drains.h"
#include "src/runtime/fd_passing.h"
#include "src/runtime/governor_context.h"
#include "src/runtime/registry.h"

namespace trafficrate {

class ZoneHealth : private GovernorPart {
 public:
  // REQUIRES: the parts given outlive the ZoneHealth.
  ZoneHealth(const GovernorContext& context, Registry& registry,
             FdPassing& passing, Drains& drains)
      : GovernorPart(context),
        registry_(registry),
        passing_(passing),
        drains_(drains) {}

  // One look; false once the zone is corrupt (everything passes through).
  bool Check(int64_t now_ns);

 private:
  // PassThroughAll, said once; returns false (for Check).
  bool PassThroughCorrupt();
  // Every socket of this process goes back to unpaced, and nothing touches
  // the zone any more.
  void PassThroughAll();

  Registry& registry_;
  FdPassing& passing_;
  Drains& drains_;
  // The once-a-second look.
  int64_t next_check_ns_ = 0;
  int stalled_checks_ = 0;
  uint64_t lock_timeouts_said_ = 0;
  uint64_t deferred_lost_said_ = 0;
  std::atomic<int64_t> last_lock_log_ns_{0};
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_ZONE_HEALTH_H_
