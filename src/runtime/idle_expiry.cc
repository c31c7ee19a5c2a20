#include "src/runtime/idle_expiry.h"

#include <errno.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>

#include <algorithm>

#include "src/budget/budget.h"
#include "src/budget/share.h"
#include "src/net/tcp_counts.h"

namespace trafficrate {

void IdleExpiry::NoteWatcherLate(int64_t late_ns, int64_t now_ns) {
  if (late_ns < options_.idle_ns / 4) return;
  // As long again as the stall, at most an idle time: a watcher late by
  // 50 ms every few ticks (an overloaded machine) delays expiry by that
  // much, and does not keep idle connections in their keys for good.
  const int64_t until = now_ns + std::min(late_ns, options_.idle_ns);
  if (until > not_idle_before_ns_.load(std::memory_order_relaxed)) {
    not_idle_before_ns_.store(until, std::memory_order_relaxed);
  }
}

void IdleExpiry::ExpireIdle(int64_t now_ns) {
  // Budget mode: the tick's visits expire the sending connections
  // (TickBudget); only TRAFFICRATE_AFTER's joins are left to this pass.
  const bool budget = BudgetWanted();
  const bool any_after = rules_.AnyAfter();
  if (budget && !any_after) return;
  const uint32_t me = watcher_.proc_index();
  const int high_water = table_->high_water();
  // Equal mode: a connection that cannot be idle before a known time is
  // skipped until then (FdEntry::visit_tick, in budget ticks), so that the
  // pass reads only the fd table for it; a raise of its pace makes it due
  // at once (ApplyIfChanged).
  const uint32_t tick = BudgetTickOf(now_ns);
  bool push = false;
  for (int fd = 0; fd < high_water; ++fd) {
    FdEntry& entry = *table_->Get(fd);
    const uint64_t state = entry.state.load(std::memory_order_acquire);
    if (!IsConnState(state)) continue;
    const uint32_t visit = entry.visit_tick.load(std::memory_order_relaxed);
    if (!budget && visit != 0 && static_cast<int32_t>(tick - visit) < 0) {
      continue;
    }
    const ConnSlotShm& conn = zone_->conns().slot(FdState::From(state).conn());
    const uint64_t after = any_after ? rules_.AfterBytes(conn) : 0;
    if (after > 0 && ConnValid(conn, state) &&
        !conn.active.load(std::memory_order_relaxed) &&
        conn.proc_index.load(std::memory_order_relaxed) == me &&
        conn.bytes_sent.load(std::memory_order_relaxed) >= after) {
      // Queued past TRAFFICRATE_AFTER with no send since: join once sent.
      registry_.JoinSlow(fd, entry, state);
      continue;
    }
    if (budget) continue;
    int64_t quiet_until = 0;
    if (!ExpireIfIdle(fd, entry, state, conn, now_ns, &push, &quiet_until)) {
      break;
    }
    // Not later than the pass after it (ticks are a little coarser).
    const uint32_t next = quiet_until > now_ns ? BudgetTickOf(quiet_until) : 0;
    entry.visit_tick.store(next, std::memory_order_relaxed);
  }
  if (push) zone_->changes().WakeWatchers();
}

bool IdleExpiry::ExpireIfIdle(int fd, FdEntry& entry, uint64_t state,
                              const ConnSlotShm& conn, int64_t now_ns,
                              bool* push, int64_t* quiet_until_ns) {
  LocalConn& local = local_[FdState::From(state).conn()];
  const int64_t last = local.last_send_ns.load(std::memory_order_relaxed);
  if (!ConnValid(conn, state) || !conn.active.load(std::memory_order_relaxed)) {
    // A send joins it at once (and makes it due); a write this process
    // did not see, at the next look at its rest. TRAFFICRATE_AFTER's join
    // (ExpireIdle) is looked for at every pass.
    const int64_t next = LookAtRest(fd, entry, state, conn, now_ns);
    if (quiet_until_ns != nullptr) {
      *quiet_until_ns = rules_.AfterBytes(conn) > 0 ? 0 : next;
    }
    return true;
  }
  const uint64_t pace =
      conn.share_bytes_per_sec.load(std::memory_order_relaxed);
  // Not idle before TRAFFICRATE_IDLE has passed since its last send, nor
  // before the time a stall of this process gave it (NoteWatcherLate), nor
  // before the queue it had at the last look can have left at its pace now,
  // nor before budget mode's next measurement (MeasureConn). A send after
  // this look moves the first later, never earlier.
  const int64_t next_look = std::max(
      {last + options_.idle_ns,
       not_idle_before_ns_.load(std::memory_order_relaxed),
       local.idle_queued_ns.load(std::memory_order_relaxed) +
           IdleCheckDelayNs(local.idle_queued.load(std::memory_order_relaxed),
                            pace),
       local.next_idle_check_ns.load(std::memory_order_relaxed)});
  if (quiet_until_ns != nullptr) *quiet_until_ns = next_look;
  if (now_ns < next_look || conn.proc_index.load(std::memory_order_relaxed) !=
                                watcher_.proc_index()) {
    return true;
  }
  if (!FdTable::TryPin(entry, state, /*wait=*/false)) return true;
  int queued = 0;
  const int rc = ioctl(fd, SIOCOUTQ, &queued);
  const int err = errno;
  FdTable::Unpin(entry);
  if (rc != 0 && (err == EBADF || err == ENOTTY || err == ENOTSOCK)) {
    // Closed or reused behind our back (not through an interposed call).
    uint64_t expected = state;
    if (entry.state.compare_exchange_strong(expected, 0))
      registry_.Release(state);
    return true;
  }
  if (rc != 0) return true;
  if (queued > 0) {
    // Still sending what it queued: not idle before most of it can have
    // left at its pace (the pace in force when the next look is due, so a
    // raise brings it forward). One look per connection per tick would
    // cost a system call each, 20 times a second, for every slow
    // connection.
    local.idle_queued.store(static_cast<uint64_t>(queued),
                            std::memory_order_relaxed);
    local.idle_queued_ns.store(now_ns, std::memory_order_relaxed);
    if (quiet_until_ns != nullptr) {
      *quiet_until_ns =
          now_ns + IdleCheckDelayNs(static_cast<uint64_t>(queued), pace);
    }
    return true;
  }
  if (quiet_until_ns != nullptr) *quiet_until_ns = 0;
  ZoneLock lock(*zone_);
  if (!lock.ok()) return false;
  if (ConnValid(conn, state) &&
      local.last_send_ns.load(std::memory_order_relaxed) == last) {
    *push |= zone_->conns().LeaveLocked(FdState::From(state).conn()) &&
             registry_.SiblingsSendingLocked(conn);
    local_.StartRest(FdState::From(state).conn());
  }
  return true;
}

int64_t IdleExpiry::LookAtRest(int fd, FdEntry& entry, uint64_t state,
                               const ConnSlotShm& conn, int64_t now_ns) {
  if (!ConnValid(conn, state) || conn.active.load(std::memory_order_relaxed) ||
      conn.proc_index.load(std::memory_order_relaxed) !=
          watcher_.proc_index()) {
    return 0;
  }
  LocalConn& local = local_[FdState::From(state).conn()];
  const int64_t due = local.rest_look_ns.load(std::memory_order_relaxed);
  if (now_ns < due) return due;
  if (!FdTable::TryPin(entry, state, /*wait=*/false)) return 0;
  TcpSendCounts kernel;
  const bool counted = ReadTcpSendCounts(fd, &kernel);
  FdTable::Unpin(entry);
  const uint64_t written = kernel.left + kernel.unsent;
  const uint64_t before = local.rest_written.load(std::memory_order_relaxed);
  if (counted && before != kNoKernelBase && written > before) {
    // Written since the last look, and not through a call of this process
    // (a send joins at once). It sends now: not idle before
    // TRAFFICRATE_IDLE has passed, or its queue has left.
    local.last_send_ns.store(now_ns, std::memory_order_relaxed);
    local_.StartRest(FdState::From(state).conn());
    registry_.JoinSlow(fd, entry, state);
    return now_ns;
  }
  if (counted) local.rest_written.store(written, std::memory_order_relaxed);
  const int64_t gap =
      std::min(kRestLastLookNs,
               std::max(kRestFirstLookNs,
                        2 * local.rest_gap_ns.load(std::memory_order_relaxed)));
  local.rest_gap_ns.store(gap, std::memory_order_relaxed);
  const int64_t next = now_ns + cpu_.Stretch(gap);
  local.rest_look_ns.store(next, std::memory_order_relaxed);
  return next;
}

}  // namespace trafficrate
