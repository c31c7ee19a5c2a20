#include "src/runtime/drains.h"

#include <fcntl.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "src/budget/budget.h"
#include "src/budget/share.h"
#include "src/budget/visit_timing.h"
#include "src/net/send_queue.h"

namespace trafficrate {
namespace {

// A closed connection is kept at most this long, whatever its rate.
constexpr int64_t kMaxDrainNs = 30 * kNsPerSec;
// Kept drains' fds are duplicated to this fd number or above (or half the
// fd limit, if lower): above what hosts use, but low enough that the
// kernel's fd table does not grow much for them.
constexpr rlim_t kKeptFdBase = 4096;

}  // namespace

bool Drains::KeepDraining(int fd, uint64_t state, bool may_keep_fd) {
  const uint32_t index = FdState::From(state).conn();
  if (!local_.ok() || index >= zone_->conns().capacity()) return false;
  ConnSlotShm& conn = zone_->conns().slot(index);
  if (!ConnValid(conn, state) || !conn.active.load(std::memory_order_relaxed) ||
      conn.proc_index.load(std::memory_order_relaxed) !=
          watcher_.proc_index() ||
      LocalRefs::From(local_[index].refs.load(std::memory_order_relaxed))
              .count() != 1 ||
      zone_->handoffs().MayBeHandedOff(index, FdState::From(state).cookie())) {
    // Passed to another process, which sends the rest (Release keeps it).
    return false;
  }
  const int64_t unsent = UnsentBytes(fd);
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
  if (!local_.DropRef(index, FdState::From(state).cookie())) {
    // Another fd of this process still has it (a dup raced the close).
    drains_[slot].store(0, std::memory_order_release);
    return true;
  }
  // What is left leaves at the pacing rate in force: a cut not applied yet
  // (ApplyDue defers small ones) is applied now. Without a kept fd that
  // rate holds for good, since nobody can change an orphaned socket's.
  const uint32_t k = conn.key_index.load(std::memory_order_relaxed);
  uint64_t token = ShareGenerations::NeverApplied().word();
  if (k < zone_->keys().capacity()) {
    token = pacer_.ShareToken(zone_->keys().slot(k));
    const uint64_t level = pacer_.ShareFor(zone_->keys().slot(k));
    const uint64_t pace =
        conn.share_bytes_per_sec.load(std::memory_order_relaxed);
    if (level > 0 && (pace == 0 || level < pace))
      pacer_.SetPacing(fd, conn, level);
  }
  zone_->conns().CountLeft(
      conn, LeftOf(conn.bytes_sent.load(std::memory_order_relaxed), unsent));
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
  drains_[slot].store(ConnRef::Of(index, FdState::From(state).cookie()).word(),
                      std::memory_order_release);
  return true;
}

int Drains::KeepFd(int fd, uint32_t slot) {
  if (epolls_.unknown() ||
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
  epolls_.RemoveFromAll(fd);
  kept_drains_.fetch_add(1, std::memory_order_relaxed);
  entry->visit_tick.store(0, std::memory_order_relaxed);
  entry->state.store(FdState::KeptDrain(slot).word(),
                     std::memory_order_release);
  table_->NoteTracked(kept);
  return kept;
}

void Drains::DropKept(uint32_t slot) {
  if (slot >= static_cast<uint32_t>(kDrainSlots)) return;
  drain_fd_[slot].store(0, std::memory_order_relaxed);
  kept_drains_.fetch_sub(1, std::memory_order_relaxed);
}

bool Drains::CloseKept(uint32_t slot) {
  const int kept = drain_fd_[slot].load(std::memory_order_relaxed) - 1;
  FdEntry* entry = kept >= 0 ? table_->Get(kept) : nullptr;
  if (entry == nullptr) return false;
  const uint64_t expected = FdState::KeptDrain(slot).word();
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

int Drains::ReleaseKept() {
  if (kept_drains_.load(std::memory_order_relaxed) == 0) return 0;
  int released = 0;
  for (int slot = 0; slot < kDrainSlots; ++slot) {
    released += CloseKept(static_cast<uint32_t>(slot));
  }
  return released;
}

int64_t Drains::VisitKept(uint32_t slot, int fd, const ConnSlotShm& conn) {
  FdEntry* entry = table_->Get(fd);
  if (entry == nullptr ||
      !FdTable::TryPin(*entry, FdState::KeptDrain(slot).word(),
                       /*wait=*/false)) {
    return -1;
  }
  int64_t unsent = UnsentBytes(fd);
  if (unsent > 0 && !PeerStillReading(fd)) unsent = 0;  // nothing more goes
  const uint32_t k = conn.key_index.load(std::memory_order_relaxed);
  if (unsent > 0 && k < zone_->keys().capacity()) {
    const KeySlotShm& key = zone_->keys().slot(k);
    const uint64_t token = pacer_.ShareToken(key);
    const uint64_t level = pacer_.ShareFor(key);
    if (token != drain_token_[slot].load(std::memory_order_relaxed) &&
        level > 0 && pacer_.SetPacing(fd, conn, level)) {
      drain_token_[slot].store(token, std::memory_order_relaxed);
    }
  }
  FdTable::Unpin(*entry);
  return unsent;
}

bool Drains::Tick(int64_t now_ns) {
  const uint32_t me = watcher_.proc_index();
  bool pending = false;
  for (int slot = 0; slot < kDrainSlots; ++slot) {
    const uint64_t packed = drains_[slot].load(std::memory_order_acquire);
    if (packed == 0) continue;
    pending = true;
    if (packed == kDrainFilling) continue;
    const ConnRef ref = ConnRef::From(packed);
    const uint32_t index = ref.conn();
    const uint64_t state = FdState::Conn(index, ref.cookie()).word();
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
          pacer_.ShareToken(zone_->keys().slot(k)) !=
              drain_token_[slot].load(std::memory_order_relaxed)))) {
      // Kept open: measured (and paced at the level) like a sending
      // connection, about twice per remaining drain time.
      const int64_t unsent = VisitKept(static_cast<uint32_t>(slot), kept, conn);
      if (unsent >= 0) {
        measured = true;
        zone_->conns().CountLeft(
            conn,
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
        zone_->conns().CountLeft(
            conn, conn.bytes_left.load(std::memory_order_relaxed) + step);
        local.drain_last_ns.store(now_ns, std::memory_order_relaxed);
      }
      remaining -= step;
    }
    if (done) {
      zone_->conns().CountLeft(
          conn, conn.bytes_left.load(std::memory_order_relaxed) + remaining);
      remaining = 0;
    }
    conn.drain_bytes.store(remaining, std::memory_order_relaxed);
    if (BudgetWanted()) {
      decisions_.NoteAndDecide(
          conn, local.meter.packet_bytes.load(std::memory_order_relaxed),
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
        push = registry_.DeregisterLocked(index);
      }
    }
    drains_[slot].store(0, std::memory_order_release);
    if (push) zone_->changes().WakeWatchers();
  }
  return pending;
}

void Drains::AfterForkChild() {
  for (int slot = 0; slot < kDrainSlots; ++slot) {
    const int kept = drain_fd_[slot].load(std::memory_order_relaxed) - 1;
    if (kept >= 0) {
      if (FdEntry* entry = table_->Get(kept)) {
        entry->state.store(0, std::memory_order_relaxed);
      }
      syscall(SYS_close, kept);
      drain_fd_[slot].store(0, std::memory_order_relaxed);
    }
    drains_[slot].store(0, std::memory_order_relaxed);
  }
  kept_drains_.store(0, std::memory_order_relaxed);
}

void Drains::PassThrough() {
  for (int slot = 0; slot < kDrainSlots; ++slot) {
    const int kept = drain_fd_[slot].load(std::memory_order_relaxed) - 1;
    if (kept < 0) continue;
    setsockopt(kept, SOL_SOCKET, SO_MAX_PACING_RATE, &kUnpaced,
               sizeof(kUnpaced));
    CloseKept(static_cast<uint32_t>(slot));
  }
}

}  // namespace trafficrate
