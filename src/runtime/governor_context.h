// What every part of a process's Governor works on: the zone, the fd table,
// the logger, the options, the watcher (this process's slot in the zone),
// the local view of the zone's connections, the rule set and the watcher's
// CPU allowance. The parts (registry.h, pacer.h, idle_expiry.h, drains.h,
// budget_ticks.h, fd_passing.h, fd_events.h, zone_health.h) each derive
// from GovernorPart to reach them under the same names.
//
// Ownership: everything named here outlives the parts (the Governor owns
// the watcher, the local view, the rule set and the CPU allowance; the
// library the rest). Thread safety: the context is read-only.

#ifndef TRAFFICRATE_SRC_RUNTIME_GOVERNOR_CONTEXT_H_
#define TRAFFICRATE_SRC_RUNTIME_GOVERNOR_CONTEXT_H_

#include "src/base/log.h"
#include "src/budget/cpu_budget.h"
#include "src/runtime/fd_table.h"
#include "src/runtime/governor_options.h"
#include "src/runtime/local_conns.h"
#include "src/runtime/rule_set.h"
#include "src/runtime/watcher.h"
#include "src/shm/zone.h"

namespace trafficrate {

struct GovernorContext {
  Zone* zone;
  FdTable* table;
  const Logger* logger;
  const GovernorOptions* options;
  Watcher* watcher;
  const LocalConns* local;
  RuleSet* rules;
  // The watcher's CPU allowance (budget ticks measure it; the rest looks
  // and the visits stretch their gaps with it). Watcher thread only.
  CpuBudget* cpu;
};

class GovernorPart {
 protected:
  explicit GovernorPart(const GovernorContext& context)
      : zone_(context.zone),
        table_(context.table),
        logger_(context.logger),
        options_(*context.options),
        watcher_(*context.watcher),
        local_(*context.local),
        rules_(*context.rules),
        cpu_(*context.cpu) {}
  ~GovernorPart() = default;

  // Whether the zone runs the shared budget (budget.h) rather than equal
  // shares.
  bool BudgetWanted() const {
    return zone_->settings().share_mode() == ShareMode::kBudget;
  }
  // Whether fd state `state` names a connection slot of the zone (not 0, a
  // pending registration or a kept drain).
  bool IsConnState(uint64_t state) const {
    return state != 0 &&
           FdState::From(state).conn() < zone_->conns().capacity();
  }

  Zone* const zone_;
  FdTable* const table_;
  const Logger* const logger_;
  const GovernorOptions& options_;
  Watcher& watcher_;
  const LocalConns& local_;
  RuleSet& rules_;
  CpuBudget& cpu_;
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_GOVERNOR_CONTEXT_H_
