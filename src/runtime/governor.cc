#include "src/runtime/governor.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "src/base/clock.h"
#include "src/base/private_array.h"
#include "src/budget/share.h"
#include "src/net/address.h"
#include "src/net/tcp_counts.h"
#include "src/runtime/classify.h"
#include "src/runtime/inherited.h"

namespace trafficrate {
namespace {

// CheckZone: a lock still held after this many once-a-second checks, by a
// thread that does not exist, marks the zone corrupt.
constexpr int kStalledChecksForCorrupt = 3;

// LookAtRest: a connection at rest is looked at this long after its rest
// began, then at twice the gap each time, up to the last. A write by a
// process that cannot reach the zone starts within about the first gap
// (the CGI child that writes a response its parent began); the gap then
// bounds how long it goes at the pace it had when it left, while its
// siblings take its share.
constexpr int64_t kRestFirstLookNs = 100'000'000;   // 100 ms
constexpr int64_t kRestLastLookNs = 6'400'000'000;  // 6.4 s

}  // namespace

bool Governor::ClassifyFd(int fd, const sockaddr* peer, socklen_t peer_len,
                          ConnKey* key, uint8_t peer16[16],
                          uint16_t* peer_port) const {
  const RuleSet::Read rules(rules_);
  return ClassifyConn(fd, options_.key, options_.rules, rules.table(), peer,
                      peer_len, key, peer16, peer_port);
}

Governor::Governor(Zone* zone, FdTable* table, const Logger* logger,
                   const GovernorOptions& options)
    : zone_(zone),
      table_(table),
      logger_(logger),
      options_(options),
      watcher_(this, zone, logger, options),
      pid_(static_cast<int32_t>(getpid())),
      rules_(zone, logger, options.rules_path, options.after_bytes) {
  local_ = MapPrivateArray<LocalConn>(zone_->conns().capacity());
  key_local_ = MapPrivateArray<LocalKey>(zone_->keys().capacity());
  if (options_.shape) copy_buffers_ = CopyBuffers::Create();
  if (!options_.file_rules.empty() &&
      !rules_.Install(options_.file_rules, /*at_start=*/true)) {
    // The zone lock stayed busy: the rules' connections pass through, as
    // any connection does while the lock is stalled, until a reload.
    logger_->Warning(
        "zone %s: its lock stayed busy at start-up; the rules "
        "file's connections pass through until `trafficrate "
        "reload`",
        zone_->name().c_str());
  }
}

Governor::~Governor() {
  StopWatcher();
  ReleaseKeptDrains();
  UnmapPrivateArray(local_, zone_->conns().capacity());
  UnmapPrivateArray(key_local_, zone_->keys().capacity());
  delete copy_buffers_;
}

int64_t Governor::LastSendNs(int fd) const {
  const FdEntry* entry = table_->Get(fd);
  const uint64_t state =
      entry != nullptr ? entry->state.load(std::memory_order_acquire) : 0;
  if (state == 0 || local_ == nullptr ||
      StateConn(state) >= zone_->conns().capacity()) {
    return 0;
  }
  return local_[StateConn(state)].last_send_ns.load(std::memory_order_relaxed);
}

bool Governor::SiblingsSendingLocked(const ConnSlotShm& conn) const {
  // Only the other sending connections of the key need a new share: a
  // client with a single connection (the common case under connection
  // churn) joins and leaves without waking any watcher.
  const uint32_t key = conn.key_index.load(std::memory_order_relaxed);
  if (key >= zone_->keys().capacity()) return false;
  const uint32_t others = conn.active.load(std::memory_order_relaxed) ? 1 : 0;
  return zone_->keys().slot(key).active.load(std::memory_order_relaxed) >
         others;
}

bool Governor::ConnValid(const ConnSlotShm& conn, uint64_t state) const {
  return ConnTable::CookieOf(conn.seq.load(std::memory_order_acquire)) ==
         StateCookie(state);
}

uint64_t Governor::ShareToken(const KeySlotShm& key) const {
  const uint64_t settings =
      zone_->header().settings_generation.load(std::memory_order_acquire);
  return settings << 32 | key.generation.load(std::memory_order_acquire);
}

void Governor::AddLocalRef(uint32_t conn_index, uint32_t cookie) {
  std::atomic<uint64_t>& refs = local_[conn_index].refs;
  uint64_t seen = refs.load(std::memory_order_relaxed);
  uint64_t next;
  do {
    next = (seen >> 32) == cookie ? seen + 1 : (uint64_t{cookie} << 32 | 1);
  } while (!refs.compare_exchange_weak(seen, next, std::memory_order_acq_rel));
}

bool Governor::DropLocalRef(uint32_t conn_index, uint32_t cookie) {
  std::atomic<uint64_t>& refs = local_[conn_index].refs;
  uint64_t seen = refs.load(std::memory_order_relaxed);
  do {
    // Another cookie: this fd held a registration that ended already.
    if ((seen >> 32) != cookie || (seen & 0xffffffffu) == 0) return false;
  } while (
      !refs.compare_exchange_weak(seen, seen - 1, std::memory_order_acq_rel));
  return (seen & 0xffffffffu) == 1;
}

void Governor::OnAccept(int fd, const sockaddr* peer, socklen_t peer_len) {
  if (local_ == nullptr) return;
  FdEntry* entry = table_->Get(fd);
  if (entry == nullptr) {
    if (fd >= 0 && Logger::Allow(last_fd_log_ns_, options_.clock->NowNs())) {
      logger_->Warning(
          "fd %d is above the fd table's %d entries; its "
          "connection is not governed",
          fd, table_->capacity());
    }
    return;
  }
  // Still tracked: the host closed the old socket behind our back.
  if (entry->state.load(std::memory_order_relaxed) != 0) {
    Release(FdTable::Untrack(*entry));
  }
  if (rules_.Stale()) {
    // `trafficrate reload`: the watcher reads the file again (starting it
    // if this process has none yet); the connection is classified under
    // the new rules at its first send after that.
    EnsureProc();
    MarkPending(fd, *entry, nullptr);
    return;
  }
  ConnKey key;
  uint8_t peer16[16];
  uint16_t peer_port = 0;
  if (!ClassifyFd(fd, peer, peer_len, &key, peer16, &peer_port)) return;
  Register(fd, *entry, key, peer16, peer_port);
}

void Governor::Register(int fd, FdEntry& entry, const ConnKey& key,
                        const uint8_t peer16[16], uint16_t peer_port,
                        uint64_t expected, bool inherited) {
  if (zone_->segment().corrupt()) return;
  const uint32_t proc = EnsureProc();
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

bool Governor::Adopt(int fd, FdEntry& entry, uint32_t conn, uint32_t cookie,
                     int64_t now, uint64_t expected, bool fresh) {
  AddLocalRef(conn, cookie);
  entry.applied.store(kNeverApplied, std::memory_order_relaxed);
  entry.visit_tick.store(0, std::memory_order_relaxed);
  local_[conn].last_send_ns.store(now, std::memory_order_relaxed);
  local_[conn].next_measure_ns.store(0, std::memory_order_relaxed);
  local_[conn].meter.Reset();
  local_[conn].next_idle_check_ns.store(0, std::memory_order_relaxed);
  local_[conn].idle_queued.store(0, std::memory_order_relaxed);
  local_[conn].idle_queued_ns.store(0, std::memory_order_relaxed);
  local_[conn].applied_ns.store(0, std::memory_order_relaxed);
  local_[conn].kernel_base.store(kNoKernelBase, std::memory_order_relaxed);
  StartRest(conn);
  local_[conn].piece.store(0, std::memory_order_relaxed);
  local_[conn].mss.store(0, std::memory_order_relaxed);
  // A connection paced from its first byte sends its first segments as
  // first pieces; one that sends TRAFFICRATE_AFTER bytes unpaced first has
  // used them by the time it is paced.
  local_[conn].first_left.store(
      fresh && rules_.AfterBytes(zone_->conns().slot(conn)) == 0 ? kFirstPieces
                                                                 : 0,
      std::memory_order_relaxed);
  if (!entry.state.compare_exchange_strong(expected, PackState(conn, cookie),
                                           std::memory_order_acq_rel)) {
    // Closed meanwhile (RegisterPending, from the watcher): the
    // registration ends with it.
    Release(PackState(conn, cookie));
    return false;
  }
  table_->NoteTracked(fd);
  return true;
}

void Governor::MarkPending(int fd, FdEntry& entry, const ConnKey* key) {
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
  entry.state.store(kRegisterPending, std::memory_order_release);
  table_->NoteTracked(fd);
  pending_maybe_.store(true, std::memory_order_release);
}

void Governor::RegisterPending() {
  if (!pending_maybe_.load(std::memory_order_acquire) ||
      zone_->lock_stalled() || zone_->segment().corrupt() ||
      watcher_.starting() || rules_.Stale()) {
    return;
  }
  pending_maybe_.store(false, std::memory_order_release);
  const int high_water = table_->high_water();
  for (int fd = 0; fd < high_water; ++fd) {
    FdEntry& entry = *table_->Get(fd);
    if (entry.state.load(std::memory_order_acquire) != kRegisterPending) {
      continue;
    }
    // Pinned, so that the host's close waits for us (it clears the state
    // first: Adopt's exchange then fails, and the registration ends).
    if (!FdTable::TryPin(entry, kRegisterPending, /*wait=*/false)) {
      pending_maybe_.store(true, std::memory_order_release);
      continue;
    }
    ConnKey key;
    uint8_t peer16[16];
    uint16_t peer_port = 0;
    const bool is_conn = ClassifyFd(fd, nullptr, 0, &key, peer16, &peer_port);
    uint64_t state = kRegisterPending;
    if (!is_conn) {
      entry.state.compare_exchange_strong(state, 0, std::memory_order_acq_rel);
    } else {
      Register(fd, entry, key, peer16, peer_port, kRegisterPending);
      state = entry.state.load(std::memory_order_acquire);
    }
    FdTable::Unpin(entry);
    if (state == kRegisterPending) {
      pending_maybe_.store(true, std::memory_order_release);  // next loop
    } else if (state != 0 && StateConn(state) < zone_->conns().capacity()) {
      // It was sending all along: it joins now, not at its next send,
      // which a full socket may put off for seconds.
      JoinSlow(fd, entry, state);
    }
  }
}

void Governor::RetryRegister(int fd, FdEntry& entry, uint64_t pending) {
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
             /*inherited=*/pending != kRegisterPending);
  }
  if (pending != kRegisterPending) SettleGroup(fd, entry, pending);
  const uint64_t state = entry.state.load(std::memory_order_acquire);
  if (state != 0 && StateConn(state) < zone_->conns().capacity()) {
    JoinSlow(fd, entry, state);
  }
}

