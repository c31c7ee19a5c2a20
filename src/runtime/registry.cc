#include "src/runtime/registry.h"

#include <sys/socket.h>

#include "src/budget/shaper.h"
#include "src/net/send_queue.h"
#include "src/runtime/classify.h"

namespace trafficrate {

bool Registry::ClassifyFd(int fd, const sockaddr* peer, socklen_t peer_len,
                          ConnKey* key, uint8_t peer16[16],
                          uint16_t* peer_port) const {
  const RuleSet::Read rules(rules_);
  return ClassifyConn(fd, options_.key, options_.rules, rules.table(), peer,
                      peer_len, key, peer16, peer_port);
}

void Registry::Register(int fd, FdEntry& entry, const ConnKey& key,
                        const uint8_t peer16[16], uint16_t peer_port,
                        uint64_t expected, bool inherited) {
  if (zone_->segment().corrupt()) return;
  const uint32_t proc = watcher_.EnsureStarted();
  if (proc == kNoSlot) {
    // The watcher is still starting (it waits for the zone lock): it
    // registers the connection once it runs (RegisterPending). If it
    // failed for good, the process passes through.
    if (watcher_.starting()) MarkPending(fd, entry, &key);
    return;
  }
  const int64_t now = options_.clock->NowNs();
  uint32_t conn = kNoSlot;
  uint32_t cookie = 0;
  {
    ZoneLock lock(*zone_);
    if (!lock.ok()) {
      MarkPending(fd, entry, &key);
      return;
    }
    const uint32_t k = zone_->keys().FindOrInsertLocked(key.bytes, now);
    if (k != kNoSlot && inherited) {
      conn = zone_->conns().FindLocked(k, peer16, peer_port);
    }
    if (k != kNoSlot && conn != kNoSlot) {
      cookie = ConnTable::CookieOf(
          zone_->conns().slot(conn).seq.load(std::memory_order_relaxed));
    } else if (k != kNoSlot) {
      conn = zone_->conns().RegisterLocked(k, proc, fd, peer16, peer_port);
      if (conn == kNoSlot) {
        zone_->keys().ReleaseIfUnusedLocked(k);
      } else {
        cookie = ConnTable::CookieOf(
            zone_->conns().slot(conn).seq.load(std::memory_order_relaxed));
      }
    }
  }
  if (conn == kNoSlot) {
    if (Logger::Allow(last_full_log_ns_, now)) {
      logger_->Warning(
          "zone %s is full (%u keys, %u connections); new "
          "connections pass through unpaced; raise "
          "TRAFFICRATE_ZONE_SIZE",
          zone_->name().c_str(), zone_->keys().capacity(),
          zone_->conns().capacity());
    }
    return;
  }
  Adopt(fd, entry, conn, cookie, now, expected,
        /*fresh=*/!inherited && expected == 0);
}

bool Registry::Adopt(int fd, FdEntry& entry, uint32_t conn, uint32_t cookie,
                     int64_t now, uint64_t expected, bool fresh) {
  local_.AddRef(conn, cookie);
  entry.applied.store(ShareGenerations::NeverApplied().word(),
                      std::memory_order_relaxed);
  entry.visit_tick.store(0, std::memory_order_relaxed);
  // A connection paced from its first byte sends its first segments as
  // first pieces; one that sends TRAFFICRATE_AFTER bytes unpaced first has
  // used them by the time it is paced.
  local_.Reset(conn, now,
               fresh && rules_.AfterBytes(zone_->conns().slot(conn)) == 0
                   ? kFirstPieces
                   : 0);
  if (!entry.state.compare_exchange_strong(expected,
                                           FdState::Conn(conn, cookie).word(),
                                           std::memory_order_acq_rel)) {
    // Closed meanwhile (RegisterPending, from the watcher): the
    // registration ends with it.
    Release(FdState::Conn(conn, cookie).word());
    return false;
  }
  table_->NoteTracked(fd);
  return true;
}

void Registry::MarkPending(int fd, FdEntry& entry, const ConnKey* key) {
  if (zone_->segment().corrupt()) return;
  if (key != nullptr) {
    // Until it is registered, at most its rule's rate: never unpaced, never
    // more than the key may have (its siblings are paced already).
    uint64_t rate =
        zone_->settings().RuleRate(ZoneSettings::RuleOfKeyBytes(key->bytes));
    if (rate == 0) rate = zone_->settings().RuleRate(0);
    if (rate != 0) {
      setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, sizeof(rate));
    }
  }
  entry.state.store(FdState::Pending().word(), std::memory_order_release);
  table_->NoteTracked(fd);
  pending_maybe_.store(true, std::memory_order_release);
}

