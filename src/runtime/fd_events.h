// What the host does to the fds of governed connections, other than send:
// close (one fd, a range), dup and dup2, and the epoll fds it makes. The
// last fd of a registration ends it (Registry::Release); in budget mode a
// connection closed with data unsent drains on (drains.h); an fd the host
// reuses for the library's own kept drain gives that fd up.
//
//   events.Close(fd, /*may_keep_fd=*/true);   // before the real close
//   events.Dup(oldfd, newfd);                 // after dup/dup2/F_DUPFD
//
// The Governor checks first that the call concerns it (Concerns) and is not
// made by a child sharing its memory (Governor::SharedWithParent).
// Thread safety: any thread.

#ifndef TRAFFICRATE_SRC_RUNTIME_FD_EVENTS_H_
#define TRAFFICRATE_SRC_RUNTIME_FD_EVENTS_H_

#include <cstdint>

#include "src/runtime/drains.h"
#include "src/runtime/governor_context.h"
#include "src/runtime/host_epolls.h"
#include "src/runtime/registry.h"

namespace trafficrate {

class FdEvents : private GovernorPart {
 public:
  // REQUIRES: the parts given outlive the FdEvents.
  FdEvents(const GovernorContext& context, Registry& registry, Drains& drains,
           HostEpolls& epolls)
      : GovernorPart(context),
        registry_(registry),
        drains_(drains),
        epolls_(epolls) {}

  // Whether closing or replacing fd concerns the library (a governed fd, a
  // kept drain, or a host's epoll fd); any fd in [first, last] for a range.
  bool Concerns(int fd) const;
  bool ConcernsRange(unsigned int first, unsigned int last) const;
  // fd is being closed. With may_keep_fd, a connection closed with data
  // unsent may keep its socket open to drain (not from close_range, which
  // would close that duplicate right after).
  void Close(int fd, bool may_keep_fd);
  void CloseRange(unsigned int first, unsigned int last);
  // Stops governing fd, waiting until the watcher no longer touches it;
  // returns its state (0 if none), for Release or Reattach.
  uint64_t Detach(int fd);
  // Gives fd back the state Detach took, unless something took its entry
  // meanwhile (then the state is released).
  void Reattach(int fd, uint64_t state);
  // newfd became a duplicate of oldfd.
  void Dup(int oldfd, int newfd);
  // An fd state that no fd holds any more: a registration's (the last fd
  // of its owner ends it) or a kept drain's (the drain goes on without it).
  void Release(uint64_t state);

 private:
  Registry& registry_;
  Drains& drains_;
  HostEpolls& epolls_;
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_FD_EVENTS_H_