void Governor::SettleGroup(int fd, FdEntry& entry, uint64_t pending) {
  const uint64_t state = entry.state.load(std::memory_order_acquire);
  if (state == kRegisterPending) {
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

void Governor::CopyRegistration(const FdEntry& from, uint64_t state,
                                FdEntry& to, int newfd) {
  AddLocalRef(StateConn(state), StateCookie(state));
  to.applied.store(from.applied.load(std::memory_order_relaxed),
                   std::memory_order_relaxed);
  to.state.store(state, std::memory_order_release);
  table_->NoteTracked(newfd);
}

Shape Governor::BeforeSend(int fd) {
  FdEntry* entry = table_->Get(fd);
  if (entry == nullptr) return Shape();
  const uint64_t state = entry->state.load(std::memory_order_acquire);
  if (state == 0) return Shape();
  if (StateConn(state) >= zone_->conns().capacity()) {
    if (IsRegisterPending(state)) RetryRegister(fd, *entry, state);
    return Shape();
  }
  // A tick's precision is plenty for idleness (TRAFFICRATE_IDLE is 200 ms by
  // default; a stamp a tick early only makes an idle look come a tick early,
  // and it still finds what is queued).
  local_[StateConn(state)].last_send_ns.store(options_.clock->CoarseNowNs(),
                                              std::memory_order_relaxed);
  const ConnSlotShm& conn = zone_->conns().slot(StateConn(state));
  if (!ConnValid(conn, state)) {
    Reregister(fd, *entry, state);
  } else if (!conn.active.load(std::memory_order_relaxed) ||
             conn.proc_index.load(std::memory_order_relaxed) !=
                 watcher_.proc_index()) {
    JoinSlow(fd, *entry, state);
  } else {
    ApplyIfChanged(fd, *entry, state, conn);
  }
  if (!options_.shape) return Shape();
  // The pacing applied to this socket, as SetPacing left it.
  const LocalConn& local = local_[StateConn(state)];
  Shape shape;
  shape.piece = local.piece.load(std::memory_order_relaxed);
  shape.first_left = local.first_left.load(std::memory_order_relaxed);
  shape.mss = local.mss.load(std::memory_order_relaxed);
  shape.level = conn.share_bytes_per_sec.load(std::memory_order_relaxed);
  if (shape.level == 0 || shape.level == kUnpaced) {
    // Not paced (budget mode, a key under its rate): nothing to cut, and
    // its first segments go as the kernel makes them.
    if (shape.first_left != 0) {
      local_[StateConn(state)].first_left.store(0, std::memory_order_relaxed);
    }
    return Shape();
  }
  if (!conn.active.load(std::memory_order_relaxed)) {
    // Not paced yet (TRAFFICRATE_AFTER): its first bytes leave unpaced.
    shape.piece = 0;
    shape.first_left = 0;
  }
  return shape;
}

void Governor::UsedFirstPieces(int fd, uint32_t n) {
  FdEntry* entry = table_->Get(fd);
  if (entry == nullptr || n == 0) return;
  const uint64_t state = entry->state.load(std::memory_order_relaxed);
  if (state == 0 || StateConn(state) >= zone_->conns().capacity()) return;
  std::atomic<uint32_t>& left = local_[StateConn(state)].first_left;
  const uint32_t before = left.load(std::memory_order_relaxed);
  left.store(before > n ? before - n : 0, std::memory_order_relaxed);
}

void Governor::CountShaped(const ShapeCounts& counts) {
  const uint32_t proc = watcher_.proc_index();
  if (proc >= zone_->procs().capacity()) return;
  ProcSlotShm& slot = zone_->procs().slot(proc);
  slot.shaped_calls.fetch_add(1, std::memory_order_relaxed);
  slot.shaper_syscalls.fetch_add(counts.syscalls, std::memory_order_relaxed);
  slot.shaped_pieces.fetch_add(counts.pieces, std::memory_order_relaxed);
}

void Governor::AfterSend(int fd, ssize_t sent) {
  if (sent <= 0) return;
  FdEntry* entry = table_->Get(fd);
  if (entry == nullptr) return;
  const uint64_t state = entry->state.load(std::memory_order_relaxed);
  if (state == 0 || StateConn(state) >= zone_->conns().capacity()) return;
  zone_->conns()
      .slot(StateConn(state))
      .bytes_sent.fetch_add(static_cast<uint64_t>(sent),
                            std::memory_order_relaxed);
}

bool Governor::PastAfter(int fd, const ConnSlotShm& conn) const {
  const uint64_t after = rules_.AfterBytes(conn);
  if (after == 0) return true;
  const uint64_t queued = conn.bytes_sent.load(std::memory_order_relaxed);
  if (queued < after) return false;
  // Queued is not sent: a share set now would pace what still waits in the
  // socket, first bytes included. Count only what has left it.
  int unsent = 0;
  if (ioctl(fd, SIOCOUTQNSD, &unsent) != 0 || unsent < 0) return true;
  return queued - static_cast<uint64_t>(unsent) >= after;
}

void Governor::JoinSlow(int fd, FdEntry& entry, uint64_t state) {
  const uint32_t index = StateConn(state);
  const ConnSlotShm& conn = zone_->conns().slot(index);
  uint32_t me = watcher_.proc_index();
  const bool ours = conn.proc_index.load(std::memory_order_relaxed) == me;
  if (!ours && conn.active.load(std::memory_order_relaxed)) {
    // Inherited across fork from the process that registered it, which
    // counts it as sending: it is counted once already.
    ApplyIfChanged(fd, entry, state, conn);
    return;
  }
  // TRAFFICRATE_AFTER: the connection takes no share and is not paced until
  // its first after_bytes have left the socket; the watcher's tick joins it
  // if no send comes by then.
  const bool join = PastAfter(fd, conn);
  if (!ours) {
    me = EnsureProc();
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
    ApplyIfChanged(fd, entry, state, conn);
  }
}

void Governor::Reregister(int fd, FdEntry& entry, uint64_t state) {
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
      DropLocalRef(StateConn(state), StateCookie(state));
      AddLocalRef(StateConn(fresh), StateCookie(fresh));
    }
  }
  JoinSlow(fd, entry, fresh);
}

