#include "src/runtime/fd_events.h"

namespace trafficrate {

bool FdEvents::Concerns(int fd) const {
  const FdEntry* entry = table_->Get(fd);
  if (entry != nullptr && entry->state.load(std::memory_order_relaxed) != 0) {
    return true;
  }
  return epolls_.Has(fd);
}

bool FdEvents::ConcernsRange(unsigned int first, unsigned int last) const {
  const unsigned int high_water =
      static_cast<unsigned int>(table_->high_water());
  for (unsigned int fd = first; fd < high_water && fd <= last; ++fd) {
    if (table_->Get(static_cast<int>(fd))
            ->state.load(std::memory_order_relaxed) != 0) {
      return true;
    }
  }
  return epolls_.AnyIn(first, last);
}

void FdEvents::Close(int fd, bool may_keep_fd) {
  epolls_.Forget(fd);
  const uint64_t state = Detach(fd);
  // Budget mode: a connection closed with data unsent keeps its place in
  // its key (and keeps counting) until the kernel has sent it.
  if (state != 0 && !FdState::From(state).kept_drain() && BudgetWanted() &&
      drains_.KeepDraining(fd, state, may_keep_fd)) {
    return;
  }
  Release(state);
}

void FdEvents::CloseRange(unsigned int first, unsigned int last) {
  const unsigned int high_water =
      static_cast<unsigned int>(table_->high_water());
  for (unsigned int fd = first; fd < high_water && fd <= last; ++fd) {
    Close(static_cast<int>(fd), /*may_keep_fd=*/false);
  }
  epolls_.ForgetIn(first, last);
}

uint64_t FdEvents::Detach(int fd) {
  FdEntry* entry = table_->Get(fd);
  if (entry == nullptr || entry->state.load(std::memory_order_relaxed) == 0) {
    return 0;
  }
  return FdTable::Untrack(*entry);
}

void FdEvents::Reattach(int fd, uint64_t state) {
  FdEntry* entry = table_->Get(fd);
  uint64_t empty = 0;
  if (entry != nullptr && state != 0 &&
      !entry->state.compare_exchange_strong(empty, state,
                                            std::memory_order_acq_rel)) {
    Release(state);  // something else took the slot meanwhile
  }
}

void FdEvents::Dup(int oldfd, int newfd) {
  FdEntry* from = table_->Get(oldfd);
  FdEntry* to = table_->Get(newfd);
  if (from == nullptr || to == nullptr || oldfd == newfd) return;
  // The same epoll set under another number.
  if (epolls_.Has(oldfd)) epolls_.Add(newfd);
  const uint64_t state = from->state.load(std::memory_order_acquire);
  // A pending registration stays with the fd it was accepted on: two
  // retries would count the connection twice. An inherited socket's group
  // takes the new fd in.
  if (state == 0 || FdState::From(state).kept_drain() ||
      state == FdState::Pending().word())
    return;
  if (to->state.load(std::memory_order_relaxed) != 0) {
    Release(FdTable::Untrack(*to));
  }
  if (FdState::From(state).pending()) {
    to->state.store(state, std::memory_order_release);
    table_->NoteTracked(newfd);
    return;
  }
  registry_.CopyRegistration(*from, state, *to, newfd);
}

void FdEvents::Release(uint64_t state) {
  if (FdState::From(state).kept_drain()) {
    // The host closed or replaced the fd number of a kept drain (it closes
    // every fd, say): the drain goes on, modelled, without it.
    drains_.DropKept(FdState::From(state).drain_slot());
    return;
  }
  registry_.Release(state);
}

}  // namespace trafficrate
