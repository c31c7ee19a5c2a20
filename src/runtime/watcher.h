// The watcher: one thread per process that does the Governor's periodic
// duties, so that nothing periodic runs inside the host's calls. It claims
// the process's slot in the zone and holds its liveness token for life; it
// wakes on the zone's change word (a join or leave in any process) to
// re-apply shares, and on its own ticks to run the shared budget (measure
// what left this process's sockets, decide the levels of the keys whose
// lease it holds), expire idle connections and reap dead processes.
//
//   Watcher watcher(&governor, &zone, &logger, options);
//   uint32_t proc = watcher.EnsureStarted();  // at the first governed accept
//
// The duties themselves are the Governor's (WatcherDuties); the watcher
// only says when. Ownership: duties, zone and logger must outlive the
// Watcher. Thread safety: every public function may be called from any
// thread.

#ifndef TRAFFICRATE_SRC_RUNTIME_WATCHER_H_
#define TRAFFICRATE_SRC_RUNTIME_WATCHER_H_

#include <pthread.h>

#include <atomic>
#include <cstdint>

#include "src/base/log.h"
#include "src/shm/zone.h"

namespace trafficrate {

// What the watcher's loop runs, each at its time (the Governor does them).
// Called from the watcher thread only, one at a time.
class WatcherDuties {
 public:
  virtual ~WatcherDuties() = default;
  // Once per loop; false once the zone is corrupt (nothing more to do).
  virtual bool CheckZone(int64_t now_ns) = 0;
  // Budget mode: TickBudget at the times it returns; otherwise FinishDrains
  // every tick.
  virtual bool BudgetWanted() const = 0;
  virtual int64_t TickBudget(int64_t now_ns) = 0;
  virtual void FinishDrains(int64_t now_ns) = 0;
  // After a join or leave anywhere in the zone (the change word moved).
  virtual void ApplyChangedShares() = 0;
  // Every quarter of TRAFFICRATE_IDLE (1 to 100 ms).
  virtual void ExpireIdle(int64_t now_ns) = 0;
  // Every reap interval.
  virtual void ReapDead() = 0;
  // After every wait: how late it woke.
  virtual void NoteWatcherLate(int64_t late_ns, int64_t now_ns) = 0;
};

struct WatcherTiming {
  int64_t idle_ns = 200'000'000;    // TRAFFICRATE_IDLE
  int64_t coalesce_ns = 2'000'000;  // minimum gap between share scans
  int64_t reap_interval_ns = 250'000'000;
};

class Watcher {
 public:
  // REQUIRES: duties, zone and logger outlive the Watcher.
  Watcher(WatcherDuties* duties, Zone* zone, const Logger* logger,
          const WatcherTiming& timing);
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

  // The process's slot in the zone: starts the thread on first use (the one
  // pthread_create inside an interposed call, once per process) and waits
  // for it at most 200 ms after it was started, in all (calls after that
  // do not wait). kNoSlot if it has no slot (yet).
  uint32_t EnsureStarted();
  uint32_t proc_index() const { return proc_.load(std::memory_order_acquire); }
  // Started, but without a slot yet: it waits for the zone lock.
  bool starting() const {
    return state_.load(std::memory_order_acquire) == kStarting;
  }
  // Stops the thread and releases the liveness token, so that the process
  // looks dead to the zone (tests; the library never stops it).
  void Stop();
  // In the child, after fork: the thread did not survive.
  void AfterForkChild();

 private:
  enum State : int { kNotStarted, kStarting, kRunning, kFailed };

  static void* Main(void* self);
  void Run();
  bool Claim();

  WatcherDuties* const duties_;
  Zone* const zone_;
  const Logger* const logger_;
  const WatcherTiming timing_;
  std::atomic<uint32_t> proc_{kNoSlot};
  std::atomic<int> state_{kNotStarted};
  std::atomic<bool> stop_{false};
  // EnsureStarted's callers wait for the thread until then, at most.
  std::atomic<int64_t> start_deadline_ns_{0};
  HeldMutex liveness_;  // the process slot's, held by the thread
  pthread_t thread_{};
  int32_t pid_;
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_WATCHER_H_
