// Budget mode: connections closed with data still unsent. Such a
// connection keeps its place in its key until the kernel has sent what it
// holds, so that the key's count does not forget it and its siblings do
// not get its share while it still sends. Its socket is kept open through a
// private duplicate above the host's fds (when that is safe: no lingering,
// nothing unread, the host's epoll sets known, few enough), so that the
// level still reaches it and its queue can be measured; otherwise its drain
// is modelled at the rate in force at close.
//
//   if (drains.KeepDraining(fd, state, /*may_keep_fd=*/true)) return;
//   ... the watcher: drains.Tick(now_ns);
//   ... accept failed with EMFILE: drains.ReleaseKept();
//
// Thread safety: KeepDraining, DropKept and ReleaseKept from any thread;
// Tick from the watcher thread.

#ifndef TRAFFICRATE_SRC_RUNTIME_DRAINS_H_
#define TRAFFICRATE_SRC_RUNTIME_DRAINS_H_

#include <atomic>
#include <cstdint>

#include "src/runtime/governor_context.h"
#include "src/runtime/host_epolls.h"
#include "src/runtime/key_decisions.h"
#include "src/runtime/pacer.h"
#include "src/runtime/registry.h"

namespace trafficrate {

class Drains : private GovernorPart {
 public:
  // REQUIRES: the parts given outlive the Drains.
  Drains(const GovernorContext& context, const Pacer& pacer,
         const Registry& registry, KeyDecisions& decisions,
         const HostEpolls& epolls)
      : GovernorPart(context),
        pacer_(pacer),
        registry_(registry),
        decisions_(decisions),
        epolls_(epolls) {}

  // At the close of fd (state): keeps its connection in its key until the
  // kernel has sent what it holds. False if it was not kept (nothing
  // unsent, the peer hung up, passed to another process, no free slot):
  // then the caller releases it. With may_keep_fd, also keeps its socket
  // open (not from close_range, which would close that duplicate right
  // after).
  bool KeepDraining(int fd, uint64_t state, bool may_keep_fd);
  // Drain `slot`'s kept fd number was closed or replaced by the host (a
  // close-everything loop): the drain goes on, modelled, without it.
  void DropKept(uint32_t slot);
  // Closes the kept fds (they drain on at the rate in force), so that the
  // host can have them. Returns how many.
  int ReleaseKept();
  // One pass over the drains: measures or models what left, ends the ones
  // done (deregistering them). Whether any is still draining.
  bool Tick(int64_t now_ns);
  // In the child after fork: the parent's drains are the parent's to
  // finish; the fds that keep them open are closed.
  void AfterForkChild();
  // The zone is corrupt: kept sockets go back to unpaced and are closed.
  void PassThrough();

 private:
  // A private duplicate of fd, above the host's fds, for drain `slot`,
  // taken out of the host's epoll sets; -1 if it should not or cannot be.
  int KeepFd(int fd, uint32_t slot);
  // Measures and paces a kept drain; the bytes still unsent, or -1.
  int64_t VisitKept(uint32_t slot, int fd, const ConnSlotShm& conn);
  // Closes drain `slot`'s kept fd, if it has one (the socket then drains on
  // by itself); true if it did.
  bool CloseKept(uint32_t slot);

  const Pacer& pacer_;
  const Registry& registry_;
  KeyDecisions& decisions_;
  const HostEpolls& epolls_;
  // Closed connections still draining: a ConnRef word (conn_table.h), 0 if
  // free.
  static constexpr int kDrainSlots = 1024;
  // A slot being filled in by KeepDraining; Tick leaves it alone.
  static constexpr uint64_t kDrainFilling = ~0ULL;
  std::atomic<uint64_t> drains_[kDrainSlots] = {};
  // Per drain slot: the kept fd + 1 (0: none, the drain is modelled at the
  // rate in force at close), the share token last applied to it, and when
  // it is next measured.
  std::atomic<int32_t> drain_fd_[kDrainSlots] = {};
  std::atomic<uint64_t> drain_token_[kDrainSlots] = {};
  std::atomic<int64_t> drain_due_ns_[kDrainSlots] = {};
  static constexpr int kMaxKeptDrains = 256;
  std::atomic<int> kept_drains_{0};
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_DRAINS_H_