void Registry::RegisterPending() {
  if (!pending_maybe_.load(std::memory_order_acquire) ||
      zone_->lock_stalled() || zone_->segment().corrupt() ||
      watcher_.starting() || rules_.Stale()) {
    return;
  }
  pending_maybe_.store(false, std::memory_order_release);
  const int high_water = table_->high_water();
  for (int fd = 0; fd < high_water; ++fd) {
    FdEntry& entry = *table_->Get(fd);
    if (entry.state.load(std::memory_order_acquire) !=
        FdState::Pending().word()) {
      continue;
    }
    // Pinned, so that the host's close waits for us (it clears the state
    // first: Adopt's exchange then fails, and the registration ends).
    if (!FdTable::TryPin(entry, FdState::Pending().word(), /*wait=*/false)) {
      pending_maybe_.store(true, std::memory_order_release);
      continue;
    }
    ConnKey key;
    uint8_t peer16[16];
    uint16_t peer_port = 0;
    const bool is_conn = ClassifyFd(fd, nullptr, 0, &key, peer16, &peer_port);
    uint64_t state = FdState::Pending().word();
    if (!is_conn) {
      entry.state.compare_exchange_strong(state, 0, std::memory_order_acq_rel);
    } else {
      Register(fd, entry, key, peer16, peer_port, FdState::Pending().word());
      state = entry.state.load(std::memory_order_acquire);
    }
    FdTable::Unpin(entry);
    if (state == FdState::Pending().word()) {
      pending_maybe_.store(true, std::memory_order_release);  // next loop
    } else if (IsConnState(state)) {
      // It was sending all along: it joins now, not at its next send,
      // which a full socket may put off for seconds.
      JoinSlow(fd, entry, state);
    }
  }
}

void Registry::RetryRegister(int fd, FdEntry& entry, uint64_t pending) {
  // While the lock is still held, or the watcher still starts, no system
  // call: the send goes out unpaced, as it would without the library.
  if (zone_->lock_stalled() || zone_->segment().corrupt() ||
      watcher_.starting() || rules_.Stale()) {
    return;
  }
  uint64_t expected = pending;
  if (!entry.state.compare_exchange_strong(expected, 0,
                                           std::memory_order_acq_rel)) {
    return;  // another thread of this process is at it
  }
  ConnKey key;
  uint8_t peer16[16];
  uint16_t peer_port = 0;
  const bool is_conn = ClassifyFd(fd, nullptr, 0, &key, peer16, &peer_port);
  if (is_conn) {
    Register(fd, entry, key, peer16, peer_port, /*expected=*/0,
             /*inherited=*/pending != FdState::Pending().word());
  }
  if (pending != FdState::Pending().word()) SettleGroup(fd, entry, pending);
  const uint64_t state = entry.state.load(std::memory_order_acquire);
  if (IsConnState(state)) {
    JoinSlow(fd, entry, state);
  }
}

void Registry::SettleGroup(int fd, FdEntry& entry, uint64_t pending) {
  const uint64_t state = entry.state.load(std::memory_order_acquire);
  if (state == FdState::Pending().word()) {
    // Not registered yet (the zone lock is held, the watcher starts): the
    // group waits on, for the next send through any of its fds.
    entry.state.store(pending, std::memory_order_release);
    return;
  }
  const int high_water = table_->high_water();
  for (int other = 0; other < high_water; ++other) {
    FdEntry& mate = *table_->Get(other);
    uint64_t expected = pending;
    if (other == fd || !mate.state.compare_exchange_strong(
                           expected, 0, std::memory_order_acq_rel)) {
      continue;
    }
    if (state != 0) CopyRegistration(entry, state, mate, other);
  }
}

