// The Governor's shared-budget duties (budget.h): what the watcher does on
// each tick in budget mode, and the drain of connections closed with data
// still unsent. The rest of the Governor is in governor.cc.

#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "src/base/clock.h"
#include "src/budget/budget.h"
#include "src/budget/meter.h"
#include "src/budget/share.h"
#include "src/net/tcp_counts.h"
#include "src/runtime/governor.h"
#include "src/shm/key_budget.h"

namespace trafficrate {
namespace {

// A key is decided at least this often (its connections' packets are 2 s
// apart or more then, and every time constant of the controller is two
// packet gaps or more: KeyPace), and well within kBudgetMaxGapNs.
constexpr int64_t kMaxDecideGapNs = 500 * kNsPerMs;
// The most the watcher's CPU stretch makes of it: a visit is rounded up to
// a visit round (VisitRoundTicks) and may come a little late, and a key not
// decided for that long and two rounds more starts afresh (DecideKey:
// BudgetInput::max_gap_ns; at rounds of kVisitRoundTicks that is within
// kBudgetMaxGapNs).
constexpr int64_t kMaxStretchedDecideGapNs = 1600 * kNsPerMs;
// Connections visited this many ticks apart or more are visited in ticks
// whose number is a multiple of it (more while the watcher's work is spaced
// out: VisitRoundTicks), so that the watcher sleeps in between.
constexpr uint32_t kVisitRoundTicks = 5;
// The most that is: half a second.
constexpr uint32_t kMaxVisitRoundTicks = 5 * kVisitRoundTicks;
static_assert(kMaxStretchedDecideGapNs + 2 * kVisitRoundTicks * kBudgetTickNs <
              kBudgetMaxGapNs);
// A connection that is not sending here is looked at this many ticks
// apart (half a second); its join makes it due at once.
constexpr uint32_t kNotSendingVisitTicks = 25;
// A watcher's visit re-applies a changed level at least this often.
constexpr int64_t kMaxApplyGapNs = 4 * kNsPerSec;
// NoteAndDecide's window for the largest packet of a key's connections
// (three seconds: every sending connection is visited in it, even at the
// longest stretched gap rounded up to the longest visit round, and late by
// a round).
constexpr uint32_t kPacketWindowTicks = 3 * kNsPerSec / kBudgetTickNs;
static_assert(kMaxStretchedDecideGapNs +
                  2 * kMaxVisitRoundTicks * kBudgetTickNs <
              kPacketWindowTicks * kBudgetTickNs);
// A watcher this late or more is not waited for (BudgetInput::
// count_late_ns): its process is stopped or frozen, and its part of the
// count will not come soon.
constexpr int64_t kStoppedWatcherNs = 2 * kBudgetMaxHoldNs;
// A closed connection is kept at most this long, whatever its rate.
constexpr int64_t kMaxDrainNs = 30 * kNsPerSec;
// Kept drains' fds are duplicated to this fd number or above (or half the
// fd limit, if lower): above what hosts use, but low enough that the
// kernel's fd table does not grow much for them.
constexpr rlim_t kKeptFdBase = 4096;

// A decision or visit interval: gap_ns up to kMaxDecideGapNs, times the
// watcher's CPU stretch, up to kMaxStretchedDecideGapNs.
int64_t StretchedDecideGapNs(int64_t gap_ns, const CpuBudget& cpu) {
  return std::min(cpu.Stretch(std::min(gap_ns, kMaxDecideGapNs)),
                  kMaxStretchedDecideGapNs);
}

// How long the tick may skip a connection sending `packet_bytes` packets
// (0: not measured yet) at `pace`: a quarter of its packet gap, the interval
// at which DecideKey decides such a key, and at most kMaxDecideGapNs; all
// of it times the watcher's CPU stretch, up to kMaxStretchedDecideGapNs. A
// new level reaches the connection only at its next packet anyway; joins
// and leaves reach it at once (ApplyChangedShares).
int64_t VisitGapNs(uint32_t packet_bytes, uint64_t pace, const CpuBudget& cpu) {
  if (pace == 0) return 0;
  packet_bytes = PacketOrTwoSegments(packet_bytes);
  return std::max<int64_t>(
      0, StretchedDecideGapNs(
             static_cast<int64_t>(PacketGapNs(packet_bytes, pace) / 4), cpu));
}

// The visit round at the watcher's CPU stretch: a watcher spacing its work
// out wakes fewer times, each with more to do (a wakeup costs about as much
// as a measurement: 10 a second were a fifth of what 10 000 connections cost).
uint32_t VisitRoundTicks(const CpuBudget& cpu) {
  if (cpu.stretch() >= 4) return kMaxVisitRoundTicks;
  return cpu.stretch() >= 2 ? 2 * kVisitRoundTicks : kVisitRoundTicks;
}

// How far a key's count at `level` may lag (BudgetInput::count_lag_ns):
// its connections' measuring gap (BudgetCountLagNs), or kBudgetCountLagNs
// times the watcher's CPU stretch if that is more. Not the gap times the
// stretch: a watcher that spaces its work out has thousands of connections,
// whose steps do not come in step, and a controller that slow (16 s at
// 50 000 connections of 10 clients) held keys at 0.95 of their rate.
int64_t CountLagNs(uint64_t level, const CpuBudget& cpu) {
  return std::max(cpu.Stretch(kBudgetCountLagNs), BudgetCountLagNs(level));
}

// Of `handed` bytes, how many have left the socket with `unsent` queued.
uint64_t LeftOf(uint64_t handed, int64_t unsent) {
  return handed > static_cast<uint64_t>(unsent) ? handed - unsent : 0;
}

// Adds what left conn's socket since it was last counted to its key.
void Account(Zone& zone, ConnSlotShm& conn, uint64_t left) {
  const uint64_t before = conn.bytes_left.load(std::memory_order_relaxed);
  if (left <= before) return;
  conn.bytes_left.store(left, std::memory_order_relaxed);
  const uint32_t k = conn.key_index.load(std::memory_order_relaxed);
  if (k >= zone.keys().capacity()) return;
  zone.keys().slot(k).sent_bytes.fetch_add(left - before,
                                           std::memory_order_relaxed);
}

// Bytes of fd's connection not yet sent, or -1 if unknown.
int64_t Unsent(int fd) {
  int unsent = 0;
  if (ioctl(fd, SIOCOUTQNSD, &unsent) != 0 || unsent < 0) return -1;
  return unsent;
}

// Whether the client has not closed its end: only then will the kernel
// really send what is queued. A download client that hung up (the server's
// close follows its FIN or RST) gets none of it.
bool PeerStillReading(int fd) {
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return false;
  return info.tcpi_state == TCP_ESTABLISHED;
}

}  // namespace

bool Governor::BudgetWanted() const {
  return zone_->settings().share_mode() == ShareMode::kBudget;
}

uint64_t Governor::ShareFor(const KeySlotShm& key) const {
  const uint64_t rate = zone_->settings().KeyRate(key);
  const uint32_t active = key.active.load(std::memory_order_acquire);
  if (rate == 0 || active > zone_->conns().capacity()) {
    // Figures no process writes: a share from them could pace the key's
    // connections down to nothing. The zone is corrupt; unpaced meanwhile.
    zone_->segment().MarkCorrupt(
        rate == 0 ? "its rate is 0" : "a key counts more connections than fit");
    return kUnpaced;
  }
  if (zone_->settings().share_mode() == ShareMode::kEqual) {
    return ShareBytesPerSec(rate, active);
  }
  return LevelInForce(key.level_bytes_per_sec.load(std::memory_order_relaxed),
                      rate, active);
}

uint32_t Governor::RestGapTicks(int fd, FdEntry& entry, uint64_t state,
                                const ConnSlotShm& conn, int64_t now_ns,
                                uint32_t otherwise) {
  // Ours and at rest: visited when its rest is next looked at (a send
  // makes it due at once; a write seen now joined it: the next tick);
  // otherwise (idle in another process) as given.
  const int64_t look = LookAtRest(fd, entry, state, conn, now_ns);
  if (look == 0) return otherwise;
  return static_cast<uint32_t>(
      std::clamp<int64_t>((look - now_ns) / kBudgetTickNs, 1, INT32_MAX));
}

int64_t Governor::TickBudget(int64_t now_ns) {
  if (local_ == nullptr || key_local_ == nullptr) return now_ns + kBudgetTickNs;
  const uint32_t me = watcher_.proc_index();
  // Ticks are numbered by time, so that a watcher with nothing due may sleep
  // through some.
  tick_ = BudgetTickOf(now_ns);
  // Before this tick counts anything: a watcher that is late now (this
  // one included, until its visits below are done) misses bytes that left.
  count_late_ns_ =
      zone_->procs().LatestWatcherLateNs(now_ns, kStoppedWatcherNs);
  const bool late_tick =
      published_due_ns_ != 0 && now_ns - published_due_ns_ > kBudgetLateHoldNs;
  // Fewer, fuller ticks while the work is spaced out.
  const uint32_t round_ticks = VisitRoundTicks(cpu_);
  uint32_t next_due =
      tick_ +
      std::max<uint32_t>(kMaxBudgetSleepNs / kBudgetTickNs, round_ticks);
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
    if (state == 0 || StateConn(state) >= zone_->conns().capacity()) continue;
    ++governed;
    const uint32_t visit = entry.visit_tick.load(std::memory_order_relaxed);
    if (visit != 0 && static_cast<int32_t>(tick_ - visit) < 0) {
      if (static_cast<int32_t>(visit - next_due) < 0) next_due = visit;
      continue;
    }
    LocalConn& local = local_[StateConn(state)];
    ConnSlotShm& conn = zone_->conns().slot(StateConn(state));
    uint32_t gap_ticks = not_sending_ticks;
    if (ConnValid(conn, state) && conn.active.load(std::memory_order_relaxed) &&
        conn.proc_index.load(std::memory_order_relaxed) == me) {
      MeasureConn(fd, entry, state, conn, now_ns);
      const uint32_t packet =
          local.meter.packet_bytes.load(std::memory_order_relaxed);
      NoteAndDecide(conn, packet, now_ns);
      if (ApplyDue(local, conn, packet, now_ns) &&
          ApplyIfChanged(fd, entry, state, conn)) {
        local.applied_ns.store(now_ns, std::memory_order_relaxed);
      }
      const uint64_t pace =
          conn.share_bytes_per_sec.load(std::memory_order_relaxed);
      if (!ExpireIfIdle(fd, entry, state, conn, now_ns, &push)) {
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
  if (TickDrains(now_ns)) next_due = tick_ + 1;
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

bool Governor::ApplyDue(const LocalConn& local, const ConnSlotShm& conn,
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
  const uint64_t level = ShareFor(zone_->keys().slot(k));
  if (PaceNearLevel(pace, level)) return false;
  if (level > pace ? level - pace >= pace / 8 : pace - level >= pace / 4) {
    return true;
  }
  const int64_t every = cpu_.Stretch(std::min<int64_t>(
      static_cast<int64_t>(PacketGapNs(packet_bytes, pace)), kMaxApplyGapNs));
  return now_ns - local.applied_ns.load(std::memory_order_relaxed) >= every;
}

void Governor::MeasureConn(int fd, FdEntry& entry, uint64_t state,
                           ConnSlotShm& conn, int64_t now_ns) {
  LocalConn& local = local_[StateConn(state)];
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
      counted ? static_cast<int64_t>(kernel.unsent) : Unsent(fd);
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
        StateConn(state), local.meter.UnderPace(left, unsent, pace, now_ns));
  }
  FdTable::Unpin(entry);
  if (unsent < 0) return;
  local.meter.Record(left, cpu_.stretch(), now_ns);
  if (rules_.AfterBytes(conn) > 0 &&
      conn.bytes_left.load(std::memory_order_relaxed) == 0) {
    // TRAFFICRATE_AFTER: what a connection sent before it joined is free.
    conn.bytes_left.store(left, std::memory_order_relaxed);
  } else {
    Account(*zone_, conn, left);
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

void Governor::EstimateConn(const LocalConn& local, ConnSlotShm& conn,
                            int64_t now_ns) {
  const uint64_t estimate = local.meter.Estimate(
      conn.share_bytes_per_sec.load(std::memory_order_relaxed),
      conn.bytes_left.load(std::memory_order_relaxed),
      conn.bytes_sent.load(std::memory_order_relaxed), now_ns);
  if (estimate > 0) Account(*zone_, conn, estimate);
}

void Governor::NoteAndDecide(const ConnSlotShm& conn, uint32_t packet_bytes,
                             int64_t now_ns) {
  const uint32_t k = conn.key_index.load(std::memory_order_relaxed);
  if (k >= zone_->keys().capacity()) return;
  LocalKey& local = key_local_[k];
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

void Governor::DecideKey(uint32_t key_index, uint32_t packet_bytes,
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

bool Governor::KeepDraining(int fd, uint64_t state, bool may_keep_fd) {
  const uint32_t index = StateConn(state);
  if (local_ == nullptr || index >= zone_->conns().capacity()) return false;
  ConnSlotShm& conn = zone_->conns().slot(index);
  if (!ConnValid(conn, state) || !conn.active.load(std::memory_order_relaxed) ||
      conn.proc_index.load(std::memory_order_relaxed) !=
          watcher_.proc_index() ||
      (local_[index].refs.load(std::memory_order_relaxed) & 0xffffffffu) != 1 ||
      zone_->handoffs().MayBeHandedOff(index, StateCookie(state))) {
    // Passed to another process, which sends the rest (Release keeps it).
    return false;
  }
  const int64_t unsent = Unsent(fd);
  if (unsent <= 0 || !PeerStillReading(fd)) return false;
  int slot = 0;
  for (; slot < kDrainSlots; ++slot) {
    uint64_t empty = 0;
    if (drains_[slot].compare_exchange_strong(empty, kDrainFilling,
                                              std::memory_order_acq_rel)) {
      break;
    }
  }
  if (slot == kDrainSlots) return false;  // full: counted as sent at once
  if (!DropLocalRef(index, StateCookie(state))) {
    // Another fd of this process still has it (a dup raced the close).
    drains_[slot].store(0, std::memory_order_release);
    return true;
  }
  // What is left leaves at the pacing rate in force: a cut not applied yet
  // (ApplyDue defers small ones) is applied now. Without a kept fd that
  // rate holds for good, since nobody can change an orphaned socket's.
  const uint32_t k = conn.key_index.load(std::memory_order_relaxed);
  uint64_t token = kNeverApplied;
  if (k < zone_->keys().capacity()) {
    token = ShareToken(zone_->keys().slot(k));
    const uint64_t level = ShareFor(zone_->keys().slot(k));
    const uint64_t pace =
        conn.share_bytes_per_sec.load(std::memory_order_relaxed);
    if (level > 0 && (pace == 0 || level < pace)) SetPacing(fd, conn, level);
  }
  Account(*zone_, conn,
          LeftOf(conn.bytes_sent.load(std::memory_order_relaxed), unsent));
  conn.drain_bytes.store(static_cast<uint64_t>(unsent),
                         std::memory_order_relaxed);
  // While draining, next_measure_ns holds when the drain began.
  const int64_t now = options_.clock->NowNs();
  local_[index].drain_last_ns.store(now, std::memory_order_relaxed);
  local_[index].next_measure_ns.store(now, std::memory_order_relaxed);
  const int kept = may_keep_fd ? KeepFd(fd, static_cast<uint32_t>(slot)) : -1;
  drain_token_[slot].store(token, std::memory_order_relaxed);
  drain_due_ns_[slot].store(now + kBudgetTickNs, std::memory_order_relaxed);
  drain_fd_[slot].store(kept + 1, std::memory_order_relaxed);
  drains_[slot].store(uint64_t{index} << 32 | StateCookie(state),
                      std::memory_order_release);
  return true;
}

int Governor::KeepFd(int fd, uint32_t slot) {
  if (epolls_unknown_.load(std::memory_order_relaxed) ||
      kept_drains_.load(std::memory_order_relaxed) >= kMaxKeptDrains) {
    return -1;
  }
  // Closing it would reset the connection (SO_LINGER 0, or data the host
  // never read) or wait for the drain (SO_LINGER > 0): the host's close
  // then does what it did without us.
  linger lg{};
  socklen_t lg_len = sizeof(lg);
  int unread = 0;
  if (getsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, &lg_len) != 0 ||
      lg.l_onoff != 0 || ioctl(fd, SIOCINQ, &unread) != 0 || unread != 0) {
    return -1;
  }
  // Above the host's fds (half its limit, at most kKeptFdBase and within
  // the fd table), and at most one in 16 of its limit, so that the host
  // never runs short of fds because of us (an accept that does anyway gets
  // them back: ReleaseKeptDrains).
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur < 64 ||
      static_cast<rlim_t>(kept_drains_.load(std::memory_order_relaxed)) >=
          limit.rlim_cur / 16) {
    return -1;
  }
  const long base = static_cast<long>(
      std::min({limit.rlim_cur / 2, kKeptFdBase,
                static_cast<rlim_t>(table_->capacity() / 2)}));
  const int kept =
      static_cast<int>(syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, base));
  if (kept < 0) return -1;
  FdEntry* entry = table_->Get(kept);
  if (entry == nullptr || entry->state.load(std::memory_order_relaxed) != 0) {
    syscall(SYS_close, kept);
    return -1;
  }
  // The host's epoll sets would go on reporting the socket (a registration
  // lives as long as the open file): taken out while the host's fd number
  // still names it.
  for (const std::atomic<int32_t>& epoll : epolls_) {
    const int32_t epfd = epoll.load(std::memory_order_relaxed) - 1;
    if (epfd >= 0) epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
  }
  kept_drains_.fetch_add(1, std::memory_order_relaxed);
  entry->visit_tick.store(0, std::memory_order_relaxed);
  entry->state.store(KeptDrainState(slot), std::memory_order_release);
  table_->NoteTracked(kept);
  return kept;
}

void Governor::DropKept(uint32_t slot) {
  if (slot >= static_cast<uint32_t>(kDrainSlots)) return;
  drain_fd_[slot].store(0, std::memory_order_relaxed);
  kept_drains_.fetch_sub(1, std::memory_order_relaxed);
}

bool Governor::CloseKept(uint32_t slot) {
  const int kept = drain_fd_[slot].load(std::memory_order_relaxed) - 1;
  FdEntry* entry = kept >= 0 ? table_->Get(kept) : nullptr;
  if (entry == nullptr) return false;
  const uint64_t expected = KeptDrainState(slot);
  // Whoever clears the mark owns the fd: a host close racing this one
  // (Release) only drops it from the books.
  if (entry->state.load(std::memory_order_acquire) != expected ||
      FdTable::Untrack(*entry) != expected) {
    return false;
  }
  DropKept(slot);
  syscall(SYS_close, kept);
  return true;
}

int Governor::ReleaseKeptDrains() {
  if (kept_drains_.load(std::memory_order_relaxed) == 0) return 0;
  int released = 0;
  for (int slot = 0; slot < kDrainSlots; ++slot) {
    released += CloseKept(static_cast<uint32_t>(slot));
  }
  return released;
}

int64_t Governor::VisitKept(uint32_t slot, int fd, const ConnSlotShm& conn) {
  FdEntry* entry = table_->Get(fd);
  if (entry == nullptr ||
      !FdTable::TryPin(*entry, KeptDrainState(slot), /*wait=*/false)) {
    return -1;
  }
  int64_t unsent = Unsent(fd);
  if (unsent > 0 && !PeerStillReading(fd)) unsent = 0;  // nothing more goes
  const uint32_t k = conn.key_index.load(std::memory_order_relaxed);
  if (unsent > 0 && k < zone_->keys().capacity()) {
    const KeySlotShm& key = zone_->keys().slot(k);
    const uint64_t token = ShareToken(key);
    const uint64_t level = ShareFor(key);
    if (token != drain_token_[slot].load(std::memory_order_relaxed) &&
        level > 0 && SetPacing(fd, conn, level)) {
      drain_token_[slot].store(token, std::memory_order_relaxed);
    }
  }
  FdTable::Unpin(*entry);
  return unsent;
}

void Governor::FinishDrains(int64_t now_ns) { TickDrains(now_ns); }

bool Governor::TickDrains(int64_t now_ns) {
  const uint32_t me = watcher_.proc_index();
  bool pending = false;
  for (int slot = 0; slot < kDrainSlots; ++slot) {
    const uint64_t packed = drains_[slot].load(std::memory_order_acquire);
    if (packed == 0) continue;
    pending = true;
    if (packed == kDrainFilling) continue;
    const uint32_t index = static_cast<uint32_t>(packed >> 32);
    const uint64_t state = PackState(index, static_cast<uint32_t>(packed));
    const int kept = drain_fd_[slot].load(std::memory_order_relaxed) - 1;
    if (index >= zone_->conns().capacity()) {
      CloseKept(static_cast<uint32_t>(slot));
      drains_[slot].store(0, std::memory_order_release);
      continue;
    }
    ConnSlotShm& conn = zone_->conns().slot(index);
    if (!ConnValid(conn, state) ||
        conn.proc_index.load(std::memory_order_relaxed) != me) {
      CloseKept(static_cast<uint32_t>(slot));
      drains_[slot].store(0, std::memory_order_release);  // reaped meanwhile
      continue;
    }
    LocalConn& local = local_[index];
    uint64_t remaining = conn.drain_bytes.load(std::memory_order_relaxed);
    uint64_t pace = conn.share_bytes_per_sec.load(std::memory_order_relaxed);
    if (pace == 0) {
      const uint32_t key = conn.key_index.load(std::memory_order_relaxed);
      pace = key < zone_->keys().capacity()
                 ? zone_->settings().KeyRate(zone_->keys().slot(key))
                 : zone_->settings().RuleRate(0);
    }
    const bool too_old =
        now_ns - local.next_measure_ns.load(std::memory_order_relaxed) >
        kMaxDrainNs;
    bool done = too_old;
    bool measured = false;
    const uint32_t k = conn.key_index.load(std::memory_order_relaxed);
    if (kept >= 0 && !too_old &&
        (now_ns >= drain_due_ns_[slot].load(std::memory_order_relaxed) ||
         (k < zone_->keys().capacity() &&
          ShareToken(zone_->keys().slot(k)) !=
              drain_token_[slot].load(std::memory_order_relaxed)))) {
      // Kept open: measured (and paced at the level) like a sending
      // connection, about twice per remaining drain time.
      const int64_t unsent = VisitKept(static_cast<uint32_t>(slot), kept, conn);
      if (unsent >= 0) {
        measured = true;
        Account(
            *zone_, conn,
            LeftOf(conn.bytes_sent.load(std::memory_order_relaxed), unsent));
        remaining = static_cast<uint64_t>(unsent);
        done = unsent == 0;
        local.drain_last_ns.store(now_ns, std::memory_order_relaxed);
        const double left_ns = PacketGapNs(static_cast<double>(remaining),
                                           static_cast<double>(pace));
        drain_due_ns_[slot].store(
            now_ns + std::clamp<int64_t>(static_cast<int64_t>(left_ns / 2),
                                         kBudgetTickNs, kMaxDecideGapNs),
            std::memory_order_relaxed);
      }
    }
    if (!measured && !too_old) {
      // The kernel sends what is left at the pacing rate in force.
      const int64_t dt =
          now_ns - local.drain_last_ns.load(std::memory_order_relaxed);
      const uint64_t drained =
          dt <= 0 ? 0
                  : static_cast<uint64_t>(static_cast<double>(pace) * dt /
                                          kNsPerSec);
      // A kept drain ends when measured empty; a modelled one when the
      // model says so.
      const bool kept_now =
          drain_fd_[slot].load(std::memory_order_relaxed) != 0;
      uint64_t step = std::min(drained, remaining);
      if (kept_now && step >= remaining && remaining > 0) step = remaining - 1;
      done = !kept_now && drained >= remaining;
      if (step > 0) {
        Account(*zone_, conn,
                conn.bytes_left.load(std::memory_order_relaxed) + step);
        local.drain_last_ns.store(now_ns, std::memory_order_relaxed);
      }
      remaining -= step;
    }
    if (done) {
      Account(*zone_, conn,
              conn.bytes_left.load(std::memory_order_relaxed) + remaining);
      remaining = 0;
    }
    conn.drain_bytes.store(remaining, std::memory_order_relaxed);
    if (BudgetWanted()) {
      NoteAndDecide(conn,
                    local.meter.packet_bytes.load(std::memory_order_relaxed),
                    now_ns);
    }
    if (!done) continue;
    CloseKept(static_cast<uint32_t>(slot));
    bool push = false;
    {
      ZoneLock lock(*zone_);
      if (!lock.ok()) continue;  // try again next tick
      if (ConnValid(conn, state) &&
          conn.proc_index.load(std::memory_order_relaxed) == me) {
        push = DeregisterLocked(index);
      }
    }
    drains_[slot].store(0, std::memory_order_release);
    if (push) zone_->changes().WakeWatchers();
  }
  return pending;
}

}  // namespace trafficrate
