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
// The duties themselves are the Governor's (WatcherDuties), and when each
// runs is the WatcherLoop's (watcher_loop.h): the watcher is the thread that
// runs the loop, with its slot in the zone. Ownership: duties, zone and logger
// must outlive the Watcher. Thread safety: every public function may be called
// from any thread.

#ifndef TRAFFICRATE_SRC_RUNTIME_WATCHER_H_
#define TRAFFICRATE_SRC_RUNTIME_WATCHER_H_

#include <pthread.h>

#include <atomic>
#include <cstdint>

#include "src/base/log.h"
#include "src/runtime/watcher_loop.h"
#include "src/shm/zone.h"

namespace trafficrate {

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
