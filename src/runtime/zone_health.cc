#include "src/runtime/zone_health.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>

namespace trafficrate {
namespace {

// A lock still held after this many once-a-second checks, by a thread that
// does not exist, marks the zone corrupt.
constexpr int kStalledChecksForCorrupt = 3;

}  // namespace

bool ZoneHealth::Check(int64_t now_ns) {
  if (zone_->segment().corrupt()) return PassThroughCorrupt();
  rules_.ReloadIfAsked(watcher_.proc_index());
  rules_.FreeRetired(/*force=*/false);
  if (zone_->lock_stalled() && !zone_->RecheckLock()) {
    if (now_ns < next_check_ns_) return true;
  } else {
    stalled_checks_ = 0;
    registry_.FinishDeferredReleases();
    registry_.RegisterPending();
    passing_.ExpireHandoffs(now_ns);
    if (now_ns < next_check_ns_) return true;
  }
  next_check_ns_ = now_ns + kNsPerSec;
  if (!zone_->segment().CheckHeader()) return PassThroughCorrupt();
  const int32_t holder = zone_->LockHolder();
  if (zone_->lock_stalled() && ++stalled_checks_ >= kStalledChecksForCorrupt) {
    // Held for seconds by a thread that does not exist: nothing will ever
    // free it (a write into the zone forged the lock word).
    char path[32];
    std::snprintf(path, sizeof(path), "/proc/%d", holder);
    if (holder == 0 || access(path, F_OK) != 0) {
      zone_->segment().MarkCorrupt(
          "its lock is held by a thread that does not exist");
      return PassThroughCorrupt();
    }
  }
  const uint64_t timeouts = zone_->lock_timeouts();
  if (timeouts != lock_timeouts_said_ &&
      Logger::Allow(last_lock_log_ns_, now_ns)) {
    logger_->Warning(
        "zone %s: the zone lock %s (held by thread %d); %llu call(s) of "
        "process %d went on without it, their connections unpaced until "
        "the watcher retries",
        zone_->name().c_str(),
        zone_->lock_stalled() ? "is held for too long" : "was held too long",
        holder, static_cast<unsigned long long>(timeouts - lock_timeouts_said_),
        static_cast<int>(getpid()));
    lock_timeouts_said_ = timeouts;
  }
  const uint64_t lost = registry_.deferred_lost();
  if (lost != deferred_lost_said_) {
    logger_->Warning(
        "zone %s: %llu closed connection(s) of process %d stay counted "
        "until it exits (too many closes while the zone lock was held)",
        zone_->name().c_str(),
        static_cast<unsigned long long>(lost - deferred_lost_said_),
        static_cast<int>(getpid()));
    deferred_lost_said_ = lost;
  }
  return true;
}

bool ZoneHealth::PassThroughCorrupt() {
  PassThroughAll();
  const char* why = zone_->segment().corrupt_why();
  logger_->Error(
      "zone %s is corrupt (%s); process %d passes every connection through "
      "unpaced from now on; the next server started replaces the zone",
      zone_->name().c_str(), why != nullptr ? why : "unknown",
      static_cast<int>(getpid()));
  return false;
}

void ZoneHealth::PassThroughAll() {
  const int high_water = table_->high_water();
  for (int fd = 0; fd < high_water; ++fd) {
    FdEntry& entry = *table_->Get(fd);
    const uint64_t state = entry.state.load(std::memory_order_acquire);
    if (state == 0 || FdState::From(state).kept_drain()) continue;
    // Pinned, so that the host cannot close the fd meanwhile (a close
    // clears the state first, then waits for the pin).
    if (!FdTable::TryPin(entry, state, /*wait=*/true)) continue;
    // A pending one too: it was paced at its rule's rate (MarkPending). An
    // inherited socket's group was not: it waits for its first send.
    if (state == FdState::Pending().word() || !FdState::From(state).pending()) {
      setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &kUnpaced,
                 sizeof(kUnpaced));
    }
    uint64_t expected = state;
    entry.state.compare_exchange_strong(expected, 0, std::memory_order_acq_rel);
    FdTable::Unpin(entry);
  }
  drains_.PassThrough();
}

}  // namespace trafficrate
