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
// Ownership: zone, table and logger must outlive the Governor. In the library
// nothing is ever destroyed (host threads may send while the process exits).
// Thread safety: every public function may be called from any thread.

#ifndef TRAFFICRATE_SRC_RUNTIME_GOVERNOR_H_
#define TRAFFICRATE_SRC_RUNTIME_GOVERNOR_H_

#include <pthread.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>

#include "src/base/log.h"
#include "src/base/process_token.h"
#include "src/budget/cpu_budget.h"
#include "src/budget/meter.h"
#include "src/budget/shaped_send.h"
#include "src/budget/shaper.h"
#include "src/config/rules.h"
#include "src/config/rules_file.h"
#include "src/net/key.h"
#include "src/runtime/fd_table.h"
#include "src/runtime/rule_set.h"
#include "src/runtime/watcher.h"
#include "src/shm/zone.h"

namespace trafficrate {

// The watcher's timing (idle_ns: TRAFFICRATE_IDLE, coalesce_ns,
// reap_interval_ns) is part of the Governor's options.
// SO_MAX_PACING_RATE of a socket the kernel does not pace.
inline constexpr uint64_t kUnpaced = ~uint64_t{0};

// Work of the zone's that one process at a time does, outside the host's
// calls (the fleet exchange, cluster_agent.h). The watcher polls it.
class ZoneAgent {
 public:
  virtual ~ZoneAgent() = default;
  // From the watcher of process slot `proc`, about every reap interval:
  // takes the work over if nobody does it.
  virtual void Poll(uint32_t proc, int64_t now_ns) = 0;
  // In the child after fork: whatever ran in the parent did not survive.
  virtual void AfterForkChild() = 0;
};

struct GovernorOptions : WatcherTiming {
  KeySpec key;
  // TRAFFICRATE_PORTS and TRAFFICRATE_EXEMPT, decided once per connection at
  // accept: a connection they leave out is never registered.
  AcceptRules rules;
  // TRAFFICRATE_AFTER: a connection joins its key (takes a share, is paced)
  // only once it has sent this many bytes.
  uint64_t after_bytes = 0;
  // TRAFFICRATE_SHAPE: BeforeSend gives the packet shaper's Shape (shaper.h)
  // of paced connections; false: always an inactive one.
  bool shape = true;
  // TRAFFICRATE_CONFIG: the rules file and its rules, matched in order once
  // per accepted connection (a getsockname and a walk of their lists;
  // nothing per send). Empty: key, rules and after_bytes above are the one
  // rule. `trafficrate reload` makes the watcher read the file again.
  std::string rules_path;
  std::vector<Rule> file_rules;
  // The fleet exchange (TRAFFICRATE_CLUSTER), or null. Not owned; outlives
  // the Governor.
  ZoneAgent* agent = nullptr;
};

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
  void ReleaseDetached(uint64_t state) { Release(state); }
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
  // (registers at their first send, see PendingGroupState)
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
  static constexpr int64_t kHandoffExpiryNs = 2'000'000'000;
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
  static constexpr int64_t kMaxBudgetSleepNs = 100'000'000;
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
  // ClassifyConn (classify.h) under the rule table in force.
  bool ClassifyFd(int fd, const sockaddr* peer, socklen_t peer_len,
                  ConnKey* key, uint8_t peer16[16], uint16_t* peer_port) const;
  // Registers fd's connection; its fd entry must still hold `expected`
  // then (0, or kRegisterPending from RegisterPending), else the
  // registration ends at once (the fd was closed meanwhile). inherited: the
  // socket came from the process's parent (an exec'd CGI helper's stdout);
  // a registration its accepting process made is taken over, as a forked
  // child's would be, rather than counted twice.
  void Register(int fd, FdEntry& entry, const ConnKey& key,
                const uint8_t peer16[16], uint16_t peer_port,
                uint64_t expected = 0, bool inherited = false);
  // A registration that could not be made (zone lock stalled, watcher not
  // started yet, rules being reloaded): the watcher makes it as soon as it
  // can (RegisterPending), or the fd's next send (RetryRegister). With its
  // key known, the socket is paced at its rule's rate meanwhile.
  void MarkPending(int fd, FdEntry& entry, const ConnKey* key);
  // The watcher, once the zone lock is free: registers and joins the
  // connections marked pending, without waiting for their next send.
  void RegisterPending();
  // Makes fd an fd of this process on connection conn (cookie), whose
  // registration this process owns now (Register, OnReceivedFds), if fd's
  // entry still holds `expected`; else ends the registration and returns
  // false.
  // fresh: a connection this process accepted, which has sent nothing yet
  // (its first bytes are cut into first pieces).
  bool Adopt(int fd, FdEntry& entry, uint32_t conn, uint32_t cookie,
             int64_t now_ns, uint64_t expected, bool fresh = false);
  // One received fd (OnReceivedFds).
  void ReceiveFd(int fd);
  // pending: the state it had (kRegisterPending, or an inherited socket's
  // PendingGroupState).
  void RetryRegister(int fd, FdEntry& entry, uint64_t pending);
  // After RetryRegister of an inherited socket's fd: its other fds (same
  // pending group) take the registration, or none if it is not governed.
  void SettleGroup(int fd, FdEntry& entry, uint64_t pending);
  // Makes `to` (fd newfd) another fd of from's registration `state`.
  void CopyRegistration(const FdEntry& from, uint64_t state, FdEntry& to,
                        int newfd);
  // Deregisters a connection of this process; true if its key still has
  // senders to push to.
  bool DeregisterLocked(uint32_t index);
  // A close whose deregistration found the zone lock held: the watcher
  // finishes it (FinishDeferredReleases) once it gets the lock.
  void DeferRelease(uint64_t state);
  void FinishDeferredReleases();
  // The zone was found corrupt: every socket of this process goes back to
  // unpaced, and nothing touches the zone any more.
  void PassThroughAll();
  // PassThroughAll, said once; returns false (for CheckZone).
  bool PassThroughCorrupt();
  void JoinSlow(int fd, FdEntry& entry, uint64_t state);
  // TRAFFICRATE_AFTER: whether the connection's first after_bytes have left
  // the socket (sent, not merely queued). One ioctl once they are queued.
  bool PastAfter(int fd, const ConnSlotShm& conn) const;
  void Reregister(int fd, FdEntry& entry, uint64_t state);
  // One connection's idle check (ExpireIdle; TickBudget's visits in budget
  // mode): it leaves its key when nothing was sent for TRAFFICRATE_IDLE and
  // its socket has nothing queued. Sets *push if siblings must be told, and
  // *quiet_until_ns (if given) to a time before which another look would
  // find nothing to do (0: none known).
  // False if the zone lock could not be had (try again next pass).
  bool ExpireIfIdle(int fd, FdEntry& entry, uint64_t state,
                    const ConnSlotShm& conn, int64_t now_ns, bool* push,
                    int64_t* quiet_until_ns = nullptr);
  // One look at a connection of this process that is registered but not
  // sending by its sends (it left its key, or never joined): a process that
  // cannot reach the zone (a CGI child running as another user) may be
  // writing it. The socket's own count of bytes written says so, and then
  // it joins (JoinSlow). The looks come further apart the longer it rests
  // (kRestFirstLookNs doubling up to kRestLastLookNs, stretched with the
  // watcher's CPU), so that idle keep-alive connections cost little.
  // Returns the time of the next look: now_ns if it joined (visit it
  // again at once), 0 if it is not at rest here.
  int64_t LookAtRest(int fd, FdEntry& entry, uint64_t state,
                     const ConnSlotShm& conn, int64_t now_ns);
  // Budget mode: the ticks until a visit of a connection at rest here
  // should look again (LookAtRest), or otherwise if it is not.
  uint32_t RestGapTicks(int fd, FdEntry& entry, uint64_t state,
                        const ConnSlotShm& conn, int64_t now_ns,
                        uint32_t otherwise);
  // Forgets what LookAtRest knew of connection slot conn: a new rest starts.
  void StartRest(uint32_t conn);
  // Sets the socket's pacing to its key's share if that changed since it
  // was last applied to this fd; true if it did.
  bool ApplyIfChanged(int fd, FdEntry& entry, uint64_t state,
                      const ConnSlotShm& conn);
  // SO_MAX_PACING_RATE of fd to `rate`, noted as conn's pacing in the
  // zone; false (nothing noted) if the kernel refused it.
  bool SetPacing(int fd, const ConnSlotShm& conn, uint64_t rate);
  void Release(uint64_t state);
  void AddLocalRef(uint32_t conn_index, uint32_t cookie);
  bool DropLocalRef(uint32_t conn_index, uint32_t cookie);
  bool ConnValid(const ConnSlotShm& conn, uint64_t state) const;
  // REQUIRES: zone lock held. Whether the key of `conn` has sending
  // connections other than `conn`, whose shares a change must push.
  bool SiblingsSendingLocked(const ConnSlotShm& conn) const;
  uint64_t ShareToken(const KeySlotShm& key) const;
  // The pacing rate for a sending connection of `key`: rate/active in equal
  // mode, the key's level in budget mode.
  uint64_t ShareFor(const KeySlotShm& key) const;
  // Budget mode, watcher: one connection's measurement (SIOCOUTQNSD), its
  // key's share of the tick, and the drain of closed connections.
  void MeasureConn(int fd, FdEntry& entry, uint64_t state, ConnSlotShm& conn,
                   int64_t now_ns);
  // Notes conn's packet size for its key; decides the key if this is the
  // first of its connections seen in the tick.
  void NoteAndDecide(const ConnSlotShm& conn, uint32_t packet_bytes,
                     int64_t now_ns);
  void DecideKey(uint32_t key_index, uint32_t packet_bytes, int64_t now_ns);
  // Whether any closed connection is still draining.
  bool TickDrains(int64_t now_ns);
  // Budget mode, close: keeps a connection closed with unsent data in its
  // key until the kernel has sent it. False if it was not kept. With
  // may_keep_fd, also keeps its socket open through a private duplicate
  // (KeepFd), so that the level still reaches what it sends; not from
  // close_range, which would close that duplicate right after.
  bool KeepDraining(int fd, uint64_t state, bool may_keep_fd);
  void CloseFd(int fd, bool may_keep_fd);
  // Detach, in the process that owns this memory (no SharedWithParent).
  uint64_t DetachHere(int fd);
  // Whether closing or replacing fd concerns the library (a governed fd, a
  // kept drain, or a host's epoll fd).
  bool Concerns(int fd) const;
  // A private duplicate of fd, above the host's fds, for drain `slot`,
  // taken out of the host's epoll sets; -1 if it should not or cannot be.
  int KeepFd(int fd, uint32_t slot);
  // Drain `slot`'s kept fd has been untracked by whoever holds kept_drains_
  // down by one: it is no longer used.
  void DropKept(uint32_t slot);
  // Measures and paces a kept drain; the bytes still unsent, or -1.
  int64_t VisitKept(uint32_t slot, int fd, const ConnSlotShm& conn);
  // Closes drain `slot`'s kept fd, if it has one (the socket then drains on
  // by itself); true if it did.
  bool CloseKept(uint32_t slot);

