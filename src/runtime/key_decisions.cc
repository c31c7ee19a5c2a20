#include "src/runtime/key_decisions.h"

#include <algorithm>

#include "src/base/private_array.h"
#include "src/budget/budget.h"
#include "src/budget/meter.h"
#include "src/budget/share.h"
#include "src/budget/visit_timing.h"
#include "src/shm/key_budget.h"

namespace trafficrate {

KeyDecisions::KeyDecisions(const GovernorContext& context)
    : GovernorPart(context),
      keys_(MapPrivateArray<LocalKey>(zone_->keys().capacity())) {}

KeyDecisions::~KeyDecisions() {
  UnmapPrivateArray(keys_, zone_->keys().capacity());
}

void KeyDecisions::NoteAndDecide(const ConnSlotShm& conn, uint32_t packet_bytes,
                                 int64_t now_ns) {
  const uint32_t k = conn.key_index.load(std::memory_order_relaxed);
  if (k >= zone_->keys().capacity()) return;
  LocalKey& local = keys_[k];
  // The largest packet of the key's connections visited in this window of
  // kPacketWindowTicks and the one before is what its decisions use: slow
  // connections are not visited every tick (TickBudget, at most
  // kMaxDecideGapNs apart), so one tick's visits may hold none of them, or
  // only new connections not yet measured.
  if (tick_ - local.window_tick >= kPacketWindowTicks) {
    local.packet_before = local.packet_bytes;
    local.packet_bytes = 0;
    local.window_tick = tick_;
  }
  local.packet_bytes = std::max(local.packet_bytes, packet_bytes);
  if (local.tick == tick_) return;
  local.tick = tick_;  // the first of the key's connections in this tick
  DecideKey(k, std::max(local.packet_bytes, local.packet_before), now_ns);
}

void KeyDecisions::DecideKey(uint32_t key_index, uint32_t packet_bytes,
                             int64_t now_ns) {
  if (key_index >= zone_->keys().capacity()) return;
  KeySlotShm& key = zone_->keys().slot(key_index);
  // A key whose connections send packets far apart is decided less often:
  // a new level reaches them only at their next packet anyway.
  const int64_t last = key.budget_last_ns.load(std::memory_order_relaxed);
  const uint64_t level =
      key.level_bytes_per_sec.load(std::memory_order_relaxed);
  int64_t every = kBudgetTickNs / 2;
  if (level > 0 && packet_bytes > 0) {
    every = std::max<int64_t>(
        kBudgetTickNs / 2,
        StretchedDecideGapNs(
            static_cast<int64_t>(
                PacketGapNs(PacketOrTwoSegments(packet_bytes), level) / 4),
            cpu_));
  }
  if (last != 0 && ElapsedNs(now_ns, last) < every) return;
  if (!TryTakeLease(key, watcher_.proc_index(), now_ns)) return;
  BudgetState state = LoadBudget(key);
  if (state.last_ns != last) return;  // decided a moment ago elsewhere
  const uint64_t published = state.level_bytes_per_sec;
  const uint64_t pending = key.start_pending.load(std::memory_order_relaxed);
  const uint32_t active = key.active.load(std::memory_order_relaxed);
  const BudgetSettings settings = zone_->settings().key_budget_settings(key);
  BudgetInput input{now_ns,
                    key.sent_bytes.load(std::memory_order_relaxed),
                    active,
                    packet_bytes,
                    UnderPaceOf(key),
                    pending,
                    CountLagNs(level, cpu_),
                    options_.shape};
  // How far apart the watcher decides it while it sends (its visits, a
  // visit round late at most): a longer gap means it was idle.
  input.max_gap_ns =
      kMaxStretchedDecideGapNs + 2 * VisitRoundTicks(cpu_) * kBudgetTickNs;
  // Held while another watcher's part of the count is late, if tried
  // again soon enough (kBudgetMaxHoldNs).
  if (every <= kMaxDecideGapNs) input.count_late_ns = count_late_ns_;
  state = BudgetTick(state, input, settings);
  // Joins may have added to it meanwhile: only what this tick forgave or
  // let lapse is taken off.
  if (state.start_pending_bytes < pending) {
    key.start_pending.fetch_sub(pending - state.start_pending_bytes,
                                std::memory_order_relaxed);
  }
  const bool changed =
      LevelWorthApplying(published, state.level_bytes_per_sec,
                         ShareBytesPerSec(settings.rate_bytes_per_sec, active));
  if (!changed) state.level_bytes_per_sec = published;
  StoreBudget(key, state);
  // Every watcher re-applies on its next tick; senders on their next send.
  if (changed) key.generation.fetch_add(1, std::memory_order_release);
}

}  // namespace trafficrate
