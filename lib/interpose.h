// What the interposers (lib/interpose_*.cc) share. Each interposer reads:
// guard -> (library code) -> real call -> (library code). Library code runs
// flagged against re-entry with errno saved around it, so the caller sees
// exactly what the real call returned and set. With the library off
// (TRAFFICRATE_RATE unset, bad configuration, no zone) g_governor is null
// and every call goes straight to libc.
//
//   TRAFFICRATE_EXPORT int dup(int fd) {  // interpose_fds.cc
//     const int r = g_real.dup ? g_real.dup(fd) : syscall(SYS_dup, fd);
//     return trafficrate::AfterDup(fd, r);  // ActiveGovernor, AsLibrary
//   }
//
// Hot path: no allocation, errno untouched (AsLibrary restores it).
// Everything here is inline and hidden (the library's visibility preset):
// only the interposers themselves are exported (lib/exports.map).

#ifndef TRAFFICRATE_LIB_INTERPOSE_H_
#define TRAFFICRATE_LIB_INTERPOSE_H_

#include <errno.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "lib/preload.h"
#include "lib/real.h"
#include "src/budget/shaped_send.h"
#include "src/budget/shaper.h"
#include "src/runtime/governor.h"

#define TRAFFICRATE_EXPORT extern "C" __attribute__((visibility("default")))

namespace trafficrate {

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
inline bool RenewProcess(Governor* gov) {
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

inline int RealSendmmsg(int fd, mmsghdr* msgs, unsigned int vlen, int flags) {
  return g_real.sendmmsg ? g_real.sendmmsg(fd, msgs, vlen, flags)
                         : syscall(SYS_sendmmsg, fd, msgs, vlen, flags);
}

inline ssize_t RealSendmsg(int fd, const msghdr* msg, int flags) {
  return g_real.sendmsg ? g_real.sendmsg(fd, msg, flags)
                        : syscall(SYS_sendmsg, fd, msg, flags);
}

inline ssize_t RealSendfile(int out_fd, int in_fd, off_t* offset,
                            size_t count) {
  return g_real.sendfile ? g_real.sendfile(out_fd, in_fd, offset, count)
                         : syscall(SYS_sendfile, out_fd, in_fd, offset, count);
}

// The shaper's calls: libc's, never ours (pread and lseek are not
// interposed).
inline constexpr SendCalls kRealSendCalls = {&RealSendmmsg, &RealSendmsg,
                                             &::pread, &::lseek, &RealSendfile};

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
inline size_t IovBytes(const iovec* iov, int iovcnt, bool* ok) {
  *ok = iov != nullptr && iovcnt > 0 && iovcnt <= IOV_MAX;
  size_t total = 0;
  for (int i = 0; *ok && i < iovcnt; ++i) {
    total += iov[i].iov_len;
    *ok = total <= static_cast<size_t>(SSIZE_MAX);
  }
  return *ok ? total : 0;
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

}  // namespace trafficrate

#endif  // TRAFFICRATE_LIB_INTERPOSE_H_
