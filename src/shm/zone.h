// The shared zone: a file in a directory of its user's own (zone_file.h:
// /run/trafficrate/<zone> for root, /dev/shm/trafficrate-UID/<zone> for
// others) that every process of a server maps, holding one count per client
// key, one slot per governed connection and one per process (see
// zone_layout.h).
//
//   TRAFFICRATE_ASSIGN_OR_RETURN(std::unique_ptr<Zone> zone,
//                                Zone::OpenOrCreate("default", 1 << 20, rate));
//   uint32_t conn = kNoSlot;
//   {
//     ZoneLock lock(*zone);  // robust; memory-only critical section
//     if (!lock.ok()) return;
//     uint32_t key = zone->FindOrInsertKeyLocked(key_bytes, now_ns);
//     if (key != kNoSlot) conn = zone->RegisterConnLocked(key, proc, fd, ...);
//   }
//
// Thread and process safety: functions ending in Locked need a ZoneLock held
// on the same zone (REQUIRES); the rest are safe from any thread or process.
// Slot indices passed in must be below the zone's capacities (checked).

#ifndef TRAFFICRATE_SRC_SHM_ZONE_H_
#define TRAFFICRATE_SRC_SHM_ZONE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "src/budget/budget.h"
#include "src/net/key.h"
#include "src/shm/zone_layout.h"

namespace trafficrate {

// A robust mutex in shared memory that this thread holds. glibc links the
// robust mutexes a thread holds into a list through pointers kept in each
// mutex, and follows them when it unlocks one; anything else that maps the
// zone can overwrite them. Release unlocks only if what glibc will follow is
// still sane: the kind and owner the mutex had when it was taken, and links
// that point into the zone's mapping or at this thread's own list head. So no
// write into the zone can make glibc write outside the mapping.
struct HeldMutex {
  // After the lock was taken (and made consistent). [base, base + size) is
  // the mapping it lives in.
  void Hold(pthread_mutex_t* mutex, const void* base, size_t size);
  // Unlocks the mutex Hold saved, if any. False if it was damaged: it is then
  // left locked (the zone is unusable anyway; the caller marks it corrupt).
  bool Release();

