// A Clock for tests (src/base/clock.h) that moves only when told to, or when
// something sleeps on it: a loop's or a Governor's timing is then tested
// without sleeping, at times the test chooses.
//
//   FakeClock clock;                    // starts at kStartNs
//   options.clock = &clock;             // WatcherTiming::clock
//   clock.AdvanceNs(250 * kNsPerMs);    // a quarter of a second "passes"
//
// Thread safety: its time is one atomic, so that calls on several threads
// (a Governor's, from the test's threads) may read it while another moves it.

#ifndef TRAFFICRATE_TESTS_BASE_FAKE_CLOCK_H_
#define TRAFFICRATE_TESTS_BASE_FAKE_CLOCK_H_

#include <atomic>
#include <cstdint>

#include "src/base/clock.h"

namespace trafficrate {
namespace testing_util {

class FakeClock final : public Clock {
 public:
  // Never 0, which the code under test takes for "never".
  static constexpr int64_t kStartNs = 1'000 * kNsPerMs;

  explicit FakeClock(int64_t start_ns = kStartNs) : now_ns_(start_ns) {}
  FakeClock(const FakeClock&) = delete;
  FakeClock& operator=(const FakeClock&) = delete;

  // CoarseNowNs (the per-send stamp) is NowNs too: no tick to wait for.
  int64_t NowNs() const override { return now_ns_.load(); }
  // Moves the time on by ns, at once (nothing when ns <= 0).
  void SleepNs(int64_t ns) const override {
    if (ns > 0) now_ns_.fetch_add(ns);
  }
  void AdvanceNs(int64_t ns) { SleepNs(ns); }
  // REQUIRES: no earlier than NowNs() (the clock is monotonic).
  void SetNs(int64_t now_ns) { now_ns_.store(now_ns); }

 private:
  // Mutable: SleepNs is const in Clock, and moves it.
  mutable std::atomic<int64_t> now_ns_;
};

}  // namespace testing_util
}  // namespace trafficrate

#endif  // TRAFFICRATE_TESTS_BASE_FAKE_CLOCK_H_
