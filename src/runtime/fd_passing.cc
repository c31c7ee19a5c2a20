#include "src/runtime/fd_passing.h"

#include <algorithm>
#include <cstring>

#include "src/runtime/classify.h"

namespace trafficrate {
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

int FdPassing::BeforePass(const msghdr* msg) {
  if (!local_.ok() || zone_->segment().corrupt()) return 0;
  int published = 0;
  bool full = false;
  ForEachPassedFd(msg, [&](int fd) {
    FdEntry* entry = table_->Get(fd);
    if (entry == nullptr) return;
    const uint64_t state = entry->state.load(std::memory_order_acquire);
    if (!IsConnState(state)) return;
    const uint64_t inode = SocketInode(fd);
    if (inode == 0) return;
    const uint32_t index = FdState::From(state).conn();
    ZoneLock lock(*zone_);
    if (!lock.ok() || !ConnValid(zone_->conns().slot(index), state)) return;
    if (zone_->handoffs().PublishLocked(
            inode, index, FdState::From(state).cookie(), watcher_.proc_index(),
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

void FdPassing::AfterPass(const msghdr* msg, bool sent) {
  if (sent || !local_.ok()) return;
  const uint32_t me = watcher_.proc_index();
  ForEachPassedFd(msg, [&](int fd) {
    const uint64_t inode = SocketInode(fd);
    if (inode == 0 || !zone_->handoffs().MayHave(inode)) return;
    ZoneLock lock(*zone_);
    if (lock.ok()) zone_->handoffs().WithdrawLocked(inode, me);
  });
}

void FdPassing::OnReceived(const msghdr* msg) {
  if (!local_.ok()) return;
  ForEachPassedFd(msg, [this](int fd) { ReceiveFd(fd); });
}

void FdPassing::ReceiveFd(int fd) {
  FdEntry* entry = table_->Get(fd);
  if (entry == nullptr) return;
  // Still tracked: the host closed the old socket behind our back.
  if (entry->state.load(std::memory_order_relaxed) != 0) {
    events_.Release(FdTable::Untrack(*entry));
  }
  if (zone_->segment().corrupt()) return;
  const uint64_t inode = SocketInode(fd);
  if (inode == 0 || !zone_->handoffs().MayHave(inode)) return;
  const uint32_t me = watcher_.EnsureStarted();
  if (me == kNoSlot) return;
  uint32_t conn = kNoSlot;
  uint32_t cookie = 0;
  {
    ZoneLock lock(*zone_);
    if (!lock.ok()) {
      // Registered afresh by the watcher; the sender's handoff expires.
      registry_.MarkPending(fd, *entry, nullptr);
      return;
    }
    conn = zone_->handoffs().TakeLocked(inode, &cookie);
    // From now on this process paces and expires it, and its close (not
    // the sender's) ends the registration.
    if (conn != kNoSlot) zone_->conns().TransferLocked(conn, me, fd);
  }
  if (conn != kNoSlot)
    registry_.Adopt(fd, *entry, conn, cookie, options_.clock->NowNs(), 0);
}

void FdPassing::ExpireHandoffs(int64_t now_ns) {
  const uint32_t me = watcher_.proc_index();
  const int64_t before = now_ns - kHandoffExpiryNs;
  if (me == kNoSlot || !local_.ok() || !zone_->handoffs().HasOld(me, before)) {
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
      const ConnRef ref = ConnRef::From(expired[i]);
      const uint32_t index = ref.conn();
      const uint32_t cookie = ref.cookie();
      if (index >= zone_->conns().capacity()) continue;
      const ConnSlotShm& conn = zone_->conns().slot(index);
      const bool held = local_.Refs(index, cookie) > 0;
      if (ConnTable::CookieOf(conn.seq.load(std::memory_order_relaxed)) ==
              cookie &&
          conn.proc_index.load(std::memory_order_relaxed) == me && !held) {
        push |= registry_.DeregisterLocked(index);
      }
    }
  }
  if (push) zone_->changes().WakeWatchers();
}

}  // namespace trafficrate