  pthread_mutex_t* mutex = nullptr;
  int kind = 0;
  int tid = 0;
  uintptr_t lo = 0;
  uintptr_t hi = 0;
};

// In a child made with a raw clone system call (not glibc's fork, which
// does this itself): registers the calling thread's robust mutex list with
// the kernel again (the clone cleared it), so that the zone locks this
// thread takes pass HeldMutex's check of their links (else the first
// unlock would find the zone "corrupt") and the liveness and zone locks it
// dies holding are marked owner-died. No-op where the kernel has a list.
// Not for the hot path: a few system calls, once per new process.
void ReregisterRobustList();

// How a zone of a given size is divided; a pure function of the size.
struct ZoneGeometry {
  uint32_t bucket_count = 0;
  uint32_t key_capacity = 0;
  uint32_t conn_capacity = 0;
  uint32_t proc_capacity = 0;
  uint32_t handoff_capacity = 0;
  uint64_t buckets_offset = 0;
  uint64_t keys_offset = 0;
  uint64_t conns_offset = 0;
  uint64_t procs_offset = 0;
  uint64_t handoffs_offset = 0;
};

inline constexpr uint64_t kMinZoneSize = 64 * 1024;
// How long a ZoneLock waits for the zone lock: inside the host's calls
// (accept, send, close) only briefly, so that a holder that stopped (SIGSTOP,
// a debugger, the cgroup freezer, a slow core dump) costs them at most this
// once; the watcher thread and the CLI longer, but never forever.
inline constexpr int64_t kHostLockWaitNs = 15'000'000;
inline constexpr int64_t kWatcherLockWaitNs = 100'000'000;
// The watcher's look, once per loop, whether a stalled lock is free again.
inline constexpr int64_t kLockRecheckWaitNs = 20'000'000;
inline constexpr uint64_t kMaxZoneSize = 1ULL << 30;

// REQUIRES: kMinZoneSize <= size_bytes <= kMaxZoneSize.
ZoneGeometry ComputeZoneGeometry(uint64_t size_bytes);

// The checksum of a header's immutable part (ZoneHeaderShm::header_checksum).
uint64_t ZoneHeaderChecksum(const ZoneHeaderShm& header);

struct ZonePlaces;

// What Zone::OpenOrCreate found on its way, for the lines a server logs.
struct ZoneOpenNotes {
  // A corrupt zone of that name was replaced by a fresh one.
  bool replaced_corrupt = false;
  // Not empty when the zone's usual place was taken by something not the
  // user's own: the line that says what, and where the zone lives instead
  // (ZonePlaceNotes::Line).
  std::string placement;
  // A file of this user at an earlier version's place for the zone
  // (/dev/shm/trafficrate.NAME): servers still running that version use
  // it, not this zone.
  std::string legacy_path;
};

class Zone {
 public:
  // Creates the zone of the calling user (geteuid; or of `places`) if it
  // does not exist (size_bytes reserved, live rate set to
  // rate_bytes_per_sec, keys built with key_spec), or attaches to it. An
  // existing zone must have the same layout version, size and key spec, else
  // FailedPreconditionError naming it. Too little room for a new zone is
  // ResourceExhausted (zone_file.h), never a SIGBUS.
  // An existing zone's live rate is set to rate_bytes_per_sec when it differs
  // (the last server started with a rate wins; `trafficrate set` changes it).
  // An existing zone found corrupt (its header checksum does not match, or a
  // process marked it so) is replaced by a fresh one: the processes still
  // using the old one pass through until they restart.
  static absl::StatusOr<std::unique_ptr<Zone>> OpenOrCreate(
      absl::string_view zone_name, uint64_t size_bytes,
      uint64_t rate_bytes_per_sec, const KeySpec& key_spec = KeySpec(),
      ZoneOpenNotes* notes = nullptr, const ZonePlaces* places = nullptr);

  // Where the CLI finds zone `zone_name` (a path, starting with '/', is
  // taken as it is): the calling user's own zone; for
  // root, else the one other user's of that name (several: an error naming
  // their paths); else an earlier version's /dev/shm/trafficrate.NAME.
  // NotFoundError, saying where it looked, if there is none.
  static absl::StatusOr<std::string> Locate(absl::string_view zone_name,
                                            const ZonePlaces* places = nullptr);
  // Attaches to an existing zone of any size (for the CLI): Locate, then
  // AttachPath. NotFoundError if there is none; DataLossError if it is
  // corrupt (IsCorruptZone).
  static absl::StatusOr<std::unique_ptr<Zone>> Attach(
      absl::string_view zone_name, const ZonePlaces* places = nullptr);
  // Attaches to the zone file at `path` (never through a symlink).
  static absl::StatusOr<std::unique_ptr<Zone>> AttachPath(
      const std::string& path);

  // Removes the calling user's zone of that name (or of `places`); processes
  // that have it mapped keep using it.
  static absl::Status Unlink(absl::string_view zone_name,
                             const ZonePlaces* places = nullptr);
  static absl::Status UnlinkPath(const std::string& path);

  // Whether an Attach or OpenOrCreate error means the zone is corrupt.
  static bool IsCorruptZone(const absl::Status& status);
  // Whether it means the zone has another layout version (made by another
  // trafficrate version; FailedPreconditionError): never read or replaced,
  // since servers of that version may use it.
  static bool IsOtherLayout(const absl::Status& status);

  ~Zone();
  Zone(const Zone&) = delete;
  Zone& operator=(const Zone&) = delete;

  ZoneHeaderShm& header() const { return *header_; }
  const std::string& name() const { return name_; }
  // Where its file was when it was mapped.
  const std::string& path() const { return path_; }
  // The geometry, as validated when the zone was mapped: a copy private to
  // the process, so that nothing written into the zone afterwards (a bug,
  // a stray write, an attack) can move an index out of the mapping.
  uint32_t key_capacity() const { return key_capacity_; }
  uint32_t conn_capacity() const { return conn_capacity_; }
  uint32_t proc_capacity() const { return proc_capacity_; }
  uint32_t handoff_capacity() const { return handoff_capacity_; }
  // The TRAFFICRATE_KEY the zone's keys were built with.
  KeySpec key_spec() const;