bool Governor::ApplyIfChanged(int fd, FdEntry& entry, uint64_t state,
                              const ConnSlotShm& conn) {
  const uint32_t k = conn.key_index.load(std::memory_order_relaxed);
  if (k >= zone_->keys().capacity()) return false;
  const KeySlotShm& key = zone_->keys().slot(k);
  if (ShareToken(key) == entry.applied.load(std::memory_order_relaxed)) {
    return false;
  }
  // Pinned, so that a close cannot slip between our check and setsockopt,
  // and so that two threads never apply out of order.
  if (!FdTable::TryPin(entry, state, /*wait=*/true)) return false;
  const uint64_t token = ShareToken(key);
  const uint64_t before =
      conn.share_bytes_per_sec.load(std::memory_order_relaxed);
  const uint64_t share = ShareFor(key);
  // A raise drains its queue sooner: the idle pass looks at it again now.
  if (SetPacing(fd, conn, share) && share > before) {
    entry.visit_tick.store(0, std::memory_order_relaxed);
  }
  entry.applied.store(token, std::memory_order_relaxed);
  FdTable::Unpin(entry);
  return true;
}

bool Governor::SetPacing(int fd, const ConnSlotShm& conn, uint64_t rate) {
  if (setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, sizeof(rate)) !=
      0) {
    return false;
  }
  if (options_.shape) {
    const uint32_t index = zone_->conns().IndexOf(conn);
    LocalConn& local = local_[index];
    if (local.mss.load(std::memory_order_relaxed) == 0) {
      // Once per connection (its first pacing, before its first byte): the
      // kernel's MSS on its path, and its round trip as the handshake
      // measured it, which decide whether first pieces are worth a round
      // trip (FirstPiecesPay).
      tcp_info info{};
      socklen_t len = sizeof(info);
      if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
          info.tcpi_snd_mss > 0) {
        local.mss.store(info.tcpi_snd_mss, std::memory_order_relaxed);
        if (!FirstPiecesPay(rate, info.tcpi_snd_mss, info.tcpi_rtt)) {
          local.first_left.store(0, std::memory_order_relaxed);
        }
      }
    }
    const uint32_t k = conn.key_index.load(std::memory_order_relaxed);
    const uint64_t key_rate =
        k < zone_->keys().capacity()
            ? zone_->settings().KeyRate(zone_->keys().slot(k))
            : 0;
    local.piece.store(PieceBytes(rate, VaryIndex(index), key_rate),
                      std::memory_order_relaxed);
  }
  const_cast<ConnSlotShm&>(conn).share_bytes_per_sec.store(
      rate, std::memory_order_relaxed);
  return true;
}