void Registry::CopyRegistration(const FdEntry& from, uint64_t state,
                                FdEntry& to, int newfd) const {
  local_.AddRef(FdState::From(state).conn(), FdState::From(state).cookie());
  to.applied.store(from.applied.load(std::memory_order_relaxed),
                   std::memory_order_relaxed);
  to.state.store(state, std::memory_order_release);
  table_->NoteTracked(newfd);
}

bool Registry::PastAfter(int fd, const ConnSlotShm& conn) const {
  const uint64_t after = rules_.AfterBytes(conn);
  if (after == 0) return true;
  const uint64_t queued = conn.bytes_sent.load(std::memory_order_relaxed);
  if (queued < after) return false;
  // Queued is not sent: a share set now would pace what still waits in the
  // socket, first bytes included. Count only what has left it.
  const int64_t unsent = UnsentBytes(fd);
  if (unsent < 0) return true;
  return queued - static_cast<uint64_t>(unsent) >= after;
}

void Registry::JoinSlow(int fd, FdEntry& entry, uint64_t state) {
  const uint32_t index = FdState::From(state).conn();
  const ConnSlotShm& conn = zone_->conns().slot(index);
  uint32_t me = watcher_.proc_index();
  const bool ours = conn.proc_index.load(std::memory_order_relaxed) == me;
  if (!ours && conn.active.load(std::memory_order_relaxed)) {
    // Inherited across fork from the process that registered it, which
    // counts it as sending: it is counted once already.
    pacer_.ApplyIfChanged(fd, entry, state, conn);
    return;
  }
  // TRAFFICRATE_AFTER: the connection takes no share and is not paced until
  // its first after_bytes have left the socket; the watcher's tick joins it
  // if no send comes by then.
  const bool join = PastAfter(fd, conn);
  if (!ours) {
    me = watcher_.EnsureStarted();
    if (me == kNoSlot) return;
  } else if (!join) {
    return;  // ours, still within TRAFFICRATE_AFTER: no lock
  }
  bool push = false;
  {
    ZoneLock lock(*zone_);
    if (!lock.ok() || !ConnValid(conn, state)) return;
    if (conn.proc_index.load(std::memory_order_relaxed) != me &&
        !conn.active.load(std::memory_order_relaxed)) {
      // The sender owns it from now on (also before it joins): its watcher
      // paces and expires it, and its close ends the registration.
      zone_->conns().TransferLocked(index, me, fd);
    }
    push =
        join && zone_->conns().JoinLocked(index) && SiblingsSendingLocked(conn);
  }
  if (push) zone_->changes().WakeWatchers();
  if (join) {
    entry.visit_tick.store(0, std::memory_order_relaxed);
    // Whether it sends under its pace is judged afresh: the time it was
    // idle says nothing about it.
    local_[index].meter.RestartUnderPace();
    pacer_.ApplyIfChanged(fd, entry, state, conn);
  }
}

void Registry::Reregister(int fd, FdEntry& entry, uint64_t state) {
  // The registration ended in another process (the one that accepted it
  // closed its copy, or died): register again here, for this fd and every
  // duplicate of it in this process.
  ConnKey key;
  uint8_t peer16[16];
  uint16_t peer_port = 0;
  const bool is_conn = ClassifyFd(fd, nullptr, 0, &key, peer16, &peer_port);
  if (!entry.state.compare_exchange_strong(state, 0,
                                           std::memory_order_acq_rel)) {
    return;  // another thread of this process is at it
  }
  Release(state);
  if (!is_conn) return;
  Register(fd, entry, key, peer16, peer_port);
  const uint64_t fresh = entry.state.load(std::memory_order_acquire);
  if (fresh == 0) return;
  const int high_water = table_->high_water();
  for (int other = 0; other < high_water; ++other) {
    FdEntry& dup = *table_->Get(other);
    uint64_t expected = state;
    if (other != fd && dup.state.compare_exchange_strong(
                           expected, fresh, std::memory_order_acq_rel)) {
      local_.DropRef(FdState::From(state).conn(),
                     FdState::From(state).cookie());
      local_.AddRef(FdState::From(fresh).conn(), FdState::From(fresh).cookie());
    }
  }
  JoinSlow(fd, entry, fresh);
}

