#include "src/runtime/watcher_loop.h"

#include <algorithm>

#include "src/budget/budget.h"

namespace trafficrate {

int64_t WatcherLoop::IdleTickNs(int64_t idle_ns) {
  return std::clamp<int64_t>(idle_ns / 4, kNsPerMs, 100 * kNsPerMs);
}

WatcherLoop::WatcherLoop(WatcherDuties* duties, const WatcherTiming& timing,
                         const Clock& clock, const ChangeSignal& changes,
                         uint32_t seen)
    : duties_(duties),
      timing_(timing),
      clock_(clock),
      changes_(changes),
      idle_tick_ns_(IdleTickNs(timing.idle_ns)),
      seen_(seen) {
  const int64_t now = clock_.NowNs();
  next_idle_ns_ = now + idle_tick_ns_;
  next_reap_ns_ = now;
  next_budget_ns_ = now + kBudgetTickNs;
}

bool WatcherLoop::Pass() {
  int64_t now = clock_.NowNs();
  if (!duties_->CheckZone(now)) return false;
  int64_t until = std::min(next_idle_ns_, next_reap_ns_);
  const bool budget = duties_->BudgetWanted();
  // Budget mode wakes every tick anyway: the idle and reap passes ride on
  // the tick nearest their time instead of waking the thread themselves.
  const int64_t slack = budget ? kBudgetTickNs / 2 : 0;
  if (budget) until = next_budget_ns_;
  changes_.Wait(seen_, until - now);
  now = clock_.NowNs();
  duties_->NoteWatcherLate(now - until, now);
  if (changes_.Word() != seen_) {
    // Coalesce a burst of joins into one scan per coalesce_ns.
    clock_.SleepNs(last_scan_ns_ + timing_.coalesce_ns - now);
    seen_ = changes_.Word();
    duties_->ApplyChangedShares();
    last_scan_ns_ = clock_.NowNs();
    // A join or leave: its connections are due at the next tick.
    next_budget_ns_ = std::min(next_budget_ns_, now + kBudgetTickNs);
  }
  if (budget && now >= next_budget_ns_) {
    next_budget_ns_ = duties_->TickBudget(now);
  } else if (!budget) {
    duties_->FinishDrains(now);
    next_budget_ns_ = now + kBudgetTickNs;
  }
  if (now + slack >= next_idle_ns_) {
    duties_->ExpireIdle(now);
    next_idle_ns_ = now + idle_tick_ns_;
  }
  if (now + slack >= next_reap_ns_) {
    duties_->ReapDead();
    next_reap_ns_ = now + timing_.reap_interval_ns;
  }
  return true;
}

}  // namespace trafficrate