  Zone* const zone_;
  FdTable* const table_;
  const Logger* const logger_;
  const GovernorOptions options_;
  // What this process knows of each zone connection slot. Idle time is kept
  // per connection, not per fd: a connection written through a dup only is
  // still sending.
  struct LocalConn {
    std::atomic<uint64_t> refs;  // cookie << 32 | fds of this process on it
    std::atomic<int64_t> last_send_ns;
    std::atomic<int64_t> next_measure_ns;  // budget mode
    std::atomic<int64_t> drain_last_ns;    // budget mode, draining
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
    // At rest (LookAtRest): the bytes written to its socket at the first
    // look of this rest (kNoKernelBase: not looked yet), the next look, and
    // the gap before it.
    std::atomic<uint64_t> rest_written;
    std::atomic<int64_t> rest_look_ns;
    std::atomic<int64_t> rest_gap_ns;
  };
  // Budget mode: whether a visit should re-apply a changed level now (see
  // governor_budget.cc).
  bool ApplyDue(const LocalConn& local, const ConnSlotShm& conn,
                uint32_t packet_bytes, int64_t now_ns) const;
  // Between measurements: adds what probably left conn's socket since.
  void EstimateConn(const LocalConn& local, ConnSlotShm& conn, int64_t now_ns);
  static constexpr uint64_t kNoKernelBase = ~uint64_t{0};
  LocalConn* local_ = nullptr;  // zone conn_capacity entries
  CopyBuffers* copy_buffers_ = nullptr;
  // Budget mode, this process's view of each key: the tick in which it
  // last tried to decide it, and the largest packet its connections of the
  // key sent (LocalConn::packet_bytes) in the window that began at
  // window_tick and in the one before (NoteAndDecide).
  struct LocalKey {
    uint32_t tick;
    uint32_t packet_bytes;
    uint32_t packet_before;
    uint32_t window_tick;
  };
  LocalKey* key_local_ = nullptr;  // zone key_capacity entries
  uint32_t tick_ = 0;
  // Budget mode, watcher: how late the latest watcher (this one too) was
  // at the start of this tick (ProcTable::LatestWatcherLateNs); its part of the
  // counts is missing until it runs (BudgetInput::count_late_ns).
  int64_t count_late_ns_ = 0;
  // Budget mode, watcher: the due time of its next tick it last published
  // (ProcSlotShm::watcher_due_ms), and whether this tick came more than
  // kBudgetLateHoldNs after it and published none (TickBudget).
  int64_t published_due_ns_ = 0;
  bool recounting_ = false;
  // Watcher: no connection of this process is idle before then, after a
  // stall (NoteWatcherLate).
  std::atomic<int64_t> not_idle_before_ns_{0};
  // Budget mode, watcher: its CPU allowance, which spaces the
  // per-connection work out while the watcher spends more (cpu_budget.h).
  CpuBudget cpu_;
  // Closed connections still draining: (conn << 32 | cookie), 0 if free.
  static constexpr int kDrainSlots = 1024;
  // A slot being filled in by KeepDraining; TickDrains leaves it alone.
  static constexpr uint64_t kDrainFilling = ~0ULL;
  std::atomic<uint64_t> drains_[kDrainSlots] = {};
  // Per drain slot: the kept fd + 1 (0: none, the drain is modelled at the
  // rate in force at close), the share token last applied to it, and when
  // it is next measured.
  std::atomic<int32_t> drain_fd_[kDrainSlots] = {};
  std::atomic<uint64_t> drain_token_[kDrainSlots] = {};
  std::atomic<int64_t> drain_due_ns_[kDrainSlots] = {};
  static constexpr int kMaxKeptDrains = 256;
  std::atomic<int> kept_drains_{0};
  // The host's epoll fds + 1 (0: free); epolls_unknown_ once there were
  // more than fit, and then no fd is kept.
  static constexpr int kMaxEpolls = 16;
  std::atomic<int32_t> epolls_[kMaxEpolls] = {};
  std::atomic<bool> epolls_unknown_{false};
  Watcher watcher_;
  int32_t pid_;  // getpid() of the process set up (SharedWithParent)
  ProcessToken process_;
  // Releases deferred because the zone lock was held (DeferRelease).
  static constexpr int kDeferredSlots = 1024;
  std::atomic<uint64_t> deferred_[kDeferredSlots] = {};
  std::atomic<int> deferred_count_{0};
  std::atomic<uint64_t> deferred_lost_{0};
  // The watcher's once-a-second look at the zone (CheckZone).
  int64_t next_zone_check_ns_ = 0;
  // Some fd may be kRegisterPending (MarkPending): RegisterPending looks.
  std::atomic<bool> pending_maybe_{false};
  RuleSet rules_;
  uint64_t lock_timeouts_said_ = 0;
  uint64_t deferred_lost_said_ = 0;
  int stalled_checks_ = 0;
  mutable std::atomic<int64_t> last_lock_log_ns_{0};
  mutable std::atomic<int64_t> last_full_log_ns_{0};
  mutable std::atomic<int64_t> last_fd_log_ns_{0};
  mutable std::atomic<int64_t> last_handoff_log_ns_{0};
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_GOVERNOR_H_
