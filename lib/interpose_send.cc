// The interposers of the send paths that carry data only: write, writev,
// send and sendto, sendfile and sendfile64, splice. Each sends through
// ShapeOrSend (interpose.h): the share applied before the data is queued,
// and the packet shaper's pieces where it is on. sendmsg and sendmmsg are
// in interpose_msg.cc.

#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <climits>
#include <cstddef>

#include "lib/interpose.h"
#include "lib/real.h"
#include "src/budget/shaped_send.h"
#include "src/budget/shaper.h"
#include "src/runtime/governor.h"

namespace trafficrate {
namespace {

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

}  // namespace
}  // namespace trafficrate

using trafficrate::g_real;

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
