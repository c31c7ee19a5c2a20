#include "src/shm/zone.h"

#include <errno.h>
#include <pthread.h>

#include <utility>

#include "src/shm/zone_repair.h"

namespace trafficrate {

Zone::Zone(std::unique_ptr<ZoneSegment> segment)
    : segment_(std::move(segment)),
      changes_(segment_->header()),
      settings_(segment_->header(), changes_),
      keys_(segment_->tables()),
      conns_(segment_->tables(), keys_, settings_),
      handoffs_(segment_->tables()),
      procs_(*segment_, conns_, handoffs_) {}

Zone::~Zone() = default;

void Zone::UseClock(const Clock* clock) {
  clock_ = clock;
  settings_.UseClock(clock);
  conns_.UseClock(clock);
}

absl::StatusOr<std::unique_ptr<Zone>> Zone::FromSegment(
    absl::StatusOr<std::unique_ptr<ZoneSegment>> segment) {
  if (!segment.ok()) return segment.status();
  return std::unique_ptr<Zone>(new Zone(std::move(*segment)));
}

absl::StatusOr<std::unique_ptr<Zone>> Zone::OpenOrCreate(
    absl::string_view zone_name, uint64_t size_bytes,
    uint64_t rate_bytes_per_sec, const KeySpec& key_spec, ZoneOpenNotes* notes,
    const ZonePlaces* places) {
  absl::StatusOr<std::unique_ptr<Zone>> zone =
      FromSegment(ZoneSegment::OpenOrCreate(
          zone_name, size_bytes, rate_bytes_per_sec, key_spec, notes, places));
  if (zone.ok() &&
      (*zone)->header().rate_bytes_per_sec.load() != rate_bytes_per_sec) {
    (*zone)->settings().SetRate(rate_bytes_per_sec);
  }
  return zone;
}

absl::StatusOr<std::unique_ptr<Zone>> Zone::Attach(absl::string_view zone_name,
                                                   const ZonePlaces* places) {
  return FromSegment(ZoneSegment::Attach(zone_name, places));
}

absl::StatusOr<std::unique_ptr<Zone>> Zone::AttachPath(
    const std::string& path) {
  return FromSegment(ZoneSegment::AttachPath(path));
}

uint32_t Zone::ReapDead(uint32_t* procs) {
  uint32_t conns = 0;
  uint32_t reaped_procs = 0;
  const uint32_t limit = procs_.NextReapScanLimit();
  for (uint32_t p = 0; p < limit; ++p) {
    if (procs_.slot(p).state.load(std::memory_order_acquire) != kProcLive ||
        !ProcTable::MaybeDead(procs_.slot(p))) {
      continue;
    }
    uint32_t reaped = 0;
    ZoneLock lock(*this);
    if (!lock.ok()) break;
    if (procs_.ReapIfDeadLocked(p, &reaped)) {
      ++reaped_procs;
      conns += reaped;
    }
  }
  if (reaped_procs > 0) changes_.WakeWatchers();
  if (procs != nullptr) *procs = reaped_procs;
  return conns;
}

void Zone::RepairLocked() { RepairZoneLocked(segment_->tables(), keys_); }

int32_t Zone::LockHolder() const { return MutexHolder(header().lock); }

bool Zone::RecheckLock() {
  if (!lock_stalled()) return true;
  ZoneLock lock(*this, kLockRecheckWaitNs, ZoneLock::Mode::kRecheck);
  return lock.ok();
}

ZoneLock::ZoneLock(Zone& zone, int64_t wait_ns)
    : ZoneLock(zone, wait_ns, Mode::kNormal) {}

ZoneLock::ZoneLock(Zone& zone, int64_t wait_ns, Mode mode) : zone_(zone) {
  ZoneSegment& segment = zone_.segment();
  if (segment.corrupt()) return;
  pthread_mutex_t* mutex = &zone_.header().lock;
  int rc;
  if ((mode == Mode::kNormal && zone_.lock_stalled()) || wait_ns <= 0) {
    rc = pthread_mutex_trylock(mutex);
  } else {
    rc = TimedLock(mutex, wait_ns);
  }
  if (rc == EOWNERDEAD) {
    // The last holder died inside a critical section: rebuild everything that
    // could be half-written before anyone else sees it.
    zone_.RepairLocked();
    pthread_mutex_consistent(mutex);
    repaired_ = true;
    rc = 0;
  }
  if (rc == ETIMEDOUT || rc == EBUSY) {
    // Held too long, or still held after an earlier timeout: the caller
    // passes through.
    zone_.lock_timeouts_.fetch_add(1, std::memory_order_relaxed);
    zone_.header().lock_timeouts.fetch_add(1, std::memory_order_relaxed);
    if (rc == ETIMEDOUT) {
      zone_.lock_stalled_.store(true, std::memory_order_relaxed);
    }
    return;
  }
  if (rc != 0) {
    // A lock no call can take (EINVAL, EDEADLK, EAGAIN, ENOTRECOVERABLE):
    // a write into the zone broke it, or a repair died half-way.
    segment.MarkCorrupt("its lock is broken");
    return;
  }
  if (zone_.lock_stalled()) {
    zone_.lock_stalled_.store(false, std::memory_order_relaxed);
  }
  const ZoneTables& tables = segment.tables();
  held_.Hold(mutex, tables.base, tables.size);
  locked_ = true;
}

ZoneLock::~ZoneLock() {
  // A lock changed under its holder: something writes into the zone.
  if (locked_ && !held_.Release()) {
    zone_.segment().MarkCorrupt("its lock changed while this process held it");
  }
  // Every generation moved: let all watchers re-apply, outside the lock.
  if (repaired_) zone_.changes().WakeWatchers();
}

}  // namespace trafficrate
