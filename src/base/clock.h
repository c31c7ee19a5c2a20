// Monotonic time in nanoseconds, the one clock the core and the library use,
// and the Clock through which the parts that wait are given it.

#ifndef TRAFFICRATE_SRC_BASE_CLOCK_H_
#define TRAFFICRATE_SRC_BASE_CLOCK_H_

#include <time.h>

#include <cstdint>

namespace trafficrate {

inline constexpr int64_t kNsPerMs = 1'000'000;
inline constexpr int64_t kNsPerSec = 1'000'000'000;

// Hot path: vDSO clock_gettime, no system call, errno untouched on success.
inline int64_t MonotonicNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * kNsPerSec + ts.tv_nsec;
}

// The time of the kernel's last timer tick (CLOCK_MONOTONIC_COARSE, vDSO): at
// most one tick (1-10 ms, CONFIG_HZ) behind MonotonicNowNs and never ahead of
// it. For stamps taken on every send, where a tick is fine and the fine
// clock is not cheap: 32 ns a call on these VMs, against 10.
inline int64_t CoarseMonotonicNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * kNsPerSec + ts.tv_nsec;
}

// now - then, saturated at the int64_t range: `then` may come from the shared
// zone, where any value can be.
inline int64_t ElapsedNs(int64_t now, int64_t then) {
  int64_t d = 0;
  if (__builtin_sub_overflow(now, then, &d)) {
    return now > then ? INT64_MAX : INT64_MIN;
  }
  return d;
}

// Sleeps for ns (not resumed after a signal: callers loop on a deadline).
inline void SleepNs(int64_t ns) {
  if (ns <= 0) return;
  const timespec ts{static_cast<time_t>(ns / kNsPerSec),
                    static_cast<long>(ns % kNsPerSec)};
  nanosleep(&ts, nullptr);
}

// Time for the parts that wait (the watcher's loop): the real clock, or a
// test's that moves only when it is told to or slept on, so that a loop's
// timing is tested without sleeping.
class Clock {
 public:
  virtual int64_t NowNs() const = 0;
  // For stamps taken on every send: CoarseMonotonicNowNs for the real
  // clock, NowNs for a test's.
  virtual int64_t CoarseNowNs() const { return NowNs(); }
  // Sleeps for ns (nothing when ns <= 0).
  virtual void SleepNs(int64_t ns) const = 0;

 protected:
  ~Clock() = default;
};

// CLOCK_MONOTONIC (MonotonicNowNs, CoarseMonotonicNowNs) and nanosleep
// (SleepNs).
const Clock& MonotonicClock();

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_BASE_CLOCK_H_
