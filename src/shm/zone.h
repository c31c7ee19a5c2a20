// The shared zone: a file that every process of a server maps (see
// zone_segment.h for where it lives and zone_layout.h for what it holds),
// with one count per client key, one slot per governed connection and one
// per process. A Zone is this process's handle on it: it owns the mapping
// and the parts, each with one job, and the zone lock.
//
//   segment()   the mapping, its validation and corruption  zone_segment.h
//   keys()      client keys, hashed into chains              key_table.h
//   conns()     governed connections, joins and leaves       conn_table.h
//   handoffs()  sockets passed between processes             handoff_table.h
//   procs()     processes, their liveness and reaping        proc_table.h
//   settings()  rate, share mode, burst, rules, cluster      zone_settings.h
//   changes()   the futex watchers wait on                   change_word.h
//   ZoneLock    the robust zone lock; repair on EOWNERDEAD   zone_repair.h
//
//   TRAFFICRATE_ASSIGN_OR_RETURN(std::unique_ptr<Zone> zone,
//                                Zone::OpenOrCreate("default", 1 << 20, rate));
//   uint32_t conn = kNoSlot;
//   {
//     ZoneLock lock(*zone);  // robust; memory-only critical section
//     if (!lock.ok()) return;
//     uint32_t key = zone->keys().FindOrInsertLocked(key_bytes, now_ns);
//     if (key != kNoSlot) conn = zone->conns().RegisterLocked(key, proc, ...);
//   }
//
// Thread and process safety: functions ending in Locked need a ZoneLock held
// on the same zone (REQUIRES); the rest are safe from any thread or process.
// Slot indices passed in must be below the zone's capacities (checked).

#ifndef TRAFFICRATE_SRC_SHM_ZONE_H_
#define TRAFFICRATE_SRC_SHM_ZONE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "src/base/clock.h"
#include "src/net/key.h"
#include "src/shm/change_word.h"
#include "src/shm/conn_table.h"
#include "src/shm/handoff_table.h"
#include "src/shm/key_table.h"
#include "src/shm/proc_table.h"
#include "src/shm/robust_mutex.h"
#include "src/shm/zone_layout.h"
#include "src/shm/zone_segment.h"
#include "src/shm/zone_settings.h"

namespace trafficrate {

// How long a ZoneLock waits for the zone lock: inside the host's calls
// (accept, send, close) only briefly, so that a holder that stopped (SIGSTOP,
// a debugger, the cgroup freezer, a slow core dump) costs them at most this
// once; the watcher thread and the CLI longer, but never forever.
inline constexpr int64_t kHostLockWaitNs = 15'000'000;
inline constexpr int64_t kWatcherLockWaitNs = 100'000'000;
// The watcher's look, once per loop, whether a stalled lock is free again.
inline constexpr int64_t kLockRecheckWaitNs = 20'000'000;

class Zone {
 public:
  // ZoneSegment::OpenOrCreate; then an existing zone's live rate is set to
  // rate_bytes_per_sec when it differs (the last server started with a rate
  // wins; `trafficrate set` changes it).
  static absl::StatusOr<std::unique_ptr<Zone>> OpenOrCreate(
      absl::string_view zone_name, uint64_t size_bytes,
      uint64_t rate_bytes_per_sec, const KeySpec& key_spec = KeySpec(),
      ZoneOpenNotes* notes = nullptr, const ZonePlaces* places = nullptr);
  // ZoneSegment::Attach and AttachPath (for the CLI): an existing zone of
  // any size and key spec, by name or by path.
  static absl::StatusOr<std::unique_ptr<Zone>> Attach(
      absl::string_view zone_name, const ZonePlaces* places = nullptr);
  static absl::StatusOr<std::unique_ptr<Zone>> AttachPath(
      const std::string& path);

  ~Zone();
  Zone(const Zone&) = delete;
  Zone& operator=(const Zone&) = delete;

  // The parts. Each lives as long as the Zone.
  ZoneSegment& segment() { return *segment_; }
  const ZoneSegment& segment() const { return *segment_; }
  KeyTable& keys() { return keys_; }
  const KeyTable& keys() const { return keys_; }
  ConnTable& conns() { return conns_; }
  const ConnTable& conns() const { return conns_; }
  HandoffTable& handoffs() { return handoffs_; }
  const HandoffTable& handoffs() const { return handoffs_; }
  ProcTable& procs() { return procs_; }
  const ProcTable& procs() const { return procs_; }
  ZoneSettings& settings() { return settings_; }
  const ZoneSettings& settings() const { return settings_; }
  ChangeWord& changes() { return changes_; }
  const ChangeWord& changes() const { return changes_; }

  // Where the zone's parts take the time from (a join's stamp, the
  // staleness of the fleet's beat, a snapshot): the real clock unless a
  // test gives its own, which must outlive the Zone.
  const Clock& clock() const { return *clock_; }
  void UseClock(const Clock* clock);

  // The segment's header, name and path.
  ZoneHeaderShm& header() const { return segment_->header(); }
  const std::string& name() const { return segment_->name(); }
  const std::string& path() const { return segment_->path(); }

  // Reaps every process that died (ProcTable::ReapIfDeadLocked on each live
  // slot of the scan whose liveness peek says it may be dead), taking the
  // lock per process and waking watchers if any was reaped. Returns the
  // connections released; *procs gets the processes reaped. Not for the hot
  // path.
  uint32_t ReapDead(uint32_t* procs);
  // Rebuilds the tables from the connection slots (RepairZoneLocked). Called
  // when the zone lock was taken over from a dead owner.
  void RepairLocked();

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

 private:
  explicit Zone(std::unique_ptr<ZoneSegment> segment);
  static absl::StatusOr<std::unique_ptr<Zone>> FromSegment(
      absl::StatusOr<std::unique_ptr<ZoneSegment>> segment);

  std::unique_ptr<ZoneSegment> segment_;
  const Clock* clock_ = &MonotonicClock();
  ChangeWord changes_;
  ZoneSettings settings_;
  KeyTable keys_;
  ConnTable conns_;
  HandoffTable handoffs_;
  ProcTable procs_;
  friend class ZoneLock;
  std::atomic<bool> lock_stalled_{false};
  std::atomic<uint64_t> lock_timeouts_{0};
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
