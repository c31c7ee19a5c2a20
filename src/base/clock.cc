#include "src/base/clock.h"

namespace trafficrate {
namespace {

class RealClock final : public Clock {
 public:
  int64_t NowNs() const override { return MonotonicNowNs(); }
  int64_t CoarseNowNs() const override { return CoarseMonotonicNowNs(); }
  void SleepNs(int64_t ns) const override { trafficrate::SleepNs(ns); }
};

// Constant-initialized, never destroyed: the watcher may run while the
// process exits.
constexpr RealClock kRealClock;

}  // namespace

const Clock& MonotonicClock() { return kRealClock; }

}  // namespace trafficrate