  // REQUIRES: index below the matching capacity.
  KeySlotShm& key(uint32_t index) const { return keys_[index]; }
  ConnSlotShm& conn(uint32_t index) const { return conns_[index]; }
  // REQUIRES: conn is one of this zone's connection slots.
  uint32_t ConnIndexOf(const ConnSlotShm& conn) const {
    return static_cast<uint32_t>(&conn - conns_);
  }
  ProcSlotShm& proc(uint32_t index) const { return procs_[index]; }
  HandoffSlotShm& handoff(uint32_t index) const { return handoffs_[index]; }

  // The mapping, for HeldMutex.
  const void* base() const { return base_; }
  size_t size() const { return size_; }

  // Hash bucket of key bytes under this zone's seed.
  uint32_t BucketOf(const uint8_t* key_bytes) const;

  // Returns the key's slot, or kNoSlot.
  uint32_t FindKeyLocked(const uint8_t* key_bytes) const;
  // Returns the key's slot, inserting it (refs 0) if absent; kNoSlot if full.
  uint32_t FindOrInsertKeyLocked(const uint8_t* key_bytes, int64_t now_ns);
  // The registration of key_index's connection from peer:peer_port, made by
  // another process (the one that accepted a socket an exec'd process
  // inherited); kNoSlot if there is none. Looks at the connection slots in
  // use until it has seen the key's; not for the hot path.
  uint32_t FindConnLocked(uint32_t key_index, const uint8_t peer[16],
                          uint16_t peer_port) const;
  // Takes a connection slot for key_index owned by proc_index, not active.
  // Returns kNoSlot if the connection table is full. The caller frees an
  // unused key (refs 0) with ReleaseKeyIfUnusedLocked.
  uint32_t RegisterConnLocked(uint32_t key_index, uint32_t proc_index, int fd,
                              const uint8_t peer[16], uint16_t peer_port);
  void ReleaseKeyIfUnusedLocked(uint32_t key_index);
  // Join/Leave return true when the key's membership changed (generation
  // bumped); the caller wakes watchers after unlocking.
  bool JoinLocked(uint32_t conn_index);
  bool LeaveLocked(uint32_t conn_index);
  // Leaves, then frees the connection, and its key once unused.
  bool DeregisterConnLocked(uint32_t conn_index);
  void TransferConnLocked(uint32_t conn_index, uint32_t proc_index, int fd);
  // Sockets passed between processes (HandoffSlotShm). A sender publishes
  // a governed connection before the socket leaves it; the receiver takes
  // it over by the socket's inode. REQUIRES (Locked): zone lock held.
  //
  // Notes that proc passes connection conn (cookie), whose socket has
  // `inode`; false if every slot holds another pending handoff.
  bool PublishHandoffLocked(uint64_t inode, uint32_t conn, uint32_t cookie,
                            uint32_t proc, int64_t now_ns);
  // Takes the handoff of socket `inode`: its connection slot (and *cookie),
  // if that connection is still the one passed; else kNoSlot.
  uint32_t TakeHandoffLocked(uint64_t inode, uint32_t* cookie);
  // Withdraws proc's handoff of `inode` (the send failed).
  void WithdrawHandoffLocked(uint64_t inode, uint32_t proc);
  // Whether connection conn (cookie) is passed and not yet received.
  bool HandoffPendingLocked(uint32_t conn, uint32_t cookie) const;
  // Removes up to `max` of proc's handoffs made before before_ns, storing
  // each as (conn << 32 | cookie) in out (the rest stay for another call).
  // Returns how many it removed.
  uint32_t ExpireHandoffsLocked(uint32_t proc, int64_t before_ns, uint64_t* out,
                                uint32_t max);
  // Lock-free peeks: whether any handoff is pending at all (a bound that
  // skips the others); whether a handoff of `inode` may be waiting; whether
  // proc has one made before before_ns; whether conn (cookie) may be passed.
  bool AnyHandoffs() const;
  bool MayHaveHandoff(uint64_t inode) const;
  bool HasOldHandoffs(uint32_t proc, int64_t before_ns) const;
  bool MayBeHandedOff(uint32_t conn, uint32_t cookie) const;
  // Budget mode, lock-free, by the connection's owner: whether it sends
  // less than its pacing allows (KeySlotShm::under_pace). Only an active
  // connection is counted; a leave takes it off the count.
  void SetUnderPace(uint32_t conn_index, bool under);
  // Claims a free process slot for pid and locks its liveness mutex from the
  // calling thread, which must hold it for the life of the process (and
  // release it through *liveness). Reaps first the slots of the same pid
  // whose owner died (this process before an exec: the kernel marked its
  // liveness mutex owner-died then, and this process registers its
  // connections anew) and, if
  // no slot is free, dead slots of other processes until one is: a dead
  // process never keeps a live one from its slot. *conns_reaped (if given)
  // gets the connections those held (the caller wakes the watchers).
  uint32_t ClaimProcLocked(int32_t pid, int64_t now_ns,
                           HeldMutex* liveness = nullptr,
                           uint32_t* conns_reaped = nullptr);
  // How far past its due time (ProcSlotShm::watcher_due_ms) the latest
  // watcher of a live process that owns connections is, at now_ns; 0 if
  // none is late. One later than max_late_ns is left out: its process is
  // stopped or frozen, not late. A bounded walk, no lock.
  int64_t LatestWatcherLateNs(int64_t now_ns, int64_t max_late_ns) const;
  // If proc_index's owner died (its liveness mutex reports EOWNERDEAD),
  // deregisters everything it owned, frees the slot and returns true.
  bool ReapIfDeadLocked(uint32_t proc_index, uint32_t* conns_reaped);
  // Reaps every process that died (ReapIfDeadLocked on each live slot whose
  // liveness peek says it may be dead), taking the lock per process and
  // waking watchers if any was reaped. Returns the connections released;
  // *procs gets the processes reaped. Not for the hot path.
  uint32_t ReapDead(uint32_t* procs);
  // ReapDead scans every process slot once in this many passes (about a
  // minute at the watcher's pass every 250 ms), and only those below the
  // header's procs_high_water in between. A full scan touches every slot
  // (3.3 MB in a 32 MB zone: 3 ms), and each watcher makes its own: at 16
  // passes, four watchers' scans were 5% of their run time at 10 000
  // connections (an eighth of their work outside interrupts). Only a slot
  // claimed by a process of an older version can lie above the high water.
  static constexpr uint32_t kFullReapEvery = 256;
  // Rebuilds keys, chains and free lists from the connection slots. Called
  // when the zone lock was taken over from a dead owner.
  void RepairLocked();

