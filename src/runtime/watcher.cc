#include "src/runtime/watcher.h"

#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>

#include "src/base/clock.h"
#include "src/base/library_thread.h"

namespace trafficrate {
namespace {

constexpr int64_t kStartWaitNs = 200 * kNsPerMs;
constexpr size_t kStackBytes = 256 * 1024;

// The process's pid as /proc shows it, which is what `trafficrate stat`
// and `rm` see: in a new PID namespace (a container's, or a server's
// sandbox) getpid() says 1 or another small number of that namespace.
int32_t PidInProc() {
  char buf[32];
  const ssize_t n = readlink("/proc/self", buf, sizeof(buf) - 1);
  if (n > 0) {
    buf[n] = '\0';
    char* end = nullptr;
    const long pid = std::strtol(buf, &end, 10);
    if (end != buf && *end == '\0' && pid > 0 && pid <= INT32_MAX) {
      return static_cast<int32_t>(pid);
    }
  }
  return static_cast<int32_t>(getpid());
}

// The zone's change word, as the loop waits on it.
class ZoneChanges final : public ChangeSignal {
 public:
  explicit ZoneChanges(Zone* zone) : zone_(zone) {}
  uint32_t Word() const override { return zone_->changes().Current(); }
  void Wait(uint32_t seen, int64_t timeout_ns) const override {
    zone_->changes().WaitForChange(seen, timeout_ns);
  }

 private:
  Zone* const zone_;
};

}  // namespace

Watcher::Watcher(WatcherDuties* duties, Zone* zone, const Logger* logger,
                 const WatcherTiming& timing)
    : duties_(duties),
      zone_(zone),
      logger_(logger),
      timing_(timing),
      pid_(static_cast<int32_t>(getpid())) {}

uint32_t Watcher::EnsureStarted() {
  const uint32_t p = proc_.load(std::memory_order_acquire);
  if (p != kNoSlot) return p;
  int expected = kNotStarted;
  if (!timing_.run_thread) {
    // Tests: the slot is claimed here, and the test runs the duties.
    if (state_.compare_exchange_strong(expected, kStarting)) Claim();
    return proc_.load(std::memory_order_acquire);
  }
  if (state_.compare_exchange_strong(expected, kStarting)) {
    start_deadline_ns_.store(timing_.clock->NowNs() + kStartWaitNs,
                             std::memory_order_release);
    const int rc = StartLibraryThread(&thread_, &Main, this, kStackBytes,
                                      /*detached=*/false);
    if (rc != 0) {
      state_.store(kFailed, std::memory_order_release);
      logger_->Error(
          "cannot start the watcher thread (%s); connections of "
          "process %d pass through unpaced",
          strerror(rc), pid_);
      return kNoSlot;
    }
  }
  const int64_t deadline = start_deadline_ns_.load(std::memory_order_acquire);
  while (state_.load(std::memory_order_acquire) == kStarting &&
         timing_.clock->NowNs() < deadline) {
    timing_.clock->SleepNs(20'000);
  }
  return proc_.load(std::memory_order_acquire);
}

void Watcher::AfterForkChild() {
  proc_.store(kNoSlot, std::memory_order_relaxed);
  state_.store(kNotStarted, std::memory_order_relaxed);
  stop_.store(false, std::memory_order_relaxed);
  start_deadline_ns_.store(0, std::memory_order_relaxed);
  liveness_ = HeldMutex();  // the parent's thread holds it, not ours
  pid_ = static_cast<int32_t>(getpid());
}

void* Watcher::Main(void* self) {
  pthread_setname_np(pthread_self(), "trafficrate");
  static_cast<Watcher*>(self)->Run();
  return nullptr;
}

bool Watcher::Claim() {
  uint32_t me = kNoSlot;
  const int32_t proc_pid = PidInProc();
  uint32_t reaped = 0;  // connections of dead processes, released
  // The zone lock may be held for long (its holder stopped): wait for it in
  // bounded steps, for as long as the process wants the watcher.
  for (;;) {
    if (stop_.load(std::memory_order_acquire) || zone_->segment().corrupt()) {
      state_.store(kFailed, std::memory_order_release);
      return false;
    }
    ZoneLock lock(*zone_, kWatcherLockWaitNs);
    if (lock.ok()) {
      me = zone_->procs().ClaimLocked(proc_pid, timing_.clock->NowNs(),
                                      &liveness_, &reaped);
      break;
    }
    if (zone_->lock_stalled() && !zone_->RecheckLock()) {
      timing_.clock->SleepNs(kWatcherLockWaitNs);
    }
  }
  if (reaped > 0) zone_->changes().WakeWatchers();
  if (me == kNoSlot) {
    state_.store(kFailed, std::memory_order_release);
    logger_->Error(
        "zone %s has no free process slot (%u); connections of "
        "process %d pass through unpaced; raise "
        "TRAFFICRATE_ZONE_SIZE",
        zone_->name().c_str(), zone_->procs().capacity(), proc_pid);
    return false;
  }
  proc_.store(me, std::memory_order_release);
  state_.store(kRunning, std::memory_order_release);
  return true;
}

void Watcher::Run() {
  // Before Claim publishes kRunning: a join pushed after EnsureStarted
  // returns must find the change word moved, or the push is lost (the
  // process's first connections would keep their old share until they send
  // again).
  const ZoneChanges changes(zone_);
  const uint32_t seen = changes.Word();
  if (!Claim()) return;
  WatcherLoop loop(duties_, timing_, *timing_.clock, changes, seen);
  while (!stop_.load(std::memory_order_acquire)) {
    if (!loop.Pass()) {
      // Corrupt: the process passes through; nothing to do but wait for
      // the end, without touching the zone.
      while (!stop_.load(std::memory_order_acquire)) {
        timing_.clock->SleepNs(kNsPerSec / 10);
      }
      break;
    }
  }
  // Give up the liveness token: to the zone, this process is now dead.
  liveness_.Release();
}

void Watcher::Stop() {
  if (state_.load(std::memory_order_acquire) != kRunning) return;
  if (!timing_.run_thread) {
    liveness_.Release();
    proc_.store(kNoSlot, std::memory_order_release);
    state_.store(kNotStarted, std::memory_order_release);
    return;
  }
  stop_.store(true, std::memory_order_release);
  zone_->changes().WakeWatchers();
  pthread_join(thread_, nullptr);
  proc_.store(kNoSlot, std::memory_order_release);
  state_.store(kNotStarted, std::memory_order_release);
  stop_.store(false, std::memory_order_release);
}

}  // namespace trafficrate
