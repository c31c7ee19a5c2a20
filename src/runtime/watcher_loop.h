// The watcher's schedule: when each of the Governor's periodic duties runs,
// and how long the watcher waits for the zone's change word in between. No
// thread and no zone of its own: time comes from a Clock and changes from a
// ChangeSignal, so that tests drive the schedule with a clock of their own
// and no sleep (tests/runtime/watcher_loop_test.cc); the Watcher runs it on
// its thread with the real clock and the zone's change word.
//
//   WatcherLoop loop(&duties, timing, clock, changes);
//   while (!stop && loop.Pass()) {}
//
// Not thread-safe: one thread runs a loop.

#ifndef TRAFFICRATE_SRC_RUNTIME_WATCHER_LOOP_H_
#define TRAFFICRATE_SRC_RUNTIME_WATCHER_LOOP_H_

#include <cstdint>

#include "src/base/clock.h"

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

// The word every process bumps after a join or leave (the zone's change
// word), and the wait on it.
class ChangeSignal {
 public:
  virtual uint32_t Word() const = 0;
  // Returns when the word differs from `seen`, on a wake, or after
  // timeout_ns (spurious returns possible).
  virtual void Wait(uint32_t seen, int64_t timeout_ns) const = 0;

 protected:
  ~ChangeSignal() = default;
};

struct WatcherTiming {
  int64_t idle_ns = 200'000'000;    // TRAFFICRATE_IDLE
  int64_t coalesce_ns = 2'000'000;  // minimum gap between share scans
  int64_t reap_interval_ns = 250'000'000;
  // Where the watcher and the Governor take the time from (not owned;
  // outlives them).
  const Clock* clock = &MonotonicClock();
  // False (tests): the watcher claims the process slot in the caller of
  // Watcher::EnsureStarted and runs no thread; the test calls the duties
  // itself, at the times its clock says. The claim waits for the zone lock
  // as long as it is held, and the slot's liveness mutex then belongs to
  // the claiming thread: the process looks dead once that thread ends.
  bool run_thread = true;
};

class WatcherLoop {
 public:
  // Starts the schedule now: the first reap at once, the first idle pass a
  // quarter of the idle time and the first budget tick a tick from now.
  // `seen` is the change word as it was before the process published that
  // it runs (a join pushed after that must find the word moved).
  // REQUIRES: duties, clock and changes outlive the loop.
  WatcherLoop(WatcherDuties* duties, const WatcherTiming& timing,
              const Clock& clock, const ChangeSignal& changes, uint32_t seen);

  // One pass: checks the zone, waits for a change until the next duty is
  // due, then runs what is due: the changed shares (at most once per
  // coalesce_ns), the budget tick or the drains, the idle pass, the reap.
  // False once the zone is corrupt (the loop has nothing more to do).
  bool Pass();

  // The gap between idle passes: a quarter of the idle time, 1 to 100 ms.
  static int64_t IdleTickNs(int64_t idle_ns);

 private:
  WatcherDuties* const duties_;
  const WatcherTiming timing_;
  const Clock& clock_;
  const ChangeSignal& changes_;
  const int64_t idle_tick_ns_;
  uint32_t seen_;
  int64_t next_idle_ns_;
  int64_t next_reap_ns_;
  int64_t next_budget_ns_;
  int64_t last_scan_ns_ = 0;
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_WATCHER_LOOP_H_