  // Bumps the settings generation so every socket's share is recomputed.
  void SetRate(uint64_t rate_bytes_per_sec);
  // TRAFFICRATE_SHARE and TRAFFICRATE_BURST (0: the default for the rate),
  // live settings like the rate: the last server started sets them.
  void SetShare(ShareMode mode, uint64_t burst_bytes);
  ShareMode share_mode() const;
  // The burst in force: the setting, or DefaultBurstBytes of the live rate.
  uint64_t burst_bytes() const { return RuleBurst(0); }
  // The live rate and burst of a rule, for the budget controller.
  BudgetSettings budget_settings(uint32_t rule = 0) const;
  // A key's rate on this host: its rule's rate, or, while the zone's
  // cluster agent is alive (its beat at most kClusterStaleNs old), this
  // host's share of it across the fleet (KeySlotShm::cluster_share, at most
  // the rule's rate). Lock-free, no allocation: the hot path's.
  uint64_t KeyRate(const KeySlotShm& key) const;
  // budget_settings of the key's rule with KeyRate as the rate (a default
  // burst follows it).
  BudgetSettings key_budget_settings(const KeySlotShm& key) const;
  // The cluster agent's shared state (zone_layout.h).
  ClusterShm& cluster() const { return header_->cluster; }

  // Rules (RuleSlotShm): a key's rule is its byte kKeyRuleByte. Rule 0 is
  // the header's rate, key spec and burst. Lock-free; any index is safe (one
  // out of range reads as an unused rule).
  static uint32_t RuleOfKeyBytes(const uint8_t* key_bytes);
  uint32_t RuleOf(const KeySlotShm& key) const;
  // The live rate (0: the rule is unused), its burst in force and the key
  // spec its keys are built with.
  uint64_t RuleRate(uint32_t rule) const;
  uint64_t RuleBurst(uint32_t rule) const;
  KeySpec RuleKeySpec(uint32_t rule) const;
  // Its name, printable ASCII ("default" for an unnamed rule 0, "rule N"
  // for an unnamed other one). Allocates; not for the hot path.
  std::string RuleName(uint32_t rule) const;
  // The rule of that name, or kNoSlot. An empty name is rule 0's when it
  // has none. Not for the hot path.
  uint32_t FindRule(absl::string_view name) const;
  // Writes rule `rule` (1..kZoneRules-1; rule 0 takes only the name, its
  // settings are SetRate and SetShare's): name (cut to kRuleNameBytes - 1),
  // live rate, burst (0: the default for the rate) and key spec; bumps the
  // settings generation and wakes the watchers, like SetRate.
  void SetRule(uint32_t rule, absl::string_view name,
               uint64_t rate_bytes_per_sec, uint64_t burst_bytes,
               const KeySpec& key_spec);
  // One rule's live rate (rule 0: SetRate).
  void SetRuleRate(uint32_t rule, uint64_t rate_bytes_per_sec);
  // The zone rule for a rules file's rule `name` whose keys are built with
  // `key_spec`, for start-up and reload: every process of a server maps a
  // file's rules alike because each does it under the zone lock. The slot
  // named so, if its key spec is the same (rule 0: the zone's key spec);
  // else a free one (no name, no rate), whose name it writes at once (the
  // caller sets its settings with SetRule after unlocking). A slot of that
  // name with another key spec loses its name: its keys keep their rate
  // under "rule N" until they close. kNoSlot when every slot is taken.
  // REQUIRES: zone lock held.
  uint32_t MapRuleLocked(absl::string_view name, const KeySpec& key_spec);

