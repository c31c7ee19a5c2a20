// The host's epoll fds, as far as this process has seen them made
// (epoll_create, epoll_create1, and their duplicates): a socket the library
// keeps open past the host's close (drains.h) must first be taken out of
// them, since an epoll registration lives as long as the open file and the
// host's sets would go on reporting it. Past kMaxEpolls the set is unknown,
// and no socket is kept open.
//
//   HostEpolls epolls;
//   epolls.Add(epfd);                 // after epoll_create returned epfd
//   epolls.RemoveFromAll(fd);         // before keeping fd's socket open
//   epolls.Forget(fd);                // fd was closed
//
// Thread safety: any thread (lock-free slots).

#ifndef TRAFFICRATE_SRC_RUNTIME_HOST_EPOLLS_H_
#define TRAFFICRATE_SRC_RUNTIME_HOST_EPOLLS_H_

#include <atomic>
#include <cstdint>

namespace trafficrate {

class HostEpolls {
 public:
  static constexpr int kMaxEpolls = 16;

  // epfd is an epoll fd of the host's (ignored if negative).
  void Add(int epfd);
  // Whether fd is one of them.
  bool Has(int fd) const;
  // Whether any of them is in [first, last].
  bool AnyIn(unsigned int first, unsigned int last) const;
  // fd, or those in [first, last], no longer are (closed).
  void Forget(int fd);
  void ForgetIn(unsigned int first, unsigned int last);
  // Whether more were made than fit: the sets are not all known.
  bool unknown() const { return unknown_.load(std::memory_order_relaxed); }
  // Takes fd out of every known set (EPOLL_CTL_DEL; errors ignored).
  void RemoveFromAll(int fd) const;

 private:
  // The epoll fds + 1 (0: free).
  std::atomic<int32_t> epolls_[kMaxEpolls] = {};
  std::atomic<bool> unknown_{false};
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_HOST_EPOLLS_H_
