#include "src/runtime/budget_ticks.h"

#include <algorithm>

#include "src/budget/budget.h"
#include "src/budget/meter.h"
#include "src/budget/share.h"
#include "src/budget/visit_timing.h"
#include "src/net/send_queue.h"
#include "src/net/tcp_counts.h"

namespace trafficrate {

uint32_t BudgetTicks::RestGapTicks(int fd, FdEntry& entry, uint64_t state,
                                   const ConnSlotShm& conn, int64_t now_ns,
                                   uint32_t otherwise) {
  // Ours and at rest: visited when its rest is next looked at (a send
  // makes it due at once; a write seen now joined it: the next tick);
  // otherwise (idle in another process) as given.
  const int64_t look = idle_.LookAtRest(fd, entry, state, conn, now_ns);
  if (look == 0) return otherwise;
  return static_cast<uint32_t>(
      std::clamp<int64_t>((look - now_ns) / kBudgetTickNs, 1, INT32_MAX));
}

int64_t BudgetTicks::Tick(int64_t now_ns) {
  if (!local_.ok() || !decisions_.ok()) return now_ns + kBudgetTickNs;
  const uint32_t me = watcher_.proc_index();
  // Ticks are numbered by time, so that a watcher with nothing due may sleep
  // through some.
  tick_ = BudgetTickOf(now_ns);
  // Before this tick counts anything: a watcher that is late now (this
  // one included, until its visits below are done) misses bytes that left.
  decisions_.BeginTick(
      tick_, zone_->procs().LatestWatcherLateNs(now_ns, kStoppedWatcherNs));
  const bool late_tick =
      published_due_ns_ != 0 && now_ns - published_due_ns_ > kBudgetLateHoldNs;
  // Fewer, fuller ticks while the work is spaced out.
  const uint32_t round_ticks = VisitRoundTicks(cpu_);
  uint32_t next_due =
      tick_ + std::max<uint32_t>(kMaxSleepNs / kBudgetTickNs, round_ticks);
  bool push = false;
  uint32_t governed = 0;
  // Not sending here (idle, or another process's): looked at again only
  // now and then; a join (JoinSlow) makes it due at once.
  const uint32_t not_sending_ticks =
      static_cast<uint32_t>(cpu_.Stretch(kNotSendingVisitTicks));
  const int high_water = table_->high_water();
  for (int fd = 0; fd < high_water; ++fd) {
    FdEntry& entry = *table_->Get(fd);
    const uint64_t state = entry.state.load(std::memory_order_acquire);
    if (!IsConnState(state)) continue;
    ++governed;
    const uint32_t visit = entry.visit_tick.load(std::memory_order_relaxed);
    if (visit != 0 && static_cast<int32_t>(tick_ - visit) < 0) {
      if (static_cast<int32_t>(visit - next_due) < 0) next_due = visit;
      continue;
    }
    LocalConn& local = local_[FdState::From(state).conn()];
    ConnSlotShm& conn = zone_->conns().slot(FdState::From(state).conn());
    uint32_t gap_ticks = not_sending_ticks;
    if (ConnValid(conn, state) && conn.active.load(std::memory_order_relaxed) &&
        conn.proc_index.load(std::memory_order_relaxed) == me) {
      MeasureConn(fd, entry, state, conn, now_ns);
      const uint32_t packet =
          local.meter.packet_bytes.load(std::memory_order_relaxed);
      decisions_.NoteAndDecide(conn, packet, now_ns);
      if (ApplyDue(local, conn, packet, now_ns) &&
          pacer_.ApplyIfChanged(fd, entry, state, conn)) {
        local.applied_ns.store(now_ns, std::memory_order_relaxed);
      }
      const uint64_t pace =
          conn.share_bytes_per_sec.load(std::memory_order_relaxed);
      if (!idle_.ExpireIfIdle(fd, entry, state, conn, now_ns, &push)) {
        gap_ticks = 1;
      } else if (conn.active.load(std::memory_order_relaxed)) {
        gap_ticks = static_cast<uint32_t>(std::max<int64_t>(
            1, VisitGapNs(packet, pace, cpu_) / kBudgetTickNs));
      } else {
        gap_ticks = RestGapTicks(fd, entry, state, conn, now_ns, gap_ticks);
      }
    } else {
      gap_ticks = RestGapTicks(fd, entry, state, conn, now_ns, gap_ticks);
    }
    uint32_t next = tick_ + gap_ticks;
    if (gap_ticks >= round_ticks) {
      // Slow connections are visited in common ticks, so that the watcher
      // sleeps in between.
      next += round_ticks - next % round_ticks;
    }
    if (next == 0) next = 1;
    entry.visit_tick.store(next, std::memory_order_relaxed);
    if (static_cast<int32_t>(next - next_due) < 0) next_due = next;
  }
  if (push) zone_->changes().WakeWatchers();
  if (cpu_.Due(now_ns)) {
    cpu_.Update(now_ns, ThreadCpuNs(), governed);
    if (me < zone_->procs().capacity()) {
      ProcSlotShm& proc = zone_->procs().slot(me);
      proc.watcher_cpu.store(
          static_cast<uint16_t>(std::min<int64_t>(
              cpu_.used_ns_per_sec() / (kNsPerSec / 10000), UINT16_MAX)),
          std::memory_order_relaxed);
      proc.watcher_stretch.store(
          static_cast<uint16_t>(cpu_.stretch() * 100 + 0.5),
          std::memory_order_relaxed);
    }
  }
  if (drains_.Tick(now_ns)) next_due = tick_ + 1;
  // The first tick after this watcher was late does not vouch for its
  // counts: its visits may miss a connection (pinned by a send of the
  // server, which runs again at the same moment). A worker stopped for
  // 0.5 s had 85 KB of one connection counted a tick after the rest, and
  // the other watcher took the first part for unused (the level raised)
  // and the rest for a burst (cut to 0.80 of the rate for a second). Its
  // due stays past until the next tick, which comes at once.
  const bool recount = late_tick && !recounting_;
  recounting_ = recount;
  if (recount) next_due = tick_ + 1;
  // The start of tick next_due (tick numbers wrap; the difference does not).
  const int64_t ticks =
      std::max<int32_t>(1, static_cast<int32_t>(next_due - tick_));
  const int64_t due_ns =
      now_ns - now_ns % kBudgetTickNs + ticks * kBudgetTickNs;
  if (me < zone_->procs().capacity() && !recount) {
    // Published for the other watchers' decisions (LatestWatcherLateNs); a
    // wake before it (a join) only makes this one early.
    published_due_ns_ = due_ns;
    const uint32_t due_ms = static_cast<uint32_t>(due_ns / kNsPerMs);
    zone_->procs().slot(me).watcher_due_ms.store(due_ms != 0 ? due_ms : 1,
                                                 std::memory_order_relaxed);
  }
  return due_ns;
}

bool BudgetTicks::ApplyDue(const LocalConn& local, const ConnSlotShm& conn,
                           uint32_t packet_bytes, int64_t now_ns) const {
  const uint64_t pace =
      conn.share_bytes_per_sec.load(std::memory_order_relaxed);
  const uint32_t k = conn.key_index.load(std::memory_order_relaxed);
  if (pace == 0 || k >= zone_->keys().capacity()) return true;
  packet_bytes = PacketOrTwoSegments(packet_bytes);
  // A raise of an eighth or more is applied at once: a packet sent at the
  // lower level holds its connection back for the old gap, and what it did
  // not send then is lost. A cut reaches a connection only at its next
  // packet anyway. So one that sends packets far apart takes a smaller
  // raise, or a lower level, once per packet gap (a setsockopt per
  // connection and tick would cost more than the whole budget allows; the
  // level moves with every packet), unless it fell by a quarter or more.
  const uint64_t level = pacer_.ShareFor(zone_->keys().slot(k));
  if (PaceNearLevel(pace, level)) return false;
  if (level > pace ? level - pace >= pace / 8 : pace - level >= pace / 4) {
    return true;
  }
  const int64_t every = cpu_.Stretch(std::min<int64_t>(
      static_cast<int64_t>(PacketGapNs(packet_bytes, pace)), kMaxApplyGapNs));
  return now_ns - local.applied_ns.load(std::memory_order_relaxed) >= every;
}

void BudgetTicks::MeasureConn(int fd, FdEntry& entry, uint64_t state,
                              ConnSlotShm& conn, int64_t now_ns) {
  LocalConn& local = local_[FdState::From(state).conn()];
  if (now_ns < local.next_measure_ns.load(std::memory_order_relaxed)) {
    EstimateConn(local, conn, now_ns);
    return;
  }
  // Handed first, then the queue: a send in between makes this an
  // underestimate, which the next measurement corrects.
  const uint64_t handed = conn.bytes_sent.load(std::memory_order_relaxed);
  if (!FdTable::TryPin(entry, state, /*wait=*/false)) return;
  TcpSendCounts kernel;
  const bool counted = ReadTcpSendCounts(fd, &kernel);
  const int64_t unsent =
      counted ? static_cast<int64_t>(kernel.unsent) : UnsentBytes(fd);
  uint64_t left = LeftOf(handed, unsent);
  if (counted) {
    // What left the socket whoever wrote it (a child running as another
    // user, which cannot reach the zone, sends bytes this process never
    // handed), from the bytes the kernel had sent before this registration
    // (an inherited or passed socket) on.
    uint64_t base = local.kernel_base.load(std::memory_order_relaxed);
    if (base == kNoKernelBase) {
      base = kernel.left > left ? kernel.left - left : 0;
      local.kernel_base.store(base, std::memory_order_relaxed);
    }
    left = std::max(left, kernel.left > base ? kernel.left - base : 0);
  }
  const uint64_t pace =
      conn.share_bytes_per_sec.load(std::memory_order_relaxed);
  if (unsent >= 0) {
    // Pinned: the host's close, which takes it off the count, waits.
    zone_->conns().SetUnderPace(
        FdState::From(state).conn(),
        local.meter.UnderPace(left, unsent, pace, now_ns));
  }
  FdTable::Unpin(entry);
  if (unsent < 0) return;
  local.meter.Record(left, cpu_.stretch(), now_ns);
  if (rules_.AfterBytes(conn) > 0 &&
      conn.bytes_left.load(std::memory_order_relaxed) == 0) {
    // TRAFFICRATE_AFTER: what a connection sent before it joined is free.
    conn.bytes_left.store(left, std::memory_order_relaxed);
  } else {
    zone_->conns().CountLeft(conn, left);
  }
  const int64_t next =
      now_ns +
      MeasureGapNs(local.piece.load(std::memory_order_relaxed), pace, cpu_);
  local.next_measure_ns.store(next, std::memory_order_relaxed);
  if (unsent > 0) {
    // Bytes still to send: not idle before the next measurement, which
    // looks again (ExpireIdle would spend a syscall of its own to learn it),
    // nor before they can have left at its pace (ExpireIfIdle).
    // The next measurement comes at the first tick that visits it after
    // `next` (TickBudget: up to VisitGapNs later).
    const int64_t idle_check =
        next +
        VisitGapNs(local.meter.packet_bytes.load(std::memory_order_relaxed),
                   pace, cpu_) +
        kBudgetTickNs;
    if (local.next_idle_check_ns.load(std::memory_order_relaxed) < idle_check) {
      local.next_idle_check_ns.store(idle_check, std::memory_order_relaxed);
    }
    local.idle_queued.store(static_cast<uint64_t>(unsent),
                            std::memory_order_relaxed);
    local.idle_queued_ns.store(now_ns, std::memory_order_relaxed);
  } else {
    local.idle_queued.store(0, std::memory_order_relaxed);
  }
}

void BudgetTicks::EstimateConn(const LocalConn& local, ConnSlotShm& conn,
                               int64_t now_ns) {
  const uint64_t estimate = local.meter.Estimate(
      conn.share_bytes_per_sec.load(std::memory_order_relaxed),
      conn.bytes_left.load(std::memory_order_relaxed),
      conn.bytes_sent.load(std::memory_order_relaxed), now_ns);
  if (estimate > 0) zone_->conns().CountLeft(conn, estimate);
}

}  // namespace trafficrate
