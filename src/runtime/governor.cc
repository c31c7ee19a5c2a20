#include "src/runtime/governor.h"

#include <sys/socket.h>
#include <unistd.h>

#include "src/base/clock.h"
#include "src/runtime/inherited.h"
#include "src/shm/robust_mutex.h"

namespace trafficrate {

Governor::Governor(Zone* zone, FdTable* table, const Logger* logger,
                   const GovernorOptions& options)
    : zone_(zone),
      table_(table),
      logger_(logger),
      options_(options),
      watcher_(this, zone, logger, options_),
      pid_(static_cast<int32_t>(getpid())),
      rules_(zone, logger, options.rules_path, options.after_bytes),
      local_(zone->conns().capacity()),
      context_{zone,      table,   logger,  &options_,
               &watcher_, &local_, &rules_, &cpu_},
      pacer_(context_),
      registry_(context_, pacer_),
      decisions_(context_),
      drains_(context_, pacer_, registry_, decisions_, epolls_),
      idle_(context_, registry_),
      ticks_(context_, pacer_, idle_, decisions_, drains_),
      events_(context_, registry_, drains_, epolls_),
      passing_(context_, registry_, events_),
      health_(context_, registry_, passing_, drains_) {
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
  delete copy_buffers_;
}

int64_t Governor::LastSendNs(int fd) const {
  const FdEntry* entry = table_->Get(fd);
  const uint64_t state =
      entry != nullptr ? entry->state.load(std::memory_order_acquire) : 0;
  if (state == 0 || !local_.ok() ||
      FdState::From(state).conn() >= zone_->conns().capacity()) {
    return 0;
  }
  return local_[FdState::From(state).conn()].last_send_ns.load(
      std::memory_order_relaxed);
}

void Governor::OnAccept(int fd, const sockaddr* peer, socklen_t peer_len) {
  if (!local_.ok()) return;
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
    events_.Release(FdTable::Untrack(*entry));
  }
  if (rules_.Stale()) {
    // `trafficrate reload`: the watcher reads the file again (starting it
    // if this process has none yet); the connection is classified under
    // the new rules at its first send after that.
    EnsureProc();
    registry_.MarkPending(fd, *entry, nullptr);
    return;
  }
  ConnKey key;
  uint8_t peer16[16];
  uint16_t peer_port = 0;
  if (!registry_.ClassifyFd(fd, peer, peer_len, &key, peer16, &peer_port)) {
    return;
  }
  registry_.Register(fd, *entry, key, peer16, peer_port);
}