void Governor::Release(uint64_t state) {
  if (IsKeptDrain(state)) {
    // The host closed or replaced the fd number of a kept drain (it closes
    // every fd, say): the drain goes on, modelled, without it.
    DropKept(KeptDrainSlot(state));
    return;
  }
  if (state == 0 || local_ == nullptr) return;
  const uint32_t index = StateConn(state);
  if (index >= zone_->conns().capacity() ||
      !DropLocalRef(index, StateCookie(state))) {
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
        zone_->handoffs().PendingLocked(index, StateCookie(state))) {
      // Passed to another process and not received yet: its receiver
      // takes the registration over (or ExpireHandoffs ends it).
      return;
    }
    push = DeregisterLocked(index);
  }
  if (push) zone_->changes().WakeWatchers();
}

bool Governor::DeregisterLocked(uint32_t index) {
  const uint32_t key =
      zone_->conns().slot(index).key_index.load(std::memory_order_relaxed);
  return zone_->conns().DeregisterLocked(index) &&
         key < zone_->keys().capacity() &&
         zone_->keys().slot(key).active.load(std::memory_order_relaxed) > 0;
}

void Governor::DeferRelease(uint64_t state) {
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

void Governor::FinishDeferredReleases() {
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
      const uint32_t index = StateConn(state);
      if (index >= zone_->conns().capacity()) continue;
      const ConnSlotShm& conn = zone_->conns().slot(index);
      if (ConnValid(conn, state) &&
          conn.proc_index.load(std::memory_order_relaxed) == me &&
          !zone_->handoffs().PendingLocked(index, StateCookie(state))) {
        push |= DeregisterLocked(index);
      }
    }
  }
  if (push) zone_->changes().WakeWatchers();
}

void Governor::OnClose(int fd) {
  if (!Concerns(fd) || SharedWithParent()) return;
  CloseFd(fd, /*may_keep_fd=*/true);
}

bool Governor::Concerns(int fd) const {
  const FdEntry* entry = table_->Get(fd);
  if (entry != nullptr && entry->state.load(std::memory_order_relaxed) != 0) {
    return true;
  }
  for (const std::atomic<int32_t>& epoll : epolls_) {
    if (epoll.load(std::memory_order_relaxed) == fd + 1) return true;
  }
  return false;
}