  // Corruption, checked at attach and by every watcher once a second: false
  // once the header's checksum no longer matches (or any process found so
  // and marked the zone). Then the zone is marked corrupt for every process,
  // and this process stops using it: ZoneLock fails at once, and the
  // Governor passes everything through. Lock-free.
  bool CheckHeader();
  // The same look without marking anything (the CLI, snapshots).
  bool HeaderIntact() const;
  // The error a corrupt zone gets (DataLoss), saying what to do about it.
  absl::Status CorruptStatus(absl::string_view why) const;
  // Marks the zone corrupt for every process (see CheckHeader); `why` (a
  // string literal) is what this process found.
  void MarkCorrupt(const char* why);
  // Tests only: forgets the mark, here and in the zone, so that a test can
  // go on feeding garbage to code that would otherwise stop using the zone.
  void ForgetCorruptionForTesting();
  // What this process found, once corrupt().
  const char* corrupt_why() const {
    return corrupt_why_.load(std::memory_order_acquire);
  }
  // This process found (or was told) the zone corrupt.
  bool corrupt() const { return corrupt_.load(std::memory_order_acquire); }

  // The zone lock. After a ZoneLock gave up waiting, the lock counts as
  // stalled in this process: later ZoneLocks only try it, at no cost, until
  // one gets it. The watcher calls RecheckLock once per loop while it is
  // stalled: it waits kLockRecheckWaitNs for it. Returns true once it is free.
  bool lock_stalled() const {
    return lock_stalled_.load(std::memory_order_relaxed);
  }
  bool RecheckLock();
  // Locks this process gave up (also counted in header().lock_timeouts).
  uint64_t lock_timeouts() const {
    return lock_timeouts_.load(std::memory_order_relaxed);
  }
  // The thread id the lock word names as its holder (0: free).
  int32_t LockHolder() const;

