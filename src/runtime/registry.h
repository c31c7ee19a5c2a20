// The connection registry: a process's side of the zone's connection table.
// It classifies an accepted socket under the rules in force, registers its
// connection with the zone (or marks it pending while the zone lock or the
// watcher is not to be had, and registers it later), makes the fds of this
// process hold the registration (LocalConns refs), joins the connection to
// its key at its first send (or once TRAFFICRATE_AFTER bytes left), takes a
// registration over from another process, and ends it when the last fd of
// its owner goes (deferring that to the watcher while the lock is held).
//
//   Registry registry(context, pacer);
//   registry.Register(fd, entry, key, peer16, peer_port);  // on accept
//   registry.JoinSlow(fd, entry, state);  // a send of a connection at rest
//   registry.Release(state);              // an fd of it was closed
//
// Thread safety: any thread, except the watcher's duties (RegisterPending,
// FinishDeferredReleases), which run on the watcher thread.

#ifndef TRAFFICRATE_SRC_RUNTIME_REGISTRY_H_
#define TRAFFICRATE_SRC_RUNTIME_REGISTRY_H_

#include <sys/socket.h>

#include <atomic>
#include <cstdint>

#include "src/net/key.h"
#include "src/runtime/governor_context.h"
#include "src/runtime/pacer.h"

namespace trafficrate {

class Registry : private GovernorPart {
 public:
  // REQUIRES: pacer outlives the Registry.
  Registry(const GovernorContext& context, const Pacer& pacer)
      : GovernorPart(context), pacer_(pacer) {}

  // ClassifyConn (classify.h) under the rule table in force.
  bool ClassifyFd(int fd, const sockaddr* peer, socklen_t peer_len,
                  ConnKey* key, uint8_t peer16[16], uint16_t* peer_port) const;
  // Registers fd's connection; its fd entry must still hold `expected`
  // then (0, or FdState::Pending() from RegisterPending), else the
  // registration ends at once (the fd was closed meanwhile). inherited: the
  // socket came from the process's parent (an exec'd CGI helper's stdout);
  // a registration its accepting process made is taken over, as a forked
  // child's would be, rather than counted twice.
  void Register(int fd, FdEntry& entry, const ConnKey& key,
                const uint8_t peer16[16], uint16_t peer_port,
                uint64_t expected = 0, bool inherited = false);
  // Makes fd an fd of this process on connection conn (cookie), whose
  // registration this process owns now (Register, a received fd), if fd's
  // entry still holds `expected`; else ends the registration and returns
  // false. fresh: a connection this process accepted, which has sent
  // nothing yet (its first bytes are cut into first pieces).
  bool Adopt(int fd, FdEntry& entry, uint32_t conn, uint32_t cookie,
             int64_t now_ns, uint64_t expected, bool fresh = false);
  // A registration that could not be made (zone lock stalled, watcher not
  // started yet, rules being reloaded): the watcher makes it as soon as it
  // can (RegisterPending), or the fd's next send (RetryRegister). With its
  // key known, the socket is paced at its rule's rate meanwhile.
  void MarkPending(int fd, FdEntry& entry, const ConnKey* key);
  // The watcher, once the zone lock is free: registers and joins the
  // connections marked pending, without waiting for their next send.
  void RegisterPending();
  // A send on a pending fd. pending: the state it had (FdState::Pending(),
  // or an inherited socket's FdState::PendingGroup).
  void RetryRegister(int fd, FdEntry& entry, uint64_t pending);
  // Makes `to` (fd newfd) another fd of from's registration `state`.
  void CopyRegistration(const FdEntry& from, uint64_t state, FdEntry& to,
                        int newfd) const;
  // Joins the connection of fd (state) to its key if it is past
  // TRAFFICRATE_AFTER, taking it over if another process registered it and
  // does not send it, and applies its share.
  void JoinSlow(int fd, FdEntry& entry, uint64_t state);
  // The registration of fd ended in another process: registers it again
  // here, for fd and every duplicate of it in this process, and joins it.
  void Reregister(int fd, FdEntry& entry, uint64_t state);
  // An fd of this process on registration `state` is gone: the last one of
  // its owning process ends it (unless it was passed and not received).
  // States of no connection slot (0, pending, kept drains) are ignored.
  void Release(uint64_t state);
  // REQUIRES: zone lock held. Deregisters connection slot `index`; true if
  // its key still has senders to push to.
  bool DeregisterLocked(uint32_t index) const;
  // REQUIRES: zone lock held. Whether the key of `conn` has sending
  // connections other than `conn`, whose shares a change must push.
  bool SiblingsSendingLocked(const ConnSlotShm& conn) const;
  // The watcher, once it has the zone lock: the releases deferred because
  // the lock was held.
  void FinishDeferredReleases();
  // Releases that could not be deferred (the deferred slots were full):
  // they stay counted until the process exits.
  uint64_t deferred_lost() const {
    return deferred_lost_.load(std::memory_order_relaxed);
  }
  // In the child after fork: the parent's pending registrations are ours to
  // make too; its deferred releases are its own.
  void AfterForkChild();

 private:
  // After RetryRegister of an inherited socket's fd: its other fds (same
  // pending group) take the registration, or none if it is not governed.
  void SettleGroup(int fd, FdEntry& entry, uint64_t pending);
  // TRAFFICRATE_AFTER: whether the connection's first after_bytes have left
  // the socket (sent, not merely queued). One ioctl once they are queued.
  bool PastAfter(int fd, const ConnSlotShm& conn) const;
  // A close whose deregistration found the zone lock held: the watcher
  // finishes it (FinishDeferredReleases) once it gets the lock.
  void DeferRelease(uint64_t state);

  const Pacer& pacer_;
  // Releases deferred because the zone lock was held (DeferRelease).
  static constexpr int kDeferredSlots = 1024;
  std::atomic<uint64_t> deferred_[kDeferredSlots] = {};
  std::atomic<int> deferred_count_{0};
  std::atomic<uint64_t> deferred_lost_{0};
  // Some fd may be FdState::Pending() (MarkPending): RegisterPending looks.
  std::atomic<bool> pending_maybe_{false};
  mutable std::atomic<int64_t> last_full_log_ns_{0};
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_REGISTRY_H_
