// Budget mode: the decisions of the keys whose lease this process holds (or
// takes). Each tick, the first visited connection of a key decides it
// (budget.h: BudgetTick over its count, active and under-pace connections,
// and the largest packet its connections sent lately), at most every
// quarter of its packet gap, and publishes the level for every process.
//
//   decisions.BeginTick(BudgetTickOf(now_ns), count_late_ns);
//   decisions.NoteAndDecide(conn, packet_bytes, now_ns);  // per visit
//
// Thread safety: the watcher thread only.

#ifndef TRAFFICRATE_SRC_RUNTIME_KEY_DECISIONS_H_
#define TRAFFICRATE_SRC_RUNTIME_KEY_DECISIONS_H_

#include <cstdint>

#include "src/runtime/governor_context.h"

namespace trafficrate {

class KeyDecisions : private GovernorPart {
 public:
  explicit KeyDecisions(const GovernorContext& context);
  ~KeyDecisions();
  KeyDecisions(const KeyDecisions&) = delete;
  KeyDecisions& operator=(const KeyDecisions&) = delete;

  bool ok() const { return keys_ != nullptr; }
  // The tick now starting, and how late the latest watcher (this one too)
  // was at its start (ProcTable::LatestWatcherLateNs): its part of the
  // counts is missing until it runs (BudgetInput::count_late_ns).
  void BeginTick(uint32_t tick, int64_t count_late_ns) {
    tick_ = tick;
    count_late_ns_ = count_late_ns;
  }
  // Notes conn's packet size for its key; decides the key if this is the
  // first of its connections seen in the tick.
  void NoteAndDecide(const ConnSlotShm& conn, uint32_t packet_bytes,
                     int64_t now_ns);

 private:
  void DecideKey(uint32_t key_index, uint32_t packet_bytes, int64_t now_ns);

  // This process's view of each key: the tick in which it last tried to
  // decide it, and the largest packet its connections of the key sent
  // (ConnMeter::packet_bytes) in the window that began at window_tick and
  // in the one before (NoteAndDecide).
  struct LocalKey {
    uint32_t tick;
    uint32_t packet_bytes;
    uint32_t packet_before;
    uint32_t window_tick;
  };
  LocalKey* const keys_;  // the zone's key_capacity entries
  uint32_t tick_ = 0;
  int64_t count_late_ns_ = 0;
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_KEY_DECISIONS_H_
