// Sockets passed between processes over Unix sockets (SCM_RIGHTS). Before a
// sendmsg carrying fds, each governed connection among them is published in
// the zone's handoff table, so that its receiver takes the registration
// over, and the sender's close of its copy does not end it meanwhile. The
// receiver governs the sockets a governed process passed; sockets nobody
// published (a proxy's upstream connection, a socket from a process
// without the library) are left alone. Unreceived handoffs expire: their
// sender then ends the registrations it no longer holds an fd of.
//
//   int n = passing.BeforePass(&msg);        // sendmsg(fd, &msg, ...)
//   if (n > 0) passing.AfterPass(&msg, sent);
//   passing.OnReceived(&msg);                // after recvmsg
//   passing.ExpireHandoffs(now_ns);          // the watcher, each loop
//
// Thread safety: any thread; ExpireHandoffs works under the zone lock.

#ifndef TRAFFICRATE_SRC_RUNTIME_FD_PASSING_H_
#define TRAFFICRATE_SRC_RUNTIME_FD_PASSING_H_

#include <sys/socket.h>

#include <atomic>
#include <cstdint>

#include "src/runtime/fd_events.h"
#include "src/runtime/governor_context.h"
#include "src/runtime/registry.h"

namespace trafficrate {

class FdPassing : private GovernorPart {
 public:
  // REQUIRES: the parts given outlive the FdPassing.
  FdPassing(const GovernorContext& context, Registry& registry,
            FdEvents& events)
      : GovernorPart(context), registry_(registry), events_(events) {}

  // Unreceived handoffs expire after this long.
  static constexpr int64_t kHandoffExpiryNs = 2'000'000'000;

  // Before a sendmsg carrying fds: publishes each governed connection among
  // them (HandoffTable::PublishLocked). Returns how many were published.
  int BeforePass(const msghdr* msg);
  // After that sendmsg, if it failed (sent false): withdraws them.
  void AfterPass(const msghdr* msg, bool sent);
  // After a recvmsg that received fds: each socket a governed process
  // passed is governed here from now on, counted once (its registration
  // moves to this process).
  void OnReceived(const msghdr* msg);
  // Ends the registrations of connections this process passed that nobody
  // received by now_ns - kHandoffExpiryNs, unless it still has an fd of
  // them.
  void ExpireHandoffs(int64_t now_ns);

 private:
  // One received fd (OnReceived).
  void ReceiveFd(int fd);

  Registry& registry_;
  FdEvents& events_;
  mutable std::atomic<int64_t> last_handoff_log_ns_{0};
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_FD_PASSING_H_