void Governor::CloseFd(int fd, bool may_keep_fd) {
  for (std::atomic<int32_t>& epoll : epolls_) {
    int32_t known = fd + 1;
    if (epoll.load(std::memory_order_relaxed) == known) {
      epoll.compare_exchange_strong(known, 0, std::memory_order_relaxed);
    }
  }
  const uint64_t state = DetachHere(fd);
  // Budget mode: a connection closed with data unsent keeps its place in
  // its key (and keeps counting) until the kernel has sent it.
  if (state != 0 && !IsKeptDrain(state) && BudgetWanted() &&
      KeepDraining(fd, state, may_keep_fd)) {
    return;
  }
  Release(state);
}

void Governor::OnEpollCreate(int epfd) {
  if (epfd < 0) return;
  for (std::atomic<int32_t>& epoll : epolls_) {
    int32_t free = 0;
    if (epoll.compare_exchange_strong(free, epfd + 1,
                                      std::memory_order_relaxed)) {
      return;
    }
  }
  epolls_unknown_.store(true, std::memory_order_relaxed);
}

uint64_t Governor::Detach(int fd) {
  const FdEntry* entry = table_->Get(fd);
  if (entry == nullptr || entry->state.load(std::memory_order_relaxed) == 0 ||
      SharedWithParent()) {
    return 0;
  }
  return DetachHere(fd);
}

uint64_t Governor::DetachHere(int fd) {
  FdEntry* entry = table_->Get(fd);
  if (entry == nullptr || entry->state.load(std::memory_order_relaxed) == 0) {
    return 0;
  }
  return FdTable::Untrack(*entry);
}

void Governor::Reattach(int fd, uint64_t state) {
  FdEntry* entry = table_->Get(fd);
  uint64_t empty = 0;
  if (entry != nullptr && state != 0 &&
      !entry->state.compare_exchange_strong(empty, state,
                                            std::memory_order_acq_rel)) {
    Release(state);  // something else took the slot meanwhile
  }
}

void Governor::OnCloseRange(unsigned int first, unsigned int last) {
  const unsigned int high_water =
      static_cast<unsigned int>(table_->high_water());
  bool concerns = false;
  for (unsigned int fd = first; fd < high_water && fd <= last && !concerns;
       ++fd) {
    concerns = table_->Get(static_cast<int>(fd))
                   ->state.load(std::memory_order_relaxed) != 0;
  }
  for (const std::atomic<int32_t>& epoll : epolls_) {
    const int32_t known = epoll.load(std::memory_order_relaxed);
    concerns |= known > 0 && static_cast<unsigned int>(known - 1) >= first &&
                static_cast<unsigned int>(known - 1) <= last;
  }
  if (!concerns || SharedWithParent()) return;
  for (unsigned int fd = first; fd < high_water && fd <= last; ++fd) {
    CloseFd(static_cast<int>(fd), /*may_keep_fd=*/false);
  }
  for (std::atomic<int32_t>& epoll : epolls_) {
    const int32_t known = epoll.load(std::memory_order_relaxed);
    if (known > 0 && static_cast<unsigned int>(known - 1) >= first &&
        static_cast<unsigned int>(known - 1) <= last) {
      epoll.store(0, std::memory_order_relaxed);
    }
  }
}

void Governor::OnDup(int oldfd, int newfd) {
  FdEntry* from = table_->Get(oldfd);
  FdEntry* to = table_->Get(newfd);
  if (from == nullptr || to == nullptr || oldfd == newfd) return;
  if (!Concerns(oldfd) || SharedWithParent()) return;
  for (const std::atomic<int32_t>& epoll : epolls_) {
    if (epoll.load(std::memory_order_relaxed) == oldfd + 1) {
      OnEpollCreate(newfd);  // the same epoll set under another number
      break;
    }
  }
  const uint64_t state = from->state.load(std::memory_order_acquire);
  // A pending registration stays with the fd it was accepted on: two
  // retries would count the connection twice. An inherited socket's group
  // takes the new fd in.
  if (state == 0 || IsKeptDrain(state) || state == kRegisterPending) return;
  if (to->state.load(std::memory_order_relaxed) != 0) {
    Release(FdTable::Untrack(*to));
  }
  if (IsRegisterPending(state)) {
    to->state.store(state, std::memory_order_release);
    table_->NoteTracked(newfd);
    return;
  }
  CopyRegistration(*from, state, *to, newfd);
}

namespace {

// Calls f(fd) for every fd in msg's SCM_RIGHTS control messages, reading
// nothing outside msg_control (a sender's buffer may be malformed: the
// kernel refuses it, but this runs before the call).
template <typename F>
void ForEachPassedFd(const msghdr* msg, F f) {
  if (msg == nullptr || msg->msg_control == nullptr ||
      msg->msg_controllen < sizeof(cmsghdr)) {
    return;
  }
  msghdr copy = *msg;  // the CMSG macros take a non-const msghdr
  const auto* end =
      static_cast<const unsigned char*>(msg->msg_control) + msg->msg_controllen;
  int count = 0;  // bounded: the kernel takes at most 253 fds per message
  for (cmsghdr* c = CMSG_FIRSTHDR(&copy); c != nullptr && count < 1024;
       c = CMSG_NXTHDR(&copy, c)) {
    if (c->cmsg_len < CMSG_LEN(0)) break;
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const unsigned char* data = CMSG_DATA(c);
    const size_t room = data <= end ? static_cast<size_t>(end - data) : 0;
    const size_t bytes = std::min<size_t>(c->cmsg_len - CMSG_LEN(0), room);
    for (size_t i = 0; i + sizeof(int) <= bytes && count < 1024;
         i += sizeof(int), ++count) {
      int fd;
      std::memcpy(&fd, data + i, sizeof(fd));
      f(fd);
    }
  }
}

}  // namespace