Shape Governor::BeforeSend(int fd) {
  FdEntry* entry = table_->Get(fd);
  if (entry == nullptr) return Shape();
  const uint64_t state = entry->state.load(std::memory_order_acquire);
  if (state == 0) return Shape();
  if (FdState::From(state).conn() >= zone_->conns().capacity()) {
    if (FdState::From(state).pending())
      registry_.RetryRegister(fd, *entry, state);
    return Shape();
  }
  // A tick's precision is plenty for idleness (TRAFFICRATE_IDLE is 200 ms by
  // default; a stamp a tick early only makes an idle look come a tick early,
  // and it still finds what is queued).
  local_[FdState::From(state).conn()].last_send_ns.store(
      options_.clock->CoarseNowNs(), std::memory_order_relaxed);
  const ConnSlotShm& conn = zone_->conns().slot(FdState::From(state).conn());
  if (!ConnValid(conn, state)) {
    registry_.Reregister(fd, *entry, state);
  } else if (!conn.active.load(std::memory_order_relaxed) ||
             conn.proc_index.load(std::memory_order_relaxed) !=
                 watcher_.proc_index()) {
    registry_.JoinSlow(fd, *entry, state);
  } else {
    pacer_.ApplyIfChanged(fd, *entry, state, conn);
  }
  if (!options_.shape) return Shape();
  // The pacing applied to this socket, as SetPacing left it.
  const LocalConn& local = local_[FdState::From(state).conn()];
  Shape shape;
  shape.piece = local.piece.load(std::memory_order_relaxed);
  shape.first_left = local.first_left.load(std::memory_order_relaxed);
  shape.mss = local.mss.load(std::memory_order_relaxed);
  shape.level = conn.share_bytes_per_sec.load(std::memory_order_relaxed);
  if (shape.level == 0 || shape.level == kUnpaced) {
    // Not paced (budget mode, a key under its rate): nothing to cut, and
    // its first segments go as the kernel makes them.
    if (shape.first_left != 0) {
      local_[FdState::From(state).conn()].first_left.store(
          0, std::memory_order_relaxed);
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
  if (state == 0 || FdState::From(state).conn() >= zone_->conns().capacity())
    return;
  std::atomic<uint32_t>& left = local_[FdState::From(state).conn()].first_left;
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
  if (state == 0 || FdState::From(state).conn() >= zone_->conns().capacity())
    return;
  zone_->conns()
      .slot(FdState::From(state).conn())
      .bytes_sent.fetch_add(static_cast<uint64_t>(sent),
                            std::memory_order_relaxed);
}

void Governor::OnClose(int fd) {
  if (!events_.Concerns(fd) || SharedWithParent()) return;
  events_.Close(fd, /*may_keep_fd=*/true);
}

void Governor::OnEpollCreate(int epfd) { epolls_.Add(epfd); }

uint64_t Governor::Detach(int fd) {
  const FdEntry* entry = table_->Get(fd);
  if (entry == nullptr || entry->state.load(std::memory_order_relaxed) == 0 ||
      SharedWithParent()) {
    return 0;
  }
  return events_.Detach(fd);
}

void Governor::Reattach(int fd, uint64_t state) { events_.Reattach(fd, state); }

void Governor::OnCloseRange(unsigned int first, unsigned int last) {
  if (!events_.ConcernsRange(first, last) || SharedWithParent()) return;
  events_.CloseRange(first, last);
}

void Governor::OnDup(int oldfd, int newfd) {
  if (!events_.Concerns(oldfd) || SharedWithParent()) return;
  events_.Dup(oldfd, newfd);
}

int Governor::BeforePassFds(const msghdr* msg) {
  return passing_.BeforePass(msg);
}

void Governor::AfterPassFds(const msghdr* msg, bool sent) {
  passing_.AfterPass(msg, sent);
}

void Governor::OnReceivedFds(const msghdr* msg) { passing_.OnReceived(msg); }

void Governor::ExpireHandoffs(int64_t now_ns) {
  passing_.ExpireHandoffs(now_ns);
}

int Governor::ReleaseKeptDrains() { return drains_.ReleaseKept(); }

int Governor::AdoptInherited() {
  if (!local_.ok() || zone_->segment().corrupt()) return 0;
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
  // Registrations the parent had pending are this process's to make too;
  // its deferred releases and its drains are its own to finish.
  registry_.AfterForkChild();
  drains_.AfterForkChild();
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
  if (!local_.ok() || zone_->segment().corrupt() || SharedWithParent()) return;
  const int high_water = table_->high_water();
  for (int fd = 0; fd < high_water; ++fd) {
    const uint64_t state =
        table_->Get(fd)->state.load(std::memory_order_relaxed);
    if (state != 0 && !FdState::From(state).kept_drain()) {
      EnsureProc();
      return;
    }
  }
}

void Governor::StopWatcher() { watcher_.Stop(); }

void Governor::ApplyChangedShares() { pacer_.ApplyChanged(); }

void Governor::NoteWatcherLate(int64_t late_ns, int64_t now_ns) {
  idle_.NoteWatcherLate(late_ns, now_ns);
}

void Governor::ExpireIdle(int64_t now_ns) { idle_.ExpireIdle(now_ns); }

bool Governor::CheckZone(int64_t now_ns) { return health_.Check(now_ns); }

bool Governor::BudgetWanted() const {
  return zone_->settings().share_mode() == ShareMode::kBudget;
}

int64_t Governor::TickBudget(int64_t now_ns) { return ticks_.Tick(now_ns); }

void Governor::FinishDrains(int64_t now_ns) { drains_.Tick(now_ns); }

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
