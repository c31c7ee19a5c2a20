// The Governor: one per process. It decides, for the sockets this process
// accepted, whether a connection is governed at all (its local port and
// client, on accept), when it registers with the zone (on accept), joins its
// key (on its first send, or once it has sent TRAFFICRATE_AFTER bytes; again
// after being idle), leaves (idle) and deregisters (on close); it applies
// each connection's share with SO_MAX_PACING_RATE; and it runs the process's
// watcher thread, which re-applies shares pushed by other processes, expires
// idle connections and reaps the registrations of dead processes.
//
//   Governor gov(zone, table, &logger, options);
//   gov.OnAccept(fd, peer, peer_len);  // after a successful accept
//   Shape shape = gov.BeforeSend(fd);  // before every write/send/sendfile
//   ... the call, cut as shape says (shaped_send.h) ...
//   gov.AfterSend(fd, sent);           // after it (or as pieces leave)
//   gov.UsedFirstPieces(fd, n);        // first pieces the call used
//   gov.OnClose(fd);                   // before the real close
//
// The lib/ interposers are thin glue over these calls; tests drive them on
// real sockets without LD_PRELOAD.
//
// The Governor holds the hot path (BeforeSend, AfterSend) and the process's
// life (fork, the watcher); the rest is done by its parts, each a unit of
// its own over the same GovernorContext (governor_context.h): the registry
// (registry.h), pacing (pacer.h), fd events (fd_events.h), fd passing
// (fd_passing.h), idle expiry (idle_expiry.h), the budget ticks
// (budget_ticks.h, key_decisions.h), drains (drains.h) and zone health
// (zone_health.h). Classification (classify.h), the rule set (rule_set.h)
// and inherited sockets (inherited.h) are units below them.
//
// Ownership: zone, table and logger must outlive the Governor. In the library
// nothing is ever destroyed (host threads may send while the process exits).
// Thread safety: every public function may be called from any thread.

#ifndef TRAFFICRATE_SRC_RUNTIME_GOVERNOR_H_
#define TRAFFICRATE_SRC_RUNTIME_GOVERNOR_H_

#include <sys/socket.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>

#include "src/base/log.h"
#include "src/base/process_token.h"
#include "src/budget/cpu_budget.h"
#include "src/budget/shaped_send.h"
#include "src/runtime/budget_ticks.h"
#include "src/runtime/drains.h"
#include "src/runtime/fd_events.h"
#include "src/runtime/fd_passing.h"
#include "src/runtime/fd_table.h"
#include "src/runtime/governor_context.h"
#include "src/runtime/governor_options.h"
#include "src/runtime/host_epolls.h"
#include "src/runtime/idle_expiry.h"
#include "src/runtime/key_decisions.h"
#include "src/runtime/local_conns.h"
#include "src/runtime/pacer.h"
#include "src/runtime/registry.h"
#include "src/runtime/rule_set.h"
#include "src/runtime/watcher.h"
#include "src/runtime/zone_health.h"
#include "src/shm/zone.h"

namespace trafficrate {

class Governor final : public WatcherDuties {
 public:
  // REQUIRES: zone, table and logger outlive the Governor.
  Governor(Zone* zone, FdTable* table, const Logger* logger,
           const GovernorOptions& options);
  // Stops the watcher thread, if any (tests; the library never destroys it).
  ~Governor() override;
  Governor(const Governor&) = delete;
  Governor& operator=(const Governor&) = delete;

