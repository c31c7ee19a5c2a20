// The interposed libc functions. Each one reads: guard -> (library code) ->
// real call -> (library code). Library code runs flagged against re-entry
// with errno saved around it, so the caller sees exactly what the real call
// returned and set. With the library off (TRAFFICRATE_RATE unset, bad
// configuration, no zone) g_governor is null and every call goes straight
// to libc.

#include <errno.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <climits>
#include <cstdarg>
#include <type_traits>

#include "lib/preload.h"
#include "lib/real.h"
#include "src/budget/shaped_send.h"
#include "src/budget/shaper.h"
#include "src/runtime/bypass_watch.h"
#include "src/runtime/governor.h"

#define TRAFFICRATE_EXPORT extern "C" __attribute__((visibility("default")))

namespace trafficrate {
namespace {

// Runs library code for one interposed call.
template <typename Body>
inline void AsLibrary(Governor* gov, Body body) {
  const int saved_errno = errno;
  t_in_library = true;
  body(*gov);
  t_in_library = false;
  errno = saved_errno;
}

// A new process (fork, or a raw clone that skipped pthread_atfork) is set
// up at its first interposed call; a call that finds another thread doing
// so passes through.
bool RenewProcess(Governor* gov) {
  bool current = false;
  AsLibrary(gov, [&](Governor& g) { current = g.RenewProcess(); });
  return current;
}

inline Governor* ActiveGovernor() {
  if (t_in_library) return nullptr;
  Governor* gov = g_governor.load(std::memory_order_acquire);
  if (gov != nullptr && !gov->ProcessCurrent() && !RenewProcess(gov)) {
    return nullptr;
  }
  return gov;
}

// A send on fd: the share is applied before the data is queued, so that not
// even the first write of a connection goes out unpaced.
template <typename Call>
inline auto Send(int fd, Call call) {
  Governor* gov = ActiveGovernor();
  if (gov == nullptr) return call();
  AsLibrary(gov, [fd](Governor& g) { g.BeforeSend(fd); });
  const auto sent = call();
  AsLibrary(gov, [fd, sent](Governor& g) { g.AfterSend(fd, sent); });
  return sent;
}

int RealSendmmsg(int fd, mmsghdr* msgs, unsigned int vlen, int flags) {
  return g_real.sendmmsg ? g_real.sendmmsg(fd, msgs, vlen, flags)
                         : syscall(SYS_sendmmsg, fd, msgs, vlen, flags);
}

ssize_t RealSendmsg(int fd, const msghdr* msg, int flags) {
  return g_real.sendmsg ? g_real.sendmsg(fd, msg, flags)
                        : syscall(SYS_sendmsg, fd, msg, flags);
}

ssize_t RealSendfile(int out_fd, int in_fd, off_t* offset, size_t count) {
  return g_real.sendfile ? g_real.sendfile(out_fd, in_fd, offset, count)
                         : syscall(SYS_sendfile, out_fd, in_fd, offset, count);
}

// The shaper's calls: libc's, never ours (pread and lseek are not
// interposed).
constexpr SendCalls kRealSendCalls = {&RealSendmmsg, &RealSendmsg, &::pread,
                                      &::lseek, &RealSendfile};

// A send on fd that the packet shaper (shaper.h) may cut into pieces: made
// whole by plain(), or cut by shaped(gov, cursor, count) (shaped_send.h),
// which counts the bytes as its pieces leave. total() is the call's byte
// count (only asked of a connection the shaper is on for); may_cut is
// false for calls that must go whole (flags, an address, control data).
template <typename Total, typename Plain, typename Shaped>
inline ssize_t ShapeOrSend(int fd, bool may_cut, Total total, Plain plain,
                           Shaped shaped) {
  Governor* gov = ActiveGovernor();
  // plain(shape, counter), where it takes them, counts as it goes.
  constexpr bool kCounts =
      std::is_invocable_v<Plain, const Shape&, SentCounter>;
  if (gov == nullptr) {
    if constexpr (kCounts) {
      return plain(Shape(), SentCounter([](size_t) {}));
    } else {
      return plain();
    }
  }
  Shape shape;
  AsLibrary(gov, [&](Governor& g) { shape = g.BeforeSend(fd); });
  const uint32_t first_left = shape.first_left;
  if (!may_cut) {
    shape.piece = 0;
    shape.first_left = 0;
  }
  PieceCursor cursor(shape, shape.Active() ? total() : 0);
  const auto count = [gov, fd](size_t bytes) {
    gov->AfterSend(fd, static_cast<ssize_t>(bytes));
  };
  if (!cursor.Cut()) {
    ssize_t sent = 0;
    if constexpr (kCounts) {
      sent = plain(shape, SentCounter(count));
    } else {
      sent = plain();
    }
    AsLibrary(gov, [&](Governor& g) {
      if (!kCounts) g.AfterSend(fd, sent);
      if (sent > 0 && first_left != 0) {
        g.UsedFirstPieces(fd, SegmentsOf(static_cast<size_t>(sent), shape.mss));
      }
    });
    return sent;
  }
  ShapeCounts counts;
  const ssize_t sent = shaped(*gov, cursor, SentCounter(count), &counts);
  AsLibrary(gov, [&](Governor& g) {
    g.UsedFirstPieces(fd, cursor.first_used());
    g.CountShaped(counts);
  });
  return sent;
}

// The bytes of iov[0 .. iovcnt), or 0 with *ok false for iovecs the kernel
// would refuse (the call then goes whole, and gets the kernel's answer).
size_t IovBytes(const iovec* iov, int iovcnt, bool* ok) {
  *ok = iov != nullptr && iovcnt > 0 && iovcnt <= IOV_MAX;
  size_t total = 0;
  for (int i = 0; *ok && i < iovcnt; ++i) {
    total += iov[i].iov_len;
    *ok = total <= static_cast<size_t>(SSIZE_MAX);
  }
  return *ok ? total : 0;
}

// sendfile and sendfile64 (off_t is 64 bits on every target built).
template <typename Offset, typename Plain>
ssize_t Sendfile(int out_fd, int in_fd, Offset* offset, size_t count,
                 Plain plain) {
  static_assert(sizeof(Offset) == sizeof(off_t));
  const size_t capped = count < kMaxSendfile ? count : kMaxSendfile;
  // Not cut: whole, but a long one in chunks counted as they go.
  const auto whole = [&](const Shape& shape, SentCounter counted) -> ssize_t {
    const size_t chunk = ChunkBytes(shape.level);
    if (chunk == 0 || capped <= chunk) {
      const ssize_t sent = plain();
      if (sent > 0) counted(static_cast<size_t>(sent));
      return sent;
    }
    return ChunkedSendfile(&RealSendfile, out_fd, in_fd,
                           reinterpret_cast<off_t*>(offset), capped, chunk,
                           counted);
  };
  return ShapeOrSend(
      out_fd, count != 0, [capped] { return capped; }, whole,
      [&](Governor& g, PieceCursor& cursor, SentCounter counted,
          ShapeCounts* counts) -> ssize_t {
        ssize_t result = 0;
        if (ShapedSendfile(kRealSendCalls, g.copy_buffers(), out_fd, in_fd,
                           reinterpret_cast<off_t*>(offset), capped, cursor,
                           counted, counts, &result)) {
          return result;
        }
        // No copy possible: the kernel's sendfile, whole.
        return whole(Shape{.level = 0}, counted);
      });
}

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

// A lower RLIMIT_NPROC may leave the process unable to start threads (it is
// checked at clone, once the process has dropped to a user that runs as
// many): privilege-separating servers (vsftpd's session processes) set it
// to 0 before they are handed their sockets. The watcher is started first.
template <typename Limit>
void BeforeSetLimit(pid_t pid, int resource, const Limit* limit) {
  if (resource != RLIMIT_NPROC || limit == nullptr ||
      limit->rlim_cur == RLIM_INFINITY) {
    return;
  }
  Governor* gov = ActiveGovernor();
  if (gov == nullptr || (pid != 0 && pid != getpid())) return;
  AsLibrary(gov, [](Governor& g) { g.BeforeThreadLimit(); });
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

namespace trafficrate {
namespace {

// write, send and sendto without an address: one buffer.
template <typename Plain>
ssize_t SendBuffer(int fd, const void* buf, size_t len, int flags, bool may_cut,
                   Plain plain) {
  return ShapeOrSend(
      fd, may_cut && FlagsAllowCut(flags) && len <= SSIZE_MAX,
      [len] { return len; }, plain,
      [&](Governor&, PieceCursor& cursor, SentCounter counted,
          ShapeCounts* counts) {
        const iovec one{const_cast<void*>(buf), len};
        return ShapedSendv(kRealSendCalls, fd, &one, 1, flags, cursor, counted,
                           counts);
      });
}

// writev, and sendmsg without an address or control data: iovecs.
template <typename Plain>
ssize_t SendIovecs(int fd, const iovec* iov, int iovcnt, int flags,
                   bool may_cut, Plain plain) {
  return ShapeOrSend(
      fd, may_cut && FlagsAllowCut(flags),
      [&] {
        bool ok = false;
        return IovBytes(iov, iovcnt, &ok);
      },
      plain,
      [&](Governor&, PieceCursor& cursor, SentCounter counted,
          ShapeCounts* counts) -> ssize_t {
        return ShapedSendv(kRealSendCalls, fd, iov, iovcnt, flags, cursor,
                           counted, counts);
      });
}

}  // namespace
}  // namespace trafficrate

TRAFFICRATE_EXPORT ssize_t write(int fd, const void* buf, size_t count) {
  return trafficrate::SendBuffer(fd, buf, count, 0, true, [&]() -> ssize_t {
    return g_real.write ? g_real.write(fd, buf, count)
                        : syscall(SYS_write, fd, buf, count);
  });
}

TRAFFICRATE_EXPORT ssize_t writev(int fd, const iovec* iov, int iovcnt) {
  return trafficrate::SendIovecs(fd, iov, iovcnt, 0, true, [&]() -> ssize_t {
    return g_real.writev ? g_real.writev(fd, iov, iovcnt)
                         : syscall(SYS_writev, fd, iov, iovcnt);
  });
}

TRAFFICRATE_EXPORT ssize_t send(int fd, const void* buf, size_t len,
                                int flags) {
  return trafficrate::SendBuffer(fd, buf, len, flags, true, [&]() -> ssize_t {
    return g_real.send ? g_real.send(fd, buf, len, flags)
                       : syscall(SYS_sendto, fd, buf, len, flags, nullptr, 0);
  });
}

TRAFFICRATE_EXPORT ssize_t sendto(int fd, const void* buf, size_t len,
                                  int flags, const sockaddr* addr,
                                  socklen_t addr_len) {
  return trafficrate::SendBuffer(
      fd, buf, len, flags, addr == nullptr, [&]() -> ssize_t {
        return g_real.sendto
                   ? g_real.sendto(fd, buf, len, flags, addr, addr_len)
                   : syscall(SYS_sendto, fd, buf, len, flags, addr, addr_len);
      });
}

TRAFFICRATE_EXPORT ssize_t sendmsg(int fd, const msghdr* msg, int flags) {
  auto call = [&]() -> ssize_t {
    return trafficrate::RealSendmsg(fd, msg, flags);
  };
  // Passing fds (SCM_RIGHTS): governed sockets among them are published
  // before they leave, so that the receiver finds them.
  if (msg == nullptr || msg->msg_controllen == 0) {
    return trafficrate::SendIovecs(
        fd, msg != nullptr ? msg->msg_iov : nullptr,
        msg != nullptr ? static_cast<int>(msg->msg_iovlen) : 0, flags,
        msg != nullptr && msg->msg_name == nullptr &&
            msg->msg_iovlen <= IOV_MAX,
        call);
  }
  trafficrate::Governor* gov = trafficrate::ActiveGovernor();
  if (gov == nullptr) return call();
  int published = 0;
  trafficrate::AsLibrary(
      gov, [&](trafficrate::Governor& g) { published = g.BeforePassFds(msg); });
  const ssize_t sent = trafficrate::Send(fd, call);
  if (published > 0) {
    trafficrate::AsLibrary(
        gov, [&](trafficrate::Governor& g) { g.AfterPassFds(msg, sent >= 0); });
  }
  return sent;
}

TRAFFICRATE_EXPORT int sendmmsg(int fd, mmsghdr* msgs, unsigned int vlen,
                                int flags) {
  trafficrate::Governor* gov = trafficrate::ActiveGovernor();
  auto call = [&]() -> int {
    return trafficrate::RealSendmmsg(fd, msgs, vlen, flags);
  };
  if (gov == nullptr) return call();
  // Bounded: the kernel takes at most UIO_MAXIOV (1024) messages per call.
  const unsigned int n = msgs != nullptr ? (vlen < 1024 ? vlen : 1024) : 0;
  int published = 0;
  bool plain = false;  // a message the shaper must not cut
  trafficrate::Shape shape;
  trafficrate::AsLibrary(gov, [&](trafficrate::Governor& g) {
    for (unsigned int i = 0; i < n; ++i) {
      plain = plain || msgs[i].msg_hdr.msg_name != nullptr ||
              msgs[i].msg_hdr.msg_controllen != 0;
      if (msgs[i].msg_hdr.msg_controllen != 0) {
        published += g.BeforePassFds(&msgs[i].msg_hdr);
      }
    }
    shape = g.BeforeSend(fd);
  });
  if (shape.Active() && !plain && n > 0) {
    // Each message as a call of its own, cut by the shaper; as the
    // kernel's loop does, stop at a message not sent whole, and fail only
    // if the first one fails.
    const int saved_errno = errno;
    unsigned int done = 0;
    for (; done < n; ++done) {
      msghdr* hdr = &msgs[done].msg_hdr;
      bool ok = false;
      const size_t want = trafficrate::IovBytes(
          hdr->msg_iov, static_cast<int>(hdr->msg_iovlen), &ok);
      const ssize_t r = trafficrate::SendIovecs(
          fd, hdr->msg_iov, static_cast<int>(hdr->msg_iovlen), flags, ok,
          [&]() -> ssize_t {
            return trafficrate::RealSendmsg(fd, hdr, flags);
          });
      if (r < 0) break;
      msgs[done].msg_len = static_cast<unsigned int>(r);
      if (static_cast<size_t>(r) < want) {
        ++done;
        break;
      }
    }
    if (done == 0) return -1;
    errno = saved_errno;
    return static_cast<int>(done);
  }
  const int sent = call();
  trafficrate::AsLibrary(gov, [&](trafficrate::Governor& g) {
    ssize_t bytes = 0;
    for (int i = 0; i < sent; ++i) bytes += msgs[i].msg_len;
    g.AfterSend(fd, bytes);
    // The messages after the last one sent did not leave.
    for (unsigned int i = sent > 0 ? static_cast<unsigned int>(sent) : 0;
         published > 0 && i < n; ++i) {
      if (msgs[i].msg_hdr.msg_controllen != 0) {
        g.AfterPassFds(&msgs[i].msg_hdr, /*sent=*/false);
      }
    }
  });
  return sent;
}

TRAFFICRATE_EXPORT ssize_t recvmsg(int fd, msghdr* msg, int flags) {
  const ssize_t r = g_real.recvmsg ? g_real.recvmsg(fd, msg, flags)
                                   : syscall(SYS_recvmsg, fd, msg, flags);
  if (r < 0 || msg == nullptr || msg->msg_controllen == 0) return r;
  if (trafficrate::Governor* gov = trafficrate::ActiveGovernor()) {
    trafficrate::AsLibrary(
        gov, [msg](trafficrate::Governor& g) { g.OnReceivedFds(msg); });
  }
  return r;
}

TRAFFICRATE_EXPORT int recvmmsg(int fd, mmsghdr* msgs, unsigned int vlen,
                                int flags, timespec* timeout) {
  const int r = g_real.recvmmsg
                    ? g_real.recvmmsg(fd, msgs, vlen, flags, timeout)
                    : syscall(SYS_recvmmsg, fd, msgs, vlen, flags, timeout);
  if (r <= 0 || msgs == nullptr) return r;
  if (trafficrate::Governor* gov = trafficrate::ActiveGovernor()) {
    trafficrate::AsLibrary(gov, [&](trafficrate::Governor& g) {
      for (int i = 0; i < r; ++i) {
        if (msgs[i].msg_hdr.msg_controllen != 0) {
          g.OnReceivedFds(&msgs[i].msg_hdr);
        }
      }
    });
  }
  return r;
}

TRAFFICRATE_EXPORT ssize_t sendfile(int out_fd, int in_fd, off_t* offset,
                                    size_t count) {
  return trafficrate::Sendfile(out_fd, in_fd, offset, count, [&]() -> ssize_t {
    return trafficrate::RealSendfile(out_fd, in_fd, offset, count);
  });
}

TRAFFICRATE_EXPORT ssize_t sendfile64(int out_fd, int in_fd, off64_t* offset,
                                      size_t count) {
  return trafficrate::Sendfile(out_fd, in_fd, offset, count, [&]() -> ssize_t {
    return g_real.sendfile64
               ? g_real.sendfile64(out_fd, in_fd, offset, count)
               : syscall(SYS_sendfile, out_fd, in_fd, offset, count);
  });
}

// splice to a socket is never cut: its source is a pipe, which cannot be
// un-read, and a copy would have to consume bytes the kernel may not take.
// It goes whole (its first pieces counted by the segments it makes).
TRAFFICRATE_EXPORT ssize_t splice(int fd_in, loff_t* off_in, int fd_out,
                                  loff_t* off_out, size_t len,
                                  unsigned int flags) {
  const auto call = [&]() -> ssize_t {
    return g_real.splice
               ? g_real.splice(fd_in, off_in, fd_out, off_out, len, flags)
               : syscall(SYS_splice, fd_in, off_in, fd_out, off_out, len,
                         flags);
  };
  return trafficrate::ShapeOrSend(
      fd_out, false, [] { return size_t{0}; }, call,
      [&](trafficrate::Governor&, trafficrate::PieceCursor&,
          trafficrate::SentCounter,
          trafficrate::ShapeCounts*) { return call(); });
}

// The setrlimit family is called by AddressSanitizer's own start-up (for
// RLIMIT_CORE), before its shadow memory exists: in the library's ASan build
// these interposers must touch no instrumented memory until they know the
// call is one the library cares about (RLIMIT_NPROC, which no sanitizer
// sets).
#define TRAFFICRATE_NO_ASAN __attribute__((no_sanitize_address))

TRAFFICRATE_EXPORT TRAFFICRATE_NO_ASAN int setrlimit(
    __rlimit_resource_t resource, const rlimit* limit) {
  if (resource == RLIMIT_NPROC) trafficrate::BeforeSetLimit(0, resource, limit);
  return g_real.setrlimit ? g_real.setrlimit(resource, limit)
                          : syscall(SYS_prlimit64, 0, resource, limit, nullptr);
}

TRAFFICRATE_EXPORT TRAFFICRATE_NO_ASAN int setrlimit64(
    __rlimit_resource_t resource, const rlimit64* limit) {
  if (resource == RLIMIT_NPROC) trafficrate::BeforeSetLimit(0, resource, limit);
  return g_real.setrlimit64
             ? g_real.setrlimit64(resource, limit)
             : syscall(SYS_prlimit64, 0, resource, limit, nullptr);
}

TRAFFICRATE_EXPORT TRAFFICRATE_NO_ASAN int prlimit(pid_t pid,
                                                   __rlimit_resource resource,
                                                   const rlimit* limit,
                                                   rlimit* old) {
  if (resource == RLIMIT_NPROC) {
    trafficrate::BeforeSetLimit(pid, resource, limit);
  }
  return g_real.prlimit ? g_real.prlimit(pid, resource, limit, old)
                        : syscall(SYS_prlimit64, pid, resource, limit, old);
}

TRAFFICRATE_EXPORT TRAFFICRATE_NO_ASAN int prlimit64(pid_t pid,
                                                     __rlimit_resource resource,
                                                     const rlimit64* limit,
                                                     rlimit64* old) {
  if (resource == RLIMIT_NPROC) {
    trafficrate::BeforeSetLimit(pid, resource, limit);
  }
  return g_real.prlimit64 ? g_real.prlimit64(pid, resource, limit, old)
                          : syscall(SYS_prlimit64, pid, resource, limit, old);
}
