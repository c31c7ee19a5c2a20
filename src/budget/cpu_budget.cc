#include "src/budget/cpu_budget.h"

#include <time.h>

#include <algorithm>
#include <cmath>

#include "src/base/clock.h"

namespace trafficrate {
namespace {

// A look acts once per interval of at least this long: long enough to
// average over the measurement gaps of slow connections.
constexpr int64_t kIntervalNs = kNsPerSec;
// Below this part of the allowance the stretch comes back down; between it
// and the allowance it stays.
constexpr double kRelaxBelow = 0.7;
// The most one interval moves the stretch: the cost follows it only as the
// connections' next measurements and visits come due (seconds apart at
// the slowest), so a full correction at once would overshoot.
constexpr double kMaxRise = 1.5;
constexpr double kMaxFall = 0.85;

}  // namespace

bool CpuBudget::Due(int64_t now_ns) const {
  return since_ns_ == 0 || now_ns - since_ns_ >= kIntervalNs;
}

void CpuBudget::Update(int64_t now_ns, int64_t cpu_ns, uint32_t governed) {
  if (cpu_ns < 0) return;
  const int64_t elapsed = now_ns - since_ns_;
  if (since_ns_ != 0 && elapsed < kIntervalNs && elapsed >= 0) return;
  const int64_t spent = cpu_ns - since_cpu_ns_;
  const bool measured = since_ns_ != 0 && elapsed > 0 && spent >= 0;
  since_ns_ = now_ns;
  since_cpu_ns_ = cpu_ns;
  if (!measured) return;
  used_ = static_cast<int64_t>(static_cast<double>(spent) * kNsPerSec /
                               static_cast<double>(elapsed));
  const double allowed = static_cast<double>(std::max(
      kCpuFloorNsPerSec, static_cast<int64_t>(governed) * kCpuPerConnNsPerSec));
  const double over = static_cast<double>(used_) / allowed;
  // The part of the cost that the stretch spaces out goes as its inverse:
  // a square root of the gap per interval, bounded, converges without
  // swinging.
  if (over > 1) {
    stretch_ *= std::min(kMaxRise, std::sqrt(over));
  } else if (over < kRelaxBelow) {
    stretch_ *= std::max(kMaxFall, std::sqrt(over / kRelaxBelow));
  }
  stretch_ =
      std::clamp(stretch_, 1.0,
                 std::clamp(static_cast<double>(governed) / kCpuStretchConns,
                            1.0, kMaxCpuStretch));
}

int64_t ThreadCpuNs() {
  timespec ts;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return -1;
  return static_cast<int64_t>(ts.tv_sec) * kNsPerSec + ts.tv_nsec;
}

}  // namespace trafficrate