void Registry::Release(uint64_t state) {
  if (state == 0 || !local_.ok()) return;
  const uint32_t index = FdState::From(state).conn();
  if (index >= zone_->conns().capacity() ||
      !local_.DropRef(index, FdState::From(state).cookie())) {
    return;
  }
  // The last fd of this process on that connection. Only its owner ends the
  // registration: an inherited copy closing must not.
  const ConnSlotShm& conn = zone_->conns().slot(index);
  const uint32_t me = watcher_.proc_index();
  if (!ConnValid(conn, state) ||
      conn.proc_index.load(std::memory_order_relaxed) != me) {
    return;
  }
  bool push = false;
  {
    ZoneLock lock(*zone_);
    if (!lock.ok()) {
      DeferRelease(state);
      return;
    }
    if (!ConnValid(conn, state) ||
        conn.proc_index.load(std::memory_order_relaxed) != me ||
        zone_->handoffs().PendingLocked(index, FdState::From(state).cookie())) {
      // Passed to another process and not received yet: its receiver
      // takes the registration over (or ExpireHandoffs ends it).
      return;
    }
    push = DeregisterLocked(index);
  }
  if (push) zone_->changes().WakeWatchers();
}

bool Registry::DeregisterLocked(uint32_t index) const {
  const uint32_t key =
      zone_->conns().slot(index).key_index.load(std::memory_order_relaxed);
  return zone_->conns().DeregisterLocked(index) &&
         key < zone_->keys().capacity() &&
         zone_->keys().slot(key).active.load(std::memory_order_relaxed) > 0;
}

bool Registry::SiblingsSendingLocked(const ConnSlotShm& conn) const {
  // Only the other sending connections of the key need a new share: a
  // client with a single connection (the common case under connection
  // churn) joins and leaves without waking any watcher.
  const uint32_t key = conn.key_index.load(std::memory_order_relaxed);
  if (key >= zone_->keys().capacity()) return false;
  const uint32_t others = conn.active.load(std::memory_order_relaxed) ? 1 : 0;
  return zone_->keys().slot(key).active.load(std::memory_order_relaxed) >
         others;
}

void Registry::DeferRelease(uint64_t state) {
  if (zone_->segment().corrupt()) return;
  for (std::atomic<uint64_t>& slot : deferred_) {
    uint64_t empty = 0;
    if (slot.compare_exchange_strong(empty, state, std::memory_order_acq_rel)) {
      deferred_count_.fetch_add(1, std::memory_order_release);
      return;
    }
  }
  // Full: the registration stays until this process exits (then it is
  // reaped). Counted, and said by the watcher.
  deferred_lost_.fetch_add(1, std::memory_order_relaxed);
}

void Registry::FinishDeferredReleases() {
  if (deferred_count_.load(std::memory_order_acquire) == 0) return;
  bool push = false;
  {
    ZoneLock lock(*zone_, kWatcherLockWaitNs);
    if (!lock.ok()) return;  // next loop
    const uint32_t me = watcher_.proc_index();
    for (std::atomic<uint64_t>& slot : deferred_) {
      const uint64_t state = slot.exchange(0, std::memory_order_acq_rel);
      if (state == 0) continue;
      deferred_count_.fetch_sub(1, std::memory_order_relaxed);
      const uint32_t index = FdState::From(state).conn();
      if (index >= zone_->conns().capacity()) continue;
      const ConnSlotShm& conn = zone_->conns().slot(index);
      if (ConnValid(conn, state) &&
          conn.proc_index.load(std::memory_order_relaxed) == me &&
          !zone_->handoffs().PendingLocked(index,
                                           FdState::From(state).cookie())) {
        push |= DeregisterLocked(index);
      }
    }
  }
  if (push) zone_->changes().WakeWatchers();
}

void Registry::AfterForkChild() {
  pending_maybe_.store(true, std::memory_order_relaxed);
  for (std::atomic<uint64_t>& slot : deferred_) {
    slot.store(0, std::memory_order_relaxed);
  }
  deferred_count_.store(0, std::memory_order_relaxed);
}

}  // namespace trafficrate