int Governor::BeforePassFds(const msghdr* msg) {
  if (local_ == nullptr || zone_->segment().corrupt()) return 0;
  int published = 0;
  bool full = false;
  ForEachPassedFd(msg, [&](int fd) {
    FdEntry* entry = table_->Get(fd);
    if (entry == nullptr) return;
    const uint64_t state = entry->state.load(std::memory_order_acquire);
    if (state == 0 || StateConn(state) >= zone_->conns().capacity()) return;
    const uint64_t inode = SocketInode(fd);
    if (inode == 0) return;
    const uint32_t index = StateConn(state);
    ZoneLock lock(*zone_);
    if (!lock.ok() || !ConnValid(zone_->conns().slot(index), state)) return;
    if (zone_->handoffs().PublishLocked(inode, index, StateCookie(state),
                                        watcher_.proc_index(),
                                        options_.clock->NowNs())) {
      ++published;
    } else {
      full = true;
    }
  });
  if (full && Logger::Allow(last_handoff_log_ns_, options_.clock->NowNs())) {
    logger_->Warning(
        "zone %s: too many sockets passed between processes and not yet "
        "received (%u); the ones passed now are not governed by their "
        "receiver",
        zone_->name().c_str(), zone_->handoffs().capacity());
  }
  return published;
}

void Governor::AfterPassFds(const msghdr* msg, bool sent) {
  if (sent || local_ == nullptr) return;
  const uint32_t me = watcher_.proc_index();
  ForEachPassedFd(msg, [&](int fd) {
    const uint64_t inode = SocketInode(fd);
    if (inode == 0 || !zone_->handoffs().MayHave(inode)) return;
    ZoneLock lock(*zone_);
    if (lock.ok()) zone_->handoffs().WithdrawLocked(inode, me);
  });
}

void Governor::OnReceivedFds(const msghdr* msg) {
  if (local_ == nullptr) return;
  ForEachPassedFd(msg, [this](int fd) { ReceiveFd(fd); });
}

void Governor::ReceiveFd(int fd) {
  FdEntry* entry = table_->Get(fd);
  if (entry == nullptr) return;
  // Still tracked: the host closed the old socket behind our back.
  if (entry->state.load(std::memory_order_relaxed) != 0) {
    Release(FdTable::Untrack(*entry));
  }
  if (zone_->segment().corrupt()) return;
  const uint64_t inode = SocketInode(fd);
  if (inode == 0 || !zone_->handoffs().MayHave(inode)) return;
  const uint32_t me = EnsureProc();
  if (me == kNoSlot) return;
  uint32_t conn = kNoSlot;
  uint32_t cookie = 0;
  {
    ZoneLock lock(*zone_);
    if (!lock.ok()) {
      // Registered afresh by the watcher; the sender's handoff expires.
      MarkPending(fd, *entry, nullptr);
      return;
    }
    conn = zone_->handoffs().TakeLocked(inode, &cookie);
    // From now on this process paces and expires it, and its close (not
    // the sender's) ends the registration.
    if (conn != kNoSlot) zone_->conns().TransferLocked(conn, me, fd);
  }
  if (conn != kNoSlot)
    Adopt(fd, *entry, conn, cookie, options_.clock->NowNs(), 0);
}

void Governor::ExpireHandoffs(int64_t now_ns) {
  const uint32_t me = watcher_.proc_index();
  const int64_t before = now_ns - kHandoffExpiryNs;
  if (me == kNoSlot || local_ == nullptr ||
      !zone_->handoffs().HasOld(me, before)) {
    return;
  }
  bool push = false;
  {
    ZoneLock lock(*zone_, kWatcherLockWaitNs);
    if (!lock.ok()) return;  // next loop
    // A batch per watcher loop; what is left waits for the next one.
    uint64_t expired[kMinHandoffSlots];
    const uint32_t n =
        zone_->handoffs().ExpireLocked(me, before, expired, kMinHandoffSlots);
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t index = static_cast<uint32_t>(expired[i] >> 32);
      const uint32_t cookie = static_cast<uint32_t>(expired[i]);
      if (index >= zone_->conns().capacity()) continue;
      const ConnSlotShm& conn = zone_->conns().slot(index);
      const uint64_t refs = local_[index].refs.load(std::memory_order_relaxed);
      const bool held = (refs >> 32) == cookie && (refs & 0xffffffffu) > 0;
      if (ConnTable::CookieOf(conn.seq.load(std::memory_order_relaxed)) ==
              cookie &&
          conn.proc_index.load(std::memory_order_relaxed) == me && !held) {
        push |= DeregisterLocked(index);
      }
    }
  }
  if (push) zone_->changes().WakeWatchers();
}

int Governor::AdoptInherited() {
  if (local_ == nullptr || zone_->segment().corrupt()) return 0;
  return AdoptInheritedSockets(
      options_.rules, table_,
      [](void* governor, int first_fd, int fd) {
        static_cast<Governor*>(governor)->OnDup(first_fd, fd);
      },
      this);
}

