// The shaper's system calls: one host call (send, write, writev, sendmsg,
// sendmmsg, sendfile) made as the MSG_EOR pieces a PieceCursor cuts
// (shaper.h), with what the host sees unchanged.
//
//   PieceCursor cursor(shape, total);
//   if (cursor.Cut()) {
//     ssize_t r = ShapedSendv(calls, fd, iov, iovcnt, flags, cursor, count);
//   }
//
// What the host sees is what one call would have given it:
//   * the total the kernel accepted. The pieces go in sendmmsg batches
//     (a batch's messages stay separate packets: docs/design.md), and the call
//     stops at the first piece the kernel did not take whole (a full
//     socket buffer, a signal, SO_SNDTIMEO), returning the bytes taken;
//   * -1 with the kernel's errno only when nothing was taken; otherwise
//     errno is left as it was;
//   * SIGPIPE only where the kernel would raise it: on a call that sent
//     nothing, without MSG_NOSIGNAL (pieces after the first never raise
//     it, as a call that already copied bytes does not);
//   * blocking sockets block, non-blocking ones stop at EAGAIN;
//   * sendfile consumes no file byte the kernel did not take: it reads
//     with pread from the offset, and moves the offset (the pointer's, or
//     the file's) by what was sent only.
// Every byte counted is passed to `count` as soon as its batch returns, so
// that a long blocking call is seen while it runs.
//
// Hot path: no allocation, bounded stack (a batch of kBatchPieces
// messages), no lock.

#ifndef TRAFFICRATE_SRC_BUDGET_SHAPED_SEND_H_
#define TRAFFICRATE_SRC_BUDGET_SHAPED_SEND_H_

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "src/budget/shaper.h"

namespace trafficrate {

// The real calls the shaper makes: the interposer's table of libc's
// functions (never the interposed ones), or libc's in tests.
struct SendCalls {
  int (*sendmmsg)(int, mmsghdr*, unsigned int, int);
  ssize_t (*sendmsg)(int, const msghdr*, int);
  ssize_t (*pread)(int, void*, size_t, off_t);
  off_t (*lseek)(int, off_t, int);
  ssize_t (*sendfile)(int, int, off_t*, size_t);
};
// libc's.
SendCalls LibcSendCalls();

// Pieces per sendmmsg call, and the iovecs they may span together.
inline constexpr unsigned int kBatchPieces = 32;
inline constexpr int kBatchIovecs = 64;

using SentCounter = absl::FunctionRef<void(size_t bytes)>;

// What a cut call cost: the system calls it made, and the pieces the
// kernel took.
struct ShapeCounts {
  uint32_t syscalls = 0;
  uint32_t pieces = 0;
};

// send/sendto without an address/write/writev/sendmsg without control data
// or address: iov as cut by cursor, with flags (the host's, plus MSG_EOR).
// REQUIRES: cursor.Cut(), cursor made for the iovecs' total.
ssize_t ShapedSendv(const SendCalls& calls, int fd, const iovec* iov,
                    int iovcnt, int flags, PieceCursor& cursor,
                    SentCounter count, ShapeCounts* counts);

// Whether a host call with these flags may be cut: MSG_MORE (the host wants
// its tail to grow), MSG_OOB, MSG_ZEROCOPY and MSG_FASTOPEN go whole.
bool FlagsAllowCut(int flags);

// Buffers that sendfile's bounded copy reads the file into: a few, made
// once (reserved address space; pages committed on first use), each taken
// by one call at a time. A call that finds none free (more threads copying
// at once than there are buffers, or a signal handler re-entering) goes to
// the kernel whole.
class CopyBuffers {
 public:
  static constexpr int kCount = 4;
  static constexpr size_t kBytes = 128 << 10;
  // Null if the mapping fails.
  static CopyBuffers* Create();
  ~CopyBuffers();
  CopyBuffers(const CopyBuffers&) = delete;
  CopyBuffers& operator=(const CopyBuffers&) = delete;
  // A free buffer's index, or -1.
  int Take();
  void Give(int index);
  char* Get(int index) const { return base_ + index * kBytes; }
  // In a forked child: a buffer the parent's other threads held is free.
  void AfterForkChild() { busy_.store(0, std::memory_order_relaxed); }

 private:
  explicit CopyBuffers(char* base) : base_(base) {}
  char* const base_;
  std::atomic<uint32_t> busy_{0};
};

// sendfile(out_fd, in_fd, offset, count) through a bounded copy. Returns
// false, having done nothing (no byte read, no offset moved, errno
// unchanged), when it cannot: no buffer is free, or in_fd cannot be read
// with pread (the caller then makes the real call, which gives the kernel's
// answer). Else true, with the call's result in *result.
// REQUIRES: cursor.Cut(), cursor made for count (capped at kMaxSendfile).
bool ShapedSendfile(const SendCalls& calls, CopyBuffers* buffers, int out_fd,
                    int in_fd, off_t* offset, size_t count, PieceCursor& cursor,
                    SentCounter count_sent, ShapeCounts* counts,
                    ssize_t* result);

// sendfile(out_fd, in_fd, offset, count) whole, as the kernel makes it, but
// in calls of at most `chunk` bytes, each counted as it returns: what the
// host sees is what one call would have given it (the total, stopping at
// the first short call; -1 and errno only if the first call failed; the
// kernel moves the offset).
ssize_t ChunkedSendfile(ssize_t (*real)(int, int, off_t*, size_t), int out_fd,
                        int in_fd, off_t* offset, size_t count, size_t chunk,
                        SentCounter count_sent);

// The most one sendfile call transfers (the kernel's MAX_RW_COUNT).
inline constexpr size_t kMaxSendfile = 0x7ffff000;

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_BUDGET_SHAPED_SEND_H_
