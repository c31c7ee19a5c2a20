// The interposers of messages: sendmsg and sendmmsg (their data sent as
// the other send paths send it, interpose_send.cc; governed sockets among
// the fds they pass with SCM_RIGHTS published before they leave), and
// recvmsg and recvmmsg (fds received that way taken in).

#include <errno.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

#include <climits>
#include <cstddef>

#include "lib/interpose.h"
#include "lib/real.h"
#include "src/budget/shaper.h"
#include "src/runtime/governor.h"

using trafficrate::g_real;

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
