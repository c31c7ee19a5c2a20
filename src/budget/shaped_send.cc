#include "src/budget/shaped_send.h"

#include <errno.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <unistd.h>

namespace trafficrate {
namespace {

// One sendmmsg batch: the pieces the cursor cuts from the host's iovecs,
// starting at iov[*src] + *src_off, as far as kBatchPieces messages and
// kBatchIovecs iovecs carry.
struct Batch {
  mmsghdr msgs[kBatchPieces];
  iovec vecs[kBatchIovecs];
  size_t sizes[kBatchPieces];
  unsigned int count = 0;
};

// Bytes of iov from (src, src_off) that `slots` more iovecs can carry.
size_t Reach(const iovec* iov, int iovcnt, int src, size_t src_off, int slots) {
  size_t reach = 0;
  for (; src < iovcnt && slots > 0; ++src, src_off = 0) {
    const size_t len = iov[src].iov_len - src_off;
    if (len == 0) continue;
    reach += len;
    --slots;
  }
  return reach;
}

// Fills batch from the host's iovecs, moving (src, src_off) and the cursor
// past what it takes.
void Fill(Batch& batch, const iovec* iov, int iovcnt, int* src, size_t* src_off,
          PieceCursor& cursor) {
  int used = 0;
  batch.count = 0;
  while (batch.count < kBatchPieces) {
    const size_t reach =
        Reach(iov, iovcnt, *src, *src_off, kBatchIovecs - used);
    const size_t piece = cursor.Next(reach);
    if (piece == 0) break;
    mmsghdr& m = batch.msgs[batch.count];
    m = mmsghdr{};
    m.msg_hdr.msg_iov = &batch.vecs[used];
    size_t need = piece;
    while (need > 0) {  // within reach: ends before iovcnt
      const size_t len = iov[*src].iov_len - *src_off;
      if (len == 0) {
        ++*src;
        *src_off = 0;
        continue;
      }
      const size_t take = len < need ? len : need;
      batch.vecs[used].iov_base =
          static_cast<char*>(iov[*src].iov_base) + *src_off;
      batch.vecs[used].iov_len = take;
      ++used;
      ++m.msg_hdr.msg_iovlen;
      need -= take;
      *src_off += take;
      if (*src_off == iov[*src].iov_len) {
        ++*src;
        *src_off = 0;
      }
    }
    batch.sizes[batch.count++] = piece;
  }
}

// Sends all of iov (or until the kernel stops taking it) as the cursor's
// pieces. Returns the bytes taken, or -1 (errno: the kernel's) if it took
// none because of an error; *stopped when it took less than all. earlier:
// bytes the host's call sent before this (sendfile's earlier chunks).
ssize_t SendPieces(const SendCalls& calls, int fd, const iovec* iov, int iovcnt,
                   int flags, PieceCursor& cursor, SentCounter count,
                   size_t earlier, ShapeCounts* counts, bool* stopped) {
  Batch batch;
  int src = 0;
  size_t src_off = 0;
  size_t total = 0;
  *stopped = false;
  // Bounded: each pass takes at least one byte of the host's or returns.
  for (;;) {
    const PieceCursor before = cursor;
    Fill(batch, iov, iovcnt, &src, &src_off, cursor);
    if (batch.count == 0) return static_cast<ssize_t>(total);
    // MSG_NOSIGNAL: a piece after the first must not raise SIGPIPE where
    // the host's one call, having copied bytes already, would not.
    int sent = calls.sendmmsg(fd, batch.msgs, batch.count,
                              flags | MSG_EOR | MSG_NOSIGNAL);
    ++counts->syscalls;
    if (sent < 0 && total == 0 && earlier == 0 && errno == EPIPE &&
        (flags & MSG_NOSIGNAL) == 0) {
      // Nothing went: the host's call would have raised SIGPIPE. The first
      // piece again, with the host's flags, gives it (and the error).
      const ssize_t one =
          calls.sendmsg(fd, &batch.msgs[0].msg_hdr, flags | MSG_EOR);
      ++counts->syscalls;
      if (one >= 0) {
        batch.msgs[0].msg_len = static_cast<unsigned int>(one);
        sent = 1;
      }
    }
    if (sent <= 0) {
      *stopped = true;
      return total > 0 ? static_cast<ssize_t>(total) : -1;
    }
    // Replay on the cursor what the kernel took.
    cursor = before;
    size_t taken = 0;
    bool whole = true;
    for (int i = 0; i < sent; ++i) {
      cursor.Next(batch.sizes[i]);
      taken += batch.msgs[i].msg_len;
      if (batch.msgs[i].msg_len < batch.sizes[i]) {
        whole = false;
        break;
      }
    }
    total += taken;
    counts->pieces += static_cast<uint32_t>(sent);
    if (taken > 0) count(taken);
    if (!whole || static_cast<unsigned int>(sent) < batch.count) {
      *stopped = true;
      return static_cast<ssize_t>(total);
    }
  }
}

}  // namespace

SendCalls LibcSendCalls() {
  return SendCalls{&::sendmmsg, &::sendmsg, &::pread, &::lseek, &::sendfile};
}

bool FlagsAllowCut(int flags) {
  return (flags & (MSG_MORE | MSG_OOB | MSG_ZEROCOPY | MSG_FASTOPEN)) == 0;
}

ssize_t ShapedSendv(const SendCalls& calls, int fd, const iovec* iov,
                    int iovcnt, int flags, PieceCursor& cursor,
                    SentCounter count, ShapeCounts* counts) {
  const int saved_errno = errno;
  bool stopped = false;
  const ssize_t r = SendPieces(calls, fd, iov, iovcnt, flags, cursor, count, 0,
                               counts, &stopped);
  if (r >= 0) errno = saved_errno;
  return r;
}

CopyBuffers* CopyBuffers::Create() {
  void* base = mmap(nullptr, kCount * kBytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return nullptr;
  return new CopyBuffers(static_cast<char*>(base));
}

CopyBuffers::~CopyBuffers() { munmap(base_, kCount * kBytes); }

int CopyBuffers::Take() {
  uint32_t busy = busy_.load(std::memory_order_relaxed);
  for (;;) {  // bounded: each retry saw another thread change the mask
    int free = -1;
    for (int i = 0; i < kCount; ++i) {
      if ((busy & (1u << i)) == 0) {
        free = i;
        break;
      }
    }
    if (free < 0) return -1;
    if (busy_.compare_exchange_weak(busy, busy | (1u << free),
                                    std::memory_order_acquire,
                                    std::memory_order_relaxed)) {
      return free;
    }
  }
}

void CopyBuffers::Give(int index) {
  busy_.fetch_and(~(1u << index), std::memory_order_release);
}

ssize_t ChunkedSendfile(ssize_t (*real)(int, int, off_t*, size_t), int out_fd,
                        int in_fd, off_t* offset, size_t count, size_t chunk,
                        SentCounter count_sent) {
  const int saved_errno = errno;
  if (chunk == 0) chunk = count;
  size_t total = 0;
  // Bounded: each pass sends at least one byte or ends the call.
  while (total < count) {
    const size_t want = count - total < chunk ? count - total : chunk;
    const ssize_t n = real(out_fd, in_fd, offset, want);
    if (n < 0) {
      if (total == 0) return -1;
      break;
    }
    if (n == 0) break;  // end of file
    total += static_cast<size_t>(n);
    count_sent(static_cast<size_t>(n));
    if (static_cast<size_t>(n) < want) break;
  }
  errno = saved_errno;
  return static_cast<ssize_t>(total);
}

bool ShapedSendfile(const SendCalls& calls, CopyBuffers* buffers, int out_fd,
                    int in_fd, off_t* offset, size_t count, PieceCursor& cursor,
                    SentCounter count_sent, ShapeCounts* counts,
                    ssize_t* result) {
  if (buffers == nullptr) return false;
  const int saved_errno = errno;
  const int b = buffers->Take();
  if (b < 0) return false;
  char* const buf = buffers->Get(b);
  off_t start = 0;
  if (offset != nullptr) {
    start = *offset;
  } else {
    start = calls.lseek(in_fd, 0, SEEK_CUR);
    ++counts->syscalls;
  }
  if (start < 0) {
    buffers->Give(b);
    errno = saved_errno;
    return false;
  }
  size_t total = 0;
  int send_errno = 0;
  bool failed = false;
  // The first read is one batch of the smallest pieces (a socket with
  // little room, the usual case of a non-blocking server woken by
  // EPOLLOUT, costs no large read for nothing); each next one doubles, up
  // to the buffer.
  size_t chunk = size_t{kBatchPieces} * kMinPieceBytes;
  // A connection whose level the kernel's packets hold only has its first
  // pieces copied; the rest goes by the kernel's sendfile (below).
  const size_t copied = cursor.FirstOnly() && cursor.FirstBytesLeft() < count
                            ? cursor.FirstBytesLeft()
                            : count;
  bool stopped = false;
  // Bounded: each pass sends at least one byte or ends the call.
  for (bool first = true; total < copied; first = false) {
    size_t want = copied - total < chunk ? copied - total : chunk;
    if (want > CopyBuffers::kBytes) want = CopyBuffers::kBytes;
    if (chunk < CopyBuffers::kBytes) chunk *= 2;
    const ssize_t n =
        calls.pread(in_fd, buf, want, start + static_cast<off_t>(total));
    ++counts->syscalls;
    if (n < 0 && first) {
      // Not a file pread reads (a pipe, O_DIRECT): the kernel's sendfile
      // says what it makes of it.
      buffers->Give(b);
      errno = saved_errno;
      return false;
    }
    if (n <= 0) break;  // end of file, or a read error after some bytes
    const iovec chunk{buf, static_cast<size_t>(n)};
    const ssize_t sent = SendPieces(calls, out_fd, &chunk, 1, 0, cursor,
                                    count_sent, total, counts, &stopped);
    if (sent < 0) {
      send_errno = errno;
      failed = total == 0;
      break;
    }
    total += static_cast<size_t>(sent);
    if (stopped) break;
  }
  if (!stopped && !failed && total == copied && copied < count) {
    // The rest, zero-copy, in calls counted as they go.
    off_t at = start + static_cast<off_t>(total);
    const ssize_t rest =
        ChunkedSendfile(calls.sendfile, out_fd, in_fd, &at, count - total,
                        ChunkBytes(cursor.shape().level), count_sent);
    ++counts->syscalls;
    if (rest > 0) total += static_cast<size_t>(rest);
  }
  if (total > 0) {
    const off_t end = start + static_cast<off_t>(total);
    if (offset != nullptr) {
      *offset = end;
    } else {
      calls.lseek(in_fd, end, SEEK_SET);
      ++counts->syscalls;
    }
  }
  buffers->Give(b);
  if (failed) {
    errno = send_errno;
    *result = -1;
  } else {
    errno = saved_errno;
    *result = static_cast<ssize_t>(total);
  }
  return true;
}

}  // namespace trafficrate
