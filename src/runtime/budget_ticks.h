// Budget mode (budget.h): the watcher's tick. Each tick visits the sending
// connections of this process that are due: measures what left each
// socket (the bytes handed to the kernel minus SIOCOUTQNSD, or the
// kernel's own count), adds it to its key, decides the keys whose lease it
// holds (key_decisions.h), re-applies a changed level when it is worth it,
// and expires the idle ones (idle_expiry.h); connections at rest or
// another process's are looked at now and then. Between measurements the
// ticks estimate what left (meter.h). Then the drains (drains.h). Visits
// are spaced out as the watcher's CPU allowance says (cpu_budget.h).
//
//   int64_t next_ns = ticks.Tick(now_ns);  // the watcher sleeps until then
//
// Thread safety: the watcher thread only.

#ifndef TRAFFICRATE_SRC_RUNTIME_BUDGET_TICKS_H_
#define TRAFFICRATE_SRC_RUNTIME_BUDGET_TICKS_H_

#include <cstdint>

#include "src/runtime/drains.h"
#include "src/runtime/governor_context.h"
#include "src/runtime/idle_expiry.h"
#include "src/runtime/key_decisions.h"
#include "src/runtime/pacer.h"

namespace trafficrate {

class BudgetTicks : private GovernorPart {
 public:
  // REQUIRES: the parts given outlive the BudgetTicks.
  BudgetTicks(const GovernorContext& context, const Pacer& pacer,
              IdleExpiry& idle, KeyDecisions& decisions, Drains& drains)
      : GovernorPart(context),
        pacer_(pacer),
        idle_(idle),
        decisions_(decisions),
        drains_(drains) {}

  // The longest the watcher sleeps between ticks (a visit round, up to
  // half a second, while it spaces its work out: cpu_budget.h).
  static constexpr int64_t kMaxSleepNs = 100'000'000;

  // One tick. Returns when the next tick has work: the start of the first
  // tick in which a connection is due for a visit, at most kMaxSleepNs (or
  // a visit round) away.
  int64_t Tick(int64_t now_ns);

 private:
  // One connection's measurement (SIOCOUTQNSD, TCP_INFO), its key's share
  // of the tick, and its idle bookkeeping.
  void MeasureConn(int fd, FdEntry& entry, uint64_t state, ConnSlotShm& conn,
                   int64_t now_ns);
  // Between measurements: adds what probably left conn's socket since.
  void EstimateConn(const LocalConn& local, ConnSlotShm& conn, int64_t now_ns);
  // Whether a visit should re-apply a changed level now.
  bool ApplyDue(const LocalConn& local, const ConnSlotShm& conn,
                uint32_t packet_bytes, int64_t now_ns) const;
  // The ticks until a visit of a connection at rest here should look again
  // (IdleExpiry::LookAtRest), or `otherwise` if it is not.
  uint32_t RestGapTicks(int fd, FdEntry& entry, uint64_t state,
                        const ConnSlotShm& conn, int64_t now_ns,
                        uint32_t otherwise);

  const Pacer& pacer_;
  IdleExpiry& idle_;
  KeyDecisions& decisions_;
  Drains& drains_;
  uint32_t tick_ = 0;
  // The due time of its next tick it last published
  // (ProcSlotShm::watcher_due_ms), and whether this tick came more than
  // kBudgetLateHoldNs after it and published none (Tick).
  int64_t published_due_ns_ = 0;
  bool recounting_ = false;
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_BUDGET_TICKS_H_
