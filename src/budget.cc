#include "src/budget.h"

#include <algorithm>
#include <cmath>

namespace trafficrate {
namespace {

constexpr double kNsPerSecF = 1e9;
// Smoothing of the measured rate (stat shows it; the boost follows it).
constexpr double kMeasuredTauNs = 400e6;
// How fast the boost follows a shortfall, and how fast it gives way to an
// excess: slower up than down, so a key never overshoots for long.
constexpr double kBoostUpTauNs = 150e6;
constexpr double kBoostDownTauNs = 50e6;
// A key sending less than this part of its target, with nothing owed, has
// room to spare: its boost doubles per tick instead of creeping up.
constexpr double kClearlyUnder = 0.75;

double Clamp(double v, double lo, double hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// The target total rate for the next ticks: the rate, plus what is banked,
// minus what is owed, spread over the horizon.
// Within half a burst either way the target is the rate itself, so that the
// level does not follow every packet.
double TargetRate(double rate, int64_t balance_bytes, double burst) {
  double excess = static_cast<double>(balance_bytes);
  const double band = burst / 2;
  excess = excess > band ? excess - band : (excess < -band ? excess + band : 0);
  const double target =
      rate + excess * kNsPerSecF / static_cast<double>(kBudgetHorizonNs);
  return Clamp(target, rate / 4, rate + burst * kNsPerSecF / kBudgetHorizonNs);
}

// The level for a target, a boost and a number of sending connections:
// between target/active (all want more than that) and the rate (nothing
// held back).
uint64_t LevelFor(double target, uint32_t boost, uint32_t active, double rate) {
  const double n = active > 0 ? active : 1;
  const double floor = target / n;
  const double level = floor * static_cast<double>(boost) / kBoostOne;
  if (level >= rate * 0.999) return static_cast<uint64_t>(rate);
  return level >= 1 ? static_cast<uint64_t>(std::max(level, floor)) : 1;
}

}  // namespace

BudgetState BudgetTick(const BudgetState& state, const BudgetInput& input,
                       const BudgetSettings& settings) {
  BudgetState next = state;
  const double rate = static_cast<double>(settings.rate_bytes_per_sec);
  const double burst = static_cast<double>(settings.burst_bytes);
  const uint32_t n = input.active > 0 ? input.active : 1;
  const int64_t dt_ns = input.now_ns - state.last_ns;
  if (state.last_ns == 0 || dt_ns > kBudgetMaxGapNs || dt_ns < 0 ||
      input.sent_bytes < state.sent_bytes) {
    // A fresh start: nothing banked, nothing owed, an equal split.
    next.last_ns = input.now_ns;
    next.sent_bytes = input.sent_bytes;
    next.balance_bytes = 0;
    next.boost = kBoostOne;
    next.measured_bytes_per_sec = 0;
    next.level_bytes_per_sec = LevelFor(rate, next.boost, n, rate);
    return next;
  }
  if (dt_ns == 0) return next;
  const double dt = static_cast<double>(dt_ns);
  const double bytes = static_cast<double>(input.sent_bytes - state.sent_bytes);
  const double now_rate = bytes * kNsPerSecF / dt;

  // The token bucket: at most `burst` banked, at most kBudgetMaxDebtNs owed.
  double balance =
      static_cast<double>(state.balance_bytes) + rate * dt / kNsPerSecF - bytes;
  balance = Clamp(balance, -rate * kBudgetMaxDebtNs / kNsPerSecF, burst);
  next.balance_bytes = static_cast<int64_t>(balance);

  const double alpha = 1 - std::exp(-dt / kMeasuredTauNs);
  const double measured =
      static_cast<double>(state.measured_bytes_per_sec) +
      (now_rate - static_cast<double>(state.measured_bytes_per_sec)) * alpha;
  next.measured_bytes_per_sec = static_cast<uint64_t>(std::max(0.0, measured));

  const double target = TargetRate(rate, next.balance_bytes, burst);
  // The boost: max-min lets connections below their share keep what they
  // use and gives the rest to the others, so while the key sends less than
  // its target the level rises above target/active, and falls back as soon
  // as it sends more.
  double boost = static_cast<double>(state.boost) / kBoostOne;
  const double used = std::max(measured, now_rate);
  if (used < kClearlyUnder * target && balance >= 0) {
    boost *= 2;
  } else {
    // Within 2% the boost stays: measuring noise must not move the level.
    const double ratio = Clamp(target / std::max(measured, 1.0), 0.25, 4.0);
    if (ratio > 1.02) boost *= std::pow(ratio / 1.02, dt / kBoostUpTauNs);
    if (ratio < 0.98) boost *= std::pow(ratio / 0.98, dt / kBoostDownTauNs);
  }
  if (now_rate > 1.5 * target && balance < -burst / 2 && boost > 1) {
    // A burst well over the target: give way now, not over several ticks.
    boost = std::max(1.0, boost * target / now_rate);
  }
  // More than `active` is never needed: the level is then the whole rate.
  boost = Clamp(boost, 1.0, std::max(1.0, rate * n / target));
  next.boost = static_cast<uint32_t>(boost * kBoostOne);
  next.level_bytes_per_sec = LevelFor(target, next.boost, n, rate);
  next.last_ns = input.now_ns;
  next.sent_bytes = input.sent_bytes;
  return next;
}

uint64_t LevelAfterMembershipChange(const BudgetState& state,
                                    const BudgetSettings& settings,
                                    uint32_t old_active, uint32_t new_active) {
  const double rate = static_cast<double>(settings.rate_bytes_per_sec);
  const double target = TargetRate(rate, state.balance_bytes,
                                   static_cast<double>(settings.burst_bytes));
  if (state.level_bytes_per_sec == 0 || old_active == 0) {
    return LevelFor(target, kBoostOne, new_active, rate);
  }
  const double n_new = new_active > 0 ? new_active : 1;
  const double level = static_cast<double>(state.level_bytes_per_sec);
  if (new_active > old_active) {
    // The joiner takes its share from the others at once. If some of them
    // used less than the level, this guess is low; the ticks raise it.
    const double scaled = level * old_active / n_new;
    const double v = std::max(target / n_new, scaled);
    return v >= 1 ? static_cast<uint64_t>(v) : 1;
  }
  // A leave: the max-min level is at least target / active.
  const double v = Clamp(std::max(level, target / n_new), 1, rate);
  return static_cast<uint64_t>(v);
}

bool LevelWorthApplying(uint64_t applied_bytes_per_sec,
                        uint64_t level_bytes_per_sec) {
  if (applied_bytes_per_sec == 0) return true;
  const uint64_t hi = std::max(applied_bytes_per_sec, level_bytes_per_sec);
  const uint64_t lo = std::min(applied_bytes_per_sec, level_bytes_per_sec);
  // 4%: above tick-to-tick noise. A level off by less is corrected through
  // the balance (the target moves), so it costs no accuracy over a second.
  return hi - lo > hi / 25;
}

uint64_t DefaultBurstBytes(uint64_t rate_bytes_per_sec) {
  const uint64_t burst = rate_bytes_per_sec / 20;
  return std::max<uint64_t>(burst, 16 * 1024);
}

}  // namespace trafficrate
