// The interposers of an fd's life: accept, accept4 and listen (the
// connections the library governs, and the ports it watches), epoll_create
// (the host's epoll sets), close, close_range and closefrom, dup, dup2,
// dup3, and fcntl's F_DUPFD (fds that end, or name the same socket under
// another number).

#include <errno.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstdarg>
#include <cstdint>

#include "lib/interpose.h"
#include "lib/preload.h"
#include "lib/real.h"
#include "src/runtime/bypass_watch.h"
#include "src/runtime/governor.h"

namespace trafficrate {
namespace {

int AfterAccept(int fd, const sockaddr* addr, const socklen_t* len,
                socklen_t capacity) {
  Governor* gov = fd >= 0 ? ActiveGovernor() : nullptr;
  if (gov == nullptr) return fd;
  if (ListenWatch* watch = g_listen_watch.load(std::memory_order_relaxed)) {
    watch->NoteAccept();
  }
  const socklen_t peer_len =
      addr != nullptr && len != nullptr && *len < capacity ? *len : capacity;
  AsLibrary(gov, [&](Governor& g) {
    g.OnAccept(fd, addr != nullptr ? addr : nullptr, peer_len);
  });
  return fd;
}

void AfterListen(int fd) {
  ListenWatch* watch = g_listen_watch.load(std::memory_order_acquire);
  Governor* gov = watch != nullptr ? ActiveGovernor() : nullptr;
  if (gov != nullptr) {
    AsLibrary(gov, [watch, fd](Governor&) { watch->OnListen(fd); });
  }
}

int AfterDup(int oldfd, int newfd) {
  Governor* gov = newfd >= 0 ? ActiveGovernor() : nullptr;
  if (gov != nullptr) {
    AsLibrary(gov, [&](Governor& g) { g.OnDup(oldfd, newfd); });
  }
  return newfd;
}

// dup2/dup3: newfd's socket (if governed) is released only if the call
// really replaced it; while it runs, the watcher cannot touch newfd.
template <typename Call>
int Replace(int oldfd, int newfd, Call call) {
  Governor* gov = oldfd != newfd ? ActiveGovernor() : nullptr;
  if (gov == nullptr) return call();
  uint64_t detached = 0;
  AsLibrary(gov, [&](Governor& g) { detached = g.Detach(newfd); });
  const int r = call();
  AsLibrary(gov, [&](Governor& g) {
    if (r >= 0) {
      g.ReleaseDetached(detached);
      g.OnDup(oldfd, newfd);
    } else {
      g.Reattach(newfd, detached);
    }
  });
  return r;
}

// accept failing for want of fds while the library holds some (kept
// drains, budget mode): they are given up and the call is made again, so
// that the host never runs short of fds because of us.
template <typename Call>
int RetryOnOurFds(Call call) {
  const int r = call();
  if (r >= 0 || errno != EMFILE) return r;
  Governor* gov = ActiveGovernor();
  if (gov == nullptr) return r;
  int released = 0;
  AsLibrary(gov, [&](Governor& g) { released = g.ReleaseKeptDrains(); });
  return released > 0 ? call() : r;
}

int AfterEpollCreate(int epfd) {
  Governor* gov = epfd >= 0 ? ActiveGovernor() : nullptr;
  if (gov != nullptr) {
    AsLibrary(gov, [epfd](Governor& g) { g.OnEpollCreate(epfd); });
  }
  return epfd;
}

void BeforeCloseRange(unsigned int first, unsigned int last) {
  if (Governor* gov = ActiveGovernor()) {
    AsLibrary(gov, [&](Governor& g) { g.OnCloseRange(first, last); });
  }
}

}  // namespace
}  // namespace trafficrate

using trafficrate::g_real;

TRAFFICRATE_EXPORT int accept(int fd, sockaddr* addr, socklen_t* len) {
  const socklen_t capacity = addr != nullptr && len != nullptr ? *len : 0;
  const int r = trafficrate::RetryOnOurFds([&]() -> int {
    return g_real.accept ? g_real.accept(fd, addr, len)
                         : syscall(SYS_accept, fd, addr, len);
  });
  return trafficrate::AfterAccept(r, addr, len, capacity);
}