void Governor::AfterForkChild() {
  watcher_.AfterForkChild();
  if (options_.agent != nullptr) options_.agent->AfterForkChild();
  pid_ = static_cast<int32_t>(getpid());
  table_->ClearPinsAfterFork();
  if (copy_buffers_ != nullptr) copy_buffers_->AfterForkChild();
  // No thread of the parent survives to end its read of the rule table.
  rules_.AfterForkChild();
  // Registrations the parent had pending are this process's to make too.
  pending_maybe_.store(true, std::memory_order_relaxed);
  // The parent's drains are the parent's to finish; the fds that keep them
  // open must not keep the sockets open for as long as the child lives.
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
  // The parent's deferred releases are the parent's (its watcher drains
  // them); a corrupt zone is passed through from the start.
  for (std::atomic<uint64_t>& slot : deferred_) {
    slot.store(0, std::memory_order_relaxed);
  }
  deferred_count_.store(0, std::memory_order_relaxed);
  zone_->segment().CheckHeader();
  process_.Arm();
}

bool Governor::RenewProcess() {
  if (!process_.BeginRenew()) return process_.Current();
  // Made with a raw clone, the kernel holds no robust list for this thread.
  ReregisterRobustList();
  AfterForkChild();
  return true;
}

bool Governor::SharedWithParent() const {
  return static_cast<int32_t>(getpid()) != pid_;
}

uint32_t Governor::EnsureProc() { return watcher_.EnsureStarted(); }

void Governor::BeforeThreadLimit() {
  if (local_ == nullptr || zone_->segment().corrupt() || SharedWithParent())
    return;
  const int high_water = table_->high_water();
  for (int fd = 0; fd < high_water; ++fd) {
    const uint64_t state =
        table_->Get(fd)->state.load(std::memory_order_relaxed);
    if (state != 0 && !IsKeptDrain(state)) {
      EnsureProc();
      return;
    }
  }
}

void Governor::StopWatcher() { watcher_.Stop(); }

void Governor::ApplyChangedShares() {
  const uint32_t me = watcher_.proc_index();
  const int high_water = table_->high_water();
  const bool budget = BudgetWanted();
  for (int fd = 0; fd < high_water; ++fd) {
    FdEntry& entry = *table_->Get(fd);
    const uint64_t state = entry.state.load(std::memory_order_acquire);
    if (state == 0 || StateConn(state) >= zone_->conns().capacity()) continue;
    const ConnSlotShm& conn = zone_->conns().slot(StateConn(state));
    if (!ConnValid(conn, state) ||
        !conn.active.load(std::memory_order_relaxed) ||
        conn.proc_index.load(std::memory_order_relaxed) != me) {
      continue;
    }
    // Budget mode: a join or leave moves a decided level not at all (it is
    // per connection) and an equal share among many by a sliver, while each
    // decision that moves the level by 4% makes every connection's token
    // stale; the tick applies steps within a sixteenth once per packet gap
    // (ApplyDue). Applied here, every join re-paced all of this process's
    // connections: at 5 000 connections per key, setsockopt was two thirds
    // of what the watchers spent.
    const uint32_t k = conn.key_index.load(std::memory_order_relaxed);
    if (budget && k < zone_->keys().capacity() &&
        PaceNearLevel(conn.share_bytes_per_sec.load(std::memory_order_relaxed),
                      ShareFor(zone_->keys().slot(k)))) {
      continue;
    }
    ApplyIfChanged(fd, entry, state, conn);
  }
}

void Governor::NoteWatcherLate(int64_t late_ns, int64_t now_ns) {
  if (late_ns < options_.idle_ns / 4) return;
  // As long again as the stall, at most an idle time: a watcher late by
  // 50 ms every few ticks (an overloaded machine) delays expiry by that
  // much, and does not keep idle connections in their keys for good.
  const int64_t until = now_ns + std::min(late_ns, options_.idle_ns);
  if (until > not_idle_before_ns_.load(std::memory_order_relaxed)) {
    not_idle_before_ns_.store(until, std::memory_order_relaxed);
  }
}