  // After accept returned fd. peer may be null (then getpeername is used).
  // Registers AF_INET/AF_INET6 stream sockets on a governed local port from
  // a client that is not exempt (options.rules); leaves others alone for
  // good. Costs a getsockname only when the rules restrict the ports (or
  // the key is the local endpoint).
  void OnAccept(int fd, const sockaddr* peer, socklen_t peer_len);
  // Hot path: no allocation, no lock unless the connection joins its key,
  // errno may be clobbered (the interposer restores it). Returns how the
  // packet shaper cuts the call (inactive: not at all), from the pacing now
  // applied to the socket.
  Shape BeforeSend(int fd);
  // Hot path: counts bytes sent. errno may be clobbered.
  void AfterSend(int fd, ssize_t sent);
  // Hot path: the call used n of the connection's first pieces (its first
  // kFirstPieces segments, which the kernel sends unpaced).
  void UsedFirstPieces(int fd, uint32_t n);
  // Hot path: adds a cut call's cost to this process's shaper counters in
  // the zone (ProcSlotShm).
  void CountShaped(const ShapeCounts& counts);
  // Where sendfile's bounded copy reads (shaped_send.h); null if none
  // could be reserved.
  CopyBuffers* copy_buffers() const { return copy_buffers_; }
  // Before the real close of fd: ReleaseDetached(Detach(fd)).
  void OnClose(int fd);
  // Before a call that may replace fd (dup2, dup3): stops governing fd and
  // waits until the watcher no longer touches it. Returns its state, which
  // the caller passes to ReleaseDetached if fd was replaced, else to
  // Reattach.
  uint64_t Detach(int fd);
  void ReleaseDetached(uint64_t state) { events_.Release(state); }
  void Reattach(int fd, uint64_t state);
  // Before close_range(first, last) or closefrom(first).
  void OnCloseRange(unsigned int first, unsigned int last);
  // After newfd became a duplicate of oldfd (dup, dup2, dup3, F_DUPFD).
  void OnDup(int oldfd, int newfd);
  // Sockets passed between processes over Unix sockets (SCM_RIGHTS).
  // Before a sendmsg carrying fds: each governed connection among them is
  // published in the zone (HandoffTable::PublishLocked), so that its
  // receiver takes the registration over, and this process's close of its
  // copy does not end it meanwhile. Returns how many were published.
  int BeforePassFds(const msghdr* msg);
  // After that sendmsg, if it failed (sent false) and any was published:
  // withdraws them.
  void AfterPassFds(const msghdr* msg, bool sent);
  // After a recvmsg that received fds: each socket a governed process
  // passed is governed here from now on, counted once (its registration
  // moves to this process). Sockets nobody published (a proxy's upstream
  // connection, a socket from a process without the library) are left
  // alone.
  void OnReceivedFds(const msghdr* msg);
  // At start-up (the library's constructor, TRAFFICRATE_INHERITED): governs
  // (registers at their first send, see FdState::PendingGroup)
  // the client connections the process inherited from its parent, such as
  // inetd's or systemd's (Accept=yes) fd 0/1, or socket-activation fds. A
  // connected TCP socket found then was made by no code of this program
  // yet; it is taken as a client's (accepted by the parent) if its local
  // port is in TRAFFICRATE_PORTS, or, without TRAFFICRATE_PORTS, if its
  // local port is outside the kernel's ephemeral range
  // (net.ipv4.ip_local_port_range), where the local ports of outgoing
  // connections come from. Then the usual rules (exempt, key) apply; the
  // fds of one socket are one connection. Returns how many it governs.
  int AdoptInherited();
  // Unreceived handoffs expire after this long: their sender then ends
  // the registrations it no longer holds an fd of.
  static constexpr int64_t kHandoffExpiryNs = FdPassing::kHandoffExpiryNs;
  // In the child, after fork: the watcher thread did not survive. Arms the
  // process token.
  void AfterForkChild();
  // Whether the calling process is the one this Governor is set up for: one
  // load, no system call (ProcessToken). False in a new process made with
  // fork or a raw clone system call (which skips pthread_atfork) until
  // RenewProcess has run in it. Hot path.
  bool ProcessCurrent() const { return process_.Current(); }
  // In a new process: AfterForkChild, once, by the first thread to call it
  // (true); false for the others while it runs (their call passes through).
  bool RenewProcess();
  // Whether the caller runs in a child made with CLONE_VM (vfork,
  // posix_spawn; Python's subprocess closes and dup2s fds there, through
  // libc, before its exec): its memory is its parent's, but its fd table is
  // its own, so the library must leave the parent's state alone. One
  // getpid(): only on calls about a governed fd.
  bool SharedWithParent() const;
  // Before a call that may leave the process unable to start threads (a
  // lower RLIMIT_NPROC): if it holds governed connections, starts its
  // watcher now, for them and for those it may be passed later (vsftpd's
  // transfer process is handed its data connections after it dropped its
  // privileges and set RLIMIT_NPROC to 0).
  void BeforeThreadLimit();
  // After epoll_create/epoll_create1 returned epfd. A socket kept open
  // past the host's close (KeepDraining) is first taken out of the host's
  // epoll sets, which would otherwise go on reporting it.
  void OnEpollCreate(int epfd);
  // After accept failed with EMFILE: closes the fds that keep closed
  // connections draining (they drain on at the rate in force), so that the
  // host can have them. Returns how many; the caller retries if any.
  int ReleaseKeptDrains();

