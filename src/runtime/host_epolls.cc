#include "src/runtime/host_epolls.h"

#include <sys/epoll.h>

namespace trafficrate {
namespace {

bool In(int32_t known, unsigned int first, unsigned int last) {
  return known > 0 && static_cast<unsigned int>(known - 1) >= first &&
         static_cast<unsigned int>(known - 1) <= last;
}

}  // namespace

void HostEpolls::Add(int epfd) {
  if (epfd < 0) return;
  for (std::atomic<int32_t>& epoll : epolls_) {
    int32_t free = 0;
    if (epoll.compare_exchange_strong(free, epfd + 1,
                                      std::memory_order_relaxed)) {
      return;
    }
  }
  unknown_.store(true, std::memory_order_relaxed);
}

bool HostEpolls::Has(int fd) const {
  if (fd < 0) return false;  // a free slot holds 0, which is -1 + 1
  for (const std::atomic<int32_t>& epoll : epolls_) {
    if (epoll.load(std::memory_order_relaxed) == fd + 1) return true;
  }
  return false;
}

bool HostEpolls::AnyIn(unsigned int first, unsigned int last) const {
  for (const std::atomic<int32_t>& epoll : epolls_) {
    if (In(epoll.load(std::memory_order_relaxed), first, last)) return true;
  }
  return false;
}

void HostEpolls::Forget(int fd) {
  for (std::atomic<int32_t>& epoll : epolls_) {
    int32_t known = fd + 1;
    if (epoll.load(std::memory_order_relaxed) == known) {
      epoll.compare_exchange_strong(known, 0, std::memory_order_relaxed);
    }
  }
}

void HostEpolls::ForgetIn(unsigned int first, unsigned int last) {
  for (std::atomic<int32_t>& epoll : epolls_) {
    if (In(epoll.load(std::memory_order_relaxed), first, last)) {
      epoll.store(0, std::memory_order_relaxed);
    }
  }
}

void HostEpolls::RemoveFromAll(int fd) const {
  for (const std::atomic<int32_t>& epoll : epolls_) {
    const int32_t epfd = epoll.load(std::memory_order_relaxed) - 1;
    if (epfd >= 0) epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
  }
}

}  // namespace trafficrate