TRAFFICRATE_EXPORT int accept4(int fd, sockaddr* addr, socklen_t* len,
                               int flags) {
  const socklen_t capacity = addr != nullptr && len != nullptr ? *len : 0;
  const int r = trafficrate::RetryOnOurFds([&]() -> int {
    return g_real.accept4 ? g_real.accept4(fd, addr, len, flags)
                          : syscall(SYS_accept4, fd, addr, len, flags);
  });
  return trafficrate::AfterAccept(r, addr, len, capacity);
}

TRAFFICRATE_EXPORT int listen(int fd, int backlog) {
  const int r = g_real.listen ? g_real.listen(fd, backlog)
                              : syscall(SYS_listen, fd, backlog);
  if (r == 0) trafficrate::AfterListen(fd);
  return r;
}

TRAFFICRATE_EXPORT int epoll_create(int size) {
#ifdef SYS_epoll_create
  const int r = g_real.epoll_create ? g_real.epoll_create(size)
                                    : syscall(SYS_epoll_create, size);
#else
  const int r = g_real.epoll_create ? g_real.epoll_create(size)
                : size <= 0         ? (errno = EINVAL, -1)
                                    : syscall(SYS_epoll_create1, 0);
#endif
  return trafficrate::AfterEpollCreate(r);
}

TRAFFICRATE_EXPORT int epoll_create1(int flags) {
  const int r = g_real.epoll_create1 ? g_real.epoll_create1(flags)
                                     : syscall(SYS_epoll_create1, flags);
  return trafficrate::AfterEpollCreate(r);
}

TRAFFICRATE_EXPORT int close(int fd) {
  if (trafficrate::Governor* gov = trafficrate::ActiveGovernor()) {
    trafficrate::AsLibrary(gov,
                           [fd](trafficrate::Governor& g) { g.OnClose(fd); });
  }
  return g_real.close ? g_real.close(fd) : syscall(SYS_close, fd);
}

TRAFFICRATE_EXPORT int close_range(unsigned int first, unsigned int last,
                                   int flags) {
  if ((flags & CLOSE_RANGE_CLOEXEC) == 0) {
    trafficrate::BeforeCloseRange(first, last);
  }
  return g_real.close_range ? g_real.close_range(first, last, flags)
                            : syscall(SYS_close_range, first, last, flags);
}

TRAFFICRATE_EXPORT void closefrom(int lowfd) {
  if (lowfd >= 0) trafficrate::BeforeCloseRange(lowfd, UINT_MAX);
  if (g_real.closefrom) {
    g_real.closefrom(lowfd);
  } else {
    syscall(SYS_close_range, lowfd, UINT_MAX, 0);
  }
}

TRAFFICRATE_EXPORT int dup(int fd) {
  const int r = g_real.dup ? g_real.dup(fd) : syscall(SYS_dup, fd);
  return trafficrate::AfterDup(fd, r);
}

TRAFFICRATE_EXPORT int dup2(int oldfd, int newfd) {
  return trafficrate::Replace(oldfd, newfd, [&]() -> int {
    return g_real.dup2 ? g_real.dup2(oldfd, newfd)
                       : syscall(SYS_dup2, oldfd, newfd);
  });
}

TRAFFICRATE_EXPORT int dup3(int oldfd, int newfd, int flags) {
  return trafficrate::Replace(oldfd, newfd, [&]() -> int {
    return g_real.dup3 ? g_real.dup3(oldfd, newfd, flags)
                       : syscall(SYS_dup3, oldfd, newfd, flags);
  });
}

namespace trafficrate {
namespace {

// fcntl's third argument is an int or a pointer depending on cmd; both are
// passed in the same register class, so forwarding it as a pointer is what
// glibc's own wrapper does.
int Fcntl(int (*real)(int, int, ...), int fd, int cmd, void* arg) {
  const int r = real ? real(fd, cmd, arg) : syscall(SYS_fcntl, fd, cmd, arg);
  if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) return AfterDup(fd, r);
  return r;
}

}  // namespace
}  // namespace trafficrate

TRAFFICRATE_EXPORT int fcntl(int fd, int cmd, ...) {
  va_list args;
  va_start(args, cmd);
  void* arg = va_arg(args, void*);
  va_end(args);
  return trafficrate::Fcntl(g_real.fcntl, fd, cmd, arg);
}

TRAFFICRATE_EXPORT int fcntl64(int fd, int cmd, ...) {
  va_list args;
  va_start(args, cmd);
  void* arg = va_arg(args, void*);
  va_end(args);
  return trafficrate::Fcntl(g_real.fcntl64 ? g_real.fcntl64 : g_real.fcntl, fd,
                            cmd, arg);
}