  // The process's slot in the zone, claiming it and starting the watcher
  // thread on first use. kNoSlot if that failed.
  uint32_t EnsureProc();
  uint32_t proc_index() const { return watcher_.proc_index(); }

  // One pass of each watcher duty; public for tests. They skip fds pinned by
  // another thread.
  void ApplyChangedShares() override;
  // Also joins connections whose TRAFFICRATE_AFTER bytes have left the
  // socket since their last send.
  void ExpireIdle(int64_t now_ns) override;
  // The watcher woke this late (its process got no CPU meanwhile: stopped,
  // frozen, starved). From a quarter of TRAFFICRATE_IDLE on, no connection
  // of this process counts as idle before as long again as the stall (at
  // most TRAFFICRATE_IDLE) has passed from now, since the server could not
  // write either (a worker stopped for 0.5 s left its key and joined again
  // at once, and the join cut the key's level to the equal share).
  void NoteWatcherLate(int64_t late_ns, int64_t now_ns) override;
  void ReapDead() override;
  // Once per watcher loop: looks again at a stalled zone lock, finishes the
  // releases deferred because of it, and once a second checks the zone's
  // header and says what happened with the lock. False once the zone is
  // corrupt: the process then passes everything through (PassThroughAll),
  // and the watcher has nothing more to do.
  bool CheckZone(int64_t now_ns) override;
  // Rule tables replaced by reloads and not freed yet (tests).
  int RetiredRuleTablesForTesting() const { return rules_.RetiredForTesting(); }
  // Ends the registrations of connections this process passed that nobody
  // received by now_ns - kHandoffExpiryNs, unless it still has an fd of
  // them (CheckZone, each watcher loop; safe beside the watcher: it works
  // under the zone lock).
  void ExpireHandoffs(int64_t now_ns);
  // The longest a budget-mode watcher sleeps between ticks (a visit round,
  // up to half a second, while it spaces its work out: cpu_budget.h).
  static constexpr int64_t kMaxBudgetSleepNs = BudgetTicks::kMaxSleepNs;
  // Budget mode (budget.h): whether the zone runs the shared budget, and
  // one tick of it: measures what left this process's sending sockets
  // (their bytes handed to the kernel minus SIOCOUTQNSD), adds it to their
  // keys, models the drain of closed connections, and for each key whose
  // lease it holds (or takes) decides the level and publishes it.
  bool BudgetWanted() const override;
  // Returns when the next tick has work: the start of the first tick in
  // which a connection is due for a visit, at most kMaxBudgetSleepNs (or a
  // visit round) away.
  int64_t TickBudget(int64_t now_ns) override;

  // Outside budget mode (another process of the zone switched it): the
  // drains of connections closed while it was on still end, and kept fds
  // are closed as their queues empty, rather than never.
  void FinishDrains(int64_t now_ns) override;

  // Stops the watcher thread and releases this process's liveness token, so
  // that the process looks dead to the zone (its registrations get reaped).
  void StopWatcher();

  Zone& zone() const { return *zone_; }
  // CLOCK_MONOTONIC of the last send on fd's connection through any fd of
  // this process; 0 if fd is not governed.
  int64_t LastSendNs(int fd) const;

 private:
  Zone* const zone_;
  FdTable* const table_;
  const Logger* const logger_;
  const GovernorOptions options_;
  Watcher watcher_;
  int32_t pid_;  // getpid() of the process set up (SharedWithParent)
  ProcessToken process_;
  RuleSet rules_;
  LocalConns local_;
  CpuBudget cpu_;
  CopyBuffers* copy_buffers_ = nullptr;
  // The parts, in the order they depend on each other.
  const GovernorContext context_;
  Pacer pacer_;
  Registry registry_;
  HostEpolls epolls_;
  KeyDecisions decisions_;
  Drains drains_;
  IdleExpiry idle_;
  BudgetTicks ticks_;
  FdEvents events_;
  FdPassing passing_;
  ZoneHealth health_;
  mutable std::atomic<int64_t> last_fd_log_ns_{0};
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_GOVERNOR_H_