  // Futex on header().change_word, shared by all processes.
  uint32_t ChangeWord() const;
  void WakeWatchers();
  // Returns when the change word differs from `seen`, on a wake, or after
  // timeout_ns (spurious returns possible).
  void WaitForChange(uint32_t seen, int64_t timeout_ns);

  // Lock-free peek at a live process's liveness mutex: true if its owner
  // may have died. ReapIfDeadLocked gives the authoritative answer.
  static bool ProcMaybeDead(const ProcSlotShm& proc);

  // The cookie an fd entry keeps for a connection slot in use.
  static uint32_t CookieOf(uint32_t seq) { return seq & 0x7fffffffu; }

 private:
  // ClaimProcLocked's claim of a free slot; kNoSlot if none is free.
  uint32_t ClaimFreeProcLocked(int32_t pid, int64_t now_ns,
                               HeldMutex* liveness);
  // REQUIRES: base holds a validated zone of `size` bytes.
  Zone(std::string name, std::string path, void* base, size_t size);
  static absl::StatusOr<std::unique_ptr<Zone>> Map(absl::string_view zone_name,
                                                   const std::string& path,
                                                   int fd, uint64_t size_bytes,
                                                   bool creator,
                                                   uint64_t rate_bytes_per_sec,
                                                   uint32_t key_spec);
  void UnlinkKeyLocked(uint32_t key_index);
  // Frees handoff slot `index` (and its connection's mark of it).
  void ClearHandoffLocked(uint32_t index);
  // Budget mode: a join or leave sets the key's level at once
  // (LevelAfterMembershipChange), before the next tick.
  void AdjustLevelLocked(KeySlotShm& key, uint32_t before, uint32_t after);
  void FreeKeyLocked(uint32_t key_index);
  // Takes a connection off its key's under_pace count if it is on it.
  void DropUnderPace(ConnSlotShm& conn);

  std::string name_;
  std::string path_;
  void* base_;
  size_t size_;
  ZoneHeaderShm* header_;
  // Copied from the header once it was validated (Map); never reread.
  uint32_t key_capacity_;
  uint32_t conn_capacity_;
  uint32_t proc_capacity_;
  uint32_t handoff_capacity_;
  uint32_t bucket_count_;  // a power of two
  uint32_t* buckets_;
  KeySlotShm* keys_;
  ConnSlotShm* conns_;
  ProcSlotShm* procs_;
  HandoffSlotShm* handoffs_;
  friend class ZoneLock;
  std::atomic<bool> corrupt_{false};
  std::atomic<const char*> corrupt_why_{nullptr};
  std::atomic<bool> lock_stalled_{false};
  std::atomic<uint64_t> lock_timeouts_{0};
  // Any thread may reap (the watcher, a test, the CLI).
  std::atomic<uint32_t> reap_passes_{0};
};

// Holds the zone lock for a scope, waiting at most wait_ns for it (and not at
// all while the lock is stalled in this process, see Zone::RecheckLock). On
// EOWNERDEAD (the last holder died) the zone is repaired before the lock is
// marked consistent. ok() is false if the lock was not taken (timed out,
// stalled, or the zone is corrupt); the caller must then pass through, and
// retry later if it matters.
class ZoneLock {
 public:
  explicit ZoneLock(Zone& zone, int64_t wait_ns = kHostLockWaitNs);
  ~ZoneLock();
  ZoneLock(const ZoneLock&) = delete;
  ZoneLock& operator=(const ZoneLock&) = delete;
  bool ok() const { return locked_; }

 private:
  friend class Zone;
  enum class Mode { kNormal, kRecheck };
  ZoneLock(Zone& zone, int64_t wait_ns, Mode mode);

  Zone& zone_;
  bool locked_ = false;
  bool repaired_ = false;
  HeldMutex held_;
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_SHM_ZONE_H_