void Governor::ExpireIdle(int64_t now_ns) {
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
    if (state == 0 || StateConn(state) >= zone_->conns().capacity()) continue;
    const uint32_t visit = entry.visit_tick.load(std::memory_order_relaxed);
    if (!budget && visit != 0 && static_cast<int32_t>(tick - visit) < 0) {
      continue;
    }
    const ConnSlotShm& conn = zone_->conns().slot(StateConn(state));
    const uint64_t after = any_after ? rules_.AfterBytes(conn) : 0;
    if (after > 0 && ConnValid(conn, state) &&
        !conn.active.load(std::memory_order_relaxed) &&
        conn.proc_index.load(std::memory_order_relaxed) == me &&
        conn.bytes_sent.load(std::memory_order_relaxed) >= after) {
      // Queued past TRAFFICRATE_AFTER with no send since: join once sent.
      JoinSlow(fd, entry, state);
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

bool Governor::ExpireIfIdle(int fd, FdEntry& entry, uint64_t state,
                            const ConnSlotShm& conn, int64_t now_ns, bool* push,
                            int64_t* quiet_until_ns) {
  LocalConn& local = local_[StateConn(state)];
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
    if (entry.state.compare_exchange_strong(expected, 0)) Release(state);
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
    *push |= zone_->conns().LeaveLocked(StateConn(state)) &&
             SiblingsSendingLocked(conn);
    StartRest(StateConn(state));
  }
  return true;
}

void Governor::StartRest(uint32_t conn) {
  local_[conn].rest_written.store(kNoKernelBase, std::memory_order_relaxed);
  local_[conn].rest_look_ns.store(0, std::memory_order_relaxed);
  local_[conn].rest_gap_ns.store(0, std::memory_order_relaxed);
}

int64_t Governor::LookAtRest(int fd, FdEntry& entry, uint64_t state,
                             const ConnSlotShm& conn, int64_t now_ns) {
  if (!ConnValid(conn, state) || conn.active.load(std::memory_order_relaxed) ||
      conn.proc_index.load(std::memory_order_relaxed) !=
          watcher_.proc_index()) {
    return 0;
  }
  LocalConn& local = local_[StateConn(state)];
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
    StartRest(StateConn(state));
    JoinSlow(fd, entry, state);
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

bool Governor::CheckZone(int64_t now_ns) {
  if (zone_->segment().corrupt()) return PassThroughCorrupt();
  rules_.ReloadIfAsked(watcher_.proc_index());
  rules_.FreeRetired(/*force=*/false);
  if (zone_->lock_stalled() && !zone_->RecheckLock()) {
    if (now_ns < next_zone_check_ns_) return true;
  } else {
    stalled_checks_ = 0;
    FinishDeferredReleases();
    RegisterPending();
    ExpireHandoffs(now_ns);
    if (now_ns < next_zone_check_ns_) return true;
  }
  next_zone_check_ns_ = now_ns + kNsPerSec;
  if (!zone_->segment().CheckHeader()) return PassThroughCorrupt();
  const int32_t holder = zone_->LockHolder();
  if (zone_->lock_stalled() && ++stalled_checks_ >= kStalledChecksForCorrupt) {
    // Held for seconds by a thread that does not exist: nothing will ever
    // free it (a write into the zone forged the lock word).
    char path[32];
    std::snprintf(path, sizeof(path), "/proc/%d", holder);
    if (holder == 0 || access(path, F_OK) != 0) {
      zone_->segment().MarkCorrupt(
          "its lock is held by a thread that does not exist");
      return PassThroughCorrupt();
    }
  }
  const uint64_t timeouts = zone_->lock_timeouts();
  if (timeouts != lock_timeouts_said_ &&
      Logger::Allow(last_lock_log_ns_, now_ns)) {
    logger_->Warning(
        "zone %s: the zone lock %s (held by thread %d); %llu call(s) of "
        "process %d went on without it, their connections unpaced until "
        "the watcher retries",
        zone_->name().c_str(),
        zone_->lock_stalled() ? "is held for too long" : "was held too long",
        holder, static_cast<unsigned long long>(timeouts - lock_timeouts_said_),
        pid_);
    lock_timeouts_said_ = timeouts;
  }
  const uint64_t lost = deferred_lost_.load(std::memory_order_relaxed);
  if (lost != deferred_lost_said_) {
    logger_->Warning(
        "zone %s: %llu closed connection(s) of process %d stay counted "
        "until it exits (too many closes while the zone lock was held)",
        zone_->name().c_str(),
        static_cast<unsigned long long>(lost - deferred_lost_said_), pid_);
    deferred_lost_said_ = lost;
  }
  return true;
}

bool Governor::PassThroughCorrupt() {
  PassThroughAll();
  const char* why = zone_->segment().corrupt_why();
  logger_->Error(
      "zone %s is corrupt (%s); process %d passes every connection through "
      "unpaced from now on; the next server started replaces the zone",
      zone_->name().c_str(), why != nullptr ? why : "unknown", pid_);
  return false;
}

void Governor::PassThroughAll() {
  const int high_water = table_->high_water();
  for (int fd = 0; fd < high_water; ++fd) {
    FdEntry& entry = *table_->Get(fd);
    const uint64_t state = entry.state.load(std::memory_order_acquire);
    if (state == 0 || IsKeptDrain(state)) continue;
    // Pinned, so that the host cannot close the fd meanwhile (a close
    // clears the state first, then waits for the pin).
    if (!FdTable::TryPin(entry, state, /*wait=*/true)) continue;
    // A pending one too: it was paced at its rule's rate (MarkPending). An
    // inherited socket's group was not: it waits for its first send.
    if (state == kRegisterPending || !IsRegisterPending(state)) {
      setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &kUnpaced,
                 sizeof(kUnpaced));
    }
    uint64_t expected = state;
    entry.state.compare_exchange_strong(expected, 0, std::memory_order_acq_rel);
    FdTable::Unpin(entry);
  }
  for (int slot = 0; slot < kDrainSlots; ++slot) {
    const int kept = drain_fd_[slot].load(std::memory_order_relaxed) - 1;
    if (kept < 0) continue;
    setsockopt(kept, SOL_SOCKET, SO_MAX_PACING_RATE, &kUnpaced,
               sizeof(kUnpaced));
    CloseKept(static_cast<uint32_t>(slot));
  }
}

void Governor::ReapDead() {
  if (options_.agent != nullptr && watcher_.proc_index() != kNoSlot) {
    options_.agent->Poll(watcher_.proc_index(), options_.clock->NowNs());
  }
  uint32_t procs = 0;
  const uint32_t conns = zone_->ReapDead(&procs);
  if (conns > 0) {
    logger_->Notice(
        "%u dead process(es) held %u connection(s) of zone %s; "
        "their counts are released",
        procs, conns, zone_->name().c_str());
  }
}

}  // namespace trafficrate
