#include "src/budget/shaped_send.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "src/budget/shaper.h"

namespace trafficrate {
namespace {

// Counts of every call below (not checked unless a test says so).
thread_local ShapeCounts counts;

// A connected loopback TCP pair: server (the side that sends) and client.
struct Pair {
  int server = -1;
  int client = -1;
  ~Pair() {
    if (server >= 0) close(server);
    if (client >= 0) close(client);
  }
};

void MakePair(Pair* p, int sndbuf = 0) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
            0);
  ASSERT_EQ(listen(listener, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  p->client = socket(AF_INET, SOCK_STREAM, 0);
  if (sndbuf == 0) {
    const int small = 4096;
    setsockopt(p->client, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  }
  ASSERT_EQ(
      connect(p->client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  p->server = accept(listener, nullptr, nullptr);
  close(listener);
  ASSERT_GE(p->server, 0);
  if (sndbuf != 0) {
    setsockopt(p->server, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
    const int small = 4096;
    setsockopt(p->client, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  }
}

std::string Pattern(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 1103515245u + 12345u;
    s[i] = static_cast<char>(seed >> 16);
  }
  return s;
}

std::string ReadAll(int fd, size_t want) {
  std::string got;
  char buf[65536];
  while (got.size() < want) {  // bounded: the sender sends `want` bytes
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

Shape SlowShape() {
  Shape shape;
  shape.piece = 1000;  // varied sizes come from several calls below
  shape.mss = 1448;
  shape.first_left = kFirstPieces;
  return shape;
}

TEST(ShapedSendvTest, BlockingSocketSendsEveryByteInOrderAndCountsIt) {
  Pair p;
  MakePair(&p);
  const std::string a = Pattern(70000, 1), b = Pattern(33333, 2);
  std::string received;
  std::thread reader(
      [&] { received = ReadAll(p.client, a.size() + b.size()); });
  const iovec iov[] = {{const_cast<char*>(a.data()), a.size()},
                       {nullptr, 0},
                       {const_cast<char*>(b.data()), b.size()}};
  PieceCursor cursor(SlowShape(), a.size() + b.size());
  ASSERT_TRUE(cursor.Cut());
  size_t counted = 0;
  errno = 4321;
  const ssize_t sent = ShapedSendv(
      LibcSendCalls(), p.server, iov, 3, 0, cursor,
      [&](size_t bytes) { counted += bytes; }, &counts);
  EXPECT_EQ(errno, 4321);
  reader.join();
  EXPECT_EQ(sent, static_cast<ssize_t>(a.size() + b.size()));
  EXPECT_EQ(counted, a.size() + b.size());
  EXPECT_EQ(cursor.first_used(), kFirstPieces);
  EXPECT_TRUE(received == a + b);
}

TEST(ShapedSendvTest, ManyIovecsSpanBatches) {
  Pair p;
  MakePair(&p);
  const std::string data = Pattern(300 * 37, 3);
  std::vector<iovec> iov;
  for (size_t off = 0; off < data.size(); off += 37) {
    iov.push_back({const_cast<char*>(data.data()) + off, 37});
  }
  std::string received;
  std::thread reader([&] { received = ReadAll(p.client, data.size()); });
  PieceCursor cursor(SlowShape(), data.size());
  const ssize_t sent = ShapedSendv(
      LibcSendCalls(), p.server, iov.data(), static_cast<int>(iov.size()), 0,
      cursor, [](size_t) {}, &counts);
  reader.join();
  EXPECT_EQ(sent, static_cast<ssize_t>(data.size()));
  EXPECT_TRUE(received == data);
}

TEST(ShapedSendvTest, NonBlockingStopsAtAFullBufferThenEagain) {
  Pair p;
  MakePair(&p, /*sndbuf=*/8192);
  fcntl(p.server, F_SETFL, fcntl(p.server, F_GETFL) | O_NONBLOCK);
  const std::string data = Pattern(4 << 20, 4);
  const iovec one{const_cast<char*>(data.data()), data.size()};
  PieceCursor cursor(SlowShape(), data.size());
  size_t counted = 0;
  errno = 77;
  const ssize_t first = ShapedSendv(
      LibcSendCalls(), p.server, &one, 1, 0, cursor,
      [&](size_t b) { counted += b; }, &counts);
  EXPECT_EQ(errno, 77);  // a partial count leaves errno alone
  ASSERT_GT(first, 0);
  EXPECT_LT(first, static_cast<ssize_t>(data.size()));
  EXPECT_EQ(counted, static_cast<size_t>(first));
  // Nothing more fits: -1, EAGAIN, as the kernel's send says.
  const iovec rest{const_cast<char*>(data.data()) + first,
                   data.size() - static_cast<size_t>(first)};
  PieceCursor again(SlowShape(), rest.iov_len);
  EXPECT_EQ(ShapedSendv(
                LibcSendCalls(), p.server, &rest, 1, 0, again, [](size_t) {},
                &counts),
            -1);
  EXPECT_EQ(errno, EAGAIN);
  // What arrives is exactly what was reported sent.
  fcntl(p.client, F_SETFL, fcntl(p.client, F_GETFL) | O_NONBLOCK);
  std::string got;
  char buf[65536];
  for (int i = 0; i < 2000 && got.size() < static_cast<size_t>(first); ++i) {
    const ssize_t n = read(p.client, buf, sizeof(buf));
    if (n > 0) got.append(buf, static_cast<size_t>(n));
    if (n <= 0) usleep(1000);
  }
  EXPECT_TRUE(got == data.substr(0, static_cast<size_t>(first)));
}

TEST(ShapedSendvTest, BrokenConnectionRaisesSigpipeOnlyAsTheKernelWould) {
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGPIPE);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &block, &old), 0);
  for (const bool nosignal : {false, true}) {
    Pair p;
    MakePair(&p);
    const linger reset{1, 0};
    setsockopt(p.client, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
    close(p.client);
    p.client = -1;
    usleep(20000);
    const std::string data = Pattern(50000, 5);
    const iovec one{const_cast<char*>(data.data()), data.size()};
    PieceCursor cursor(SlowShape(), data.size());
    // The first call after a reset may report ECONNRESET; then EPIPE.
    ssize_t r = 0;
    for (int i = 0; i < 3; ++i) {
      PieceCursor c = cursor;
      r = ShapedSendv(
          LibcSendCalls(), p.server, &one, 1, nosignal ? MSG_NOSIGNAL : 0, c,
          [](size_t) {}, &counts);
      if (r < 0 && errno == EPIPE) break;
    }
    EXPECT_EQ(r, -1);
    EXPECT_EQ(errno, EPIPE);
    sigset_t pending;
    sigpending(&pending);
    EXPECT_EQ(sigismember(&pending, SIGPIPE), nosignal ? 0 : 1) << nosignal;
    if (!nosignal) {
      const timespec zero{0, 0};
      sigtimedwait(&block, nullptr, &zero);  // consume it
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

TEST(FlagsAllowCutTest, FlagsThatMustGoWhole) {
  EXPECT_TRUE(FlagsAllowCut(0));
  EXPECT_TRUE(FlagsAllowCut(MSG_NOSIGNAL | MSG_DONTWAIT));
  EXPECT_FALSE(FlagsAllowCut(MSG_MORE));
  EXPECT_FALSE(FlagsAllowCut(MSG_OOB));
  EXPECT_FALSE(FlagsAllowCut(MSG_ZEROCOPY));
}

class TempFile {
 public:
  explicit TempFile(const std::string& content) {
    char path[] = "/tmp/shaped_send_test.XXXXXX";
    fd_ = mkstemp(path);
    unlink(path);
    EXPECT_EQ(write(fd_, content.data(), content.size()),
              static_cast<ssize_t>(content.size()));
  }
  ~TempFile() { close(fd_); }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

TEST(ShapedSendfileTest, WithAnOffsetPointerTheFilePositionStays) {
  const std::string content = Pattern(500000, 6);
  TempFile file(content);
  lseek(file.fd(), 123, SEEK_SET);
  std::unique_ptr<CopyBuffers> buffers(CopyBuffers::Create());
  ASSERT_NE(buffers, nullptr);
  Pair p;
  MakePair(&p);
  const size_t want = 300000;
  std::string received;
  std::thread reader([&] { received = ReadAll(p.client, want); });
  off_t offset = 1000;
  PieceCursor cursor(SlowShape(), want);
  ssize_t result = 0;
  size_t counted = 0;
  ASSERT_TRUE(ShapedSendfile(
      LibcSendCalls(), buffers.get(), p.server, file.fd(), &offset, want,
      cursor, [&](size_t b) { counted += b; }, &counts, &result));
  reader.join();
  EXPECT_EQ(result, static_cast<ssize_t>(want));
  EXPECT_EQ(counted, want);
  EXPECT_EQ(offset, static_cast<off_t>(1000 + want));
  EXPECT_EQ(lseek(file.fd(), 0, SEEK_CUR), 123);
  EXPECT_TRUE(received == content.substr(1000, want));
}

TEST(ShapedSendfileTest, WithoutOneTheFilePositionMovesBySentBytesOnly) {
  const std::string content = Pattern(3 << 20, 7);
  TempFile file(content);
  lseek(file.fd(), 5, SEEK_SET);
  std::unique_ptr<CopyBuffers> buffers(CopyBuffers::Create());
  Pair p;
  MakePair(&p, /*sndbuf=*/8192);
  fcntl(p.server, F_SETFL, fcntl(p.server, F_GETFL) | O_NONBLOCK);
  // Non-blocking, nobody reading: the socket takes part of the file.
  PieceCursor cursor(SlowShape(), content.size());
  ssize_t result = 0;
  ASSERT_TRUE(ShapedSendfile(
      LibcSendCalls(), buffers.get(), p.server, file.fd(), nullptr,
      content.size(), cursor, [](size_t) {}, &counts, &result));
  ASSERT_GT(result, 0);
  ASSERT_LT(result, static_cast<ssize_t>(content.size()) - 5);
  EXPECT_EQ(lseek(file.fd(), 0, SEEK_CUR), 5 + result);
  // Until EOF, in calls that stop at each full buffer: every byte once.
  fcntl(p.client, F_SETFL, fcntl(p.client, F_GETFL) | O_NONBLOCK);
  std::string got;
  char buf[65536];
  size_t total = static_cast<size_t>(result);
  for (int i = 0; i < 100000 && got.size() < content.size() - 5; ++i) {
    const ssize_t n = read(p.client, buf, sizeof(buf));
    if (n > 0) got.append(buf, static_cast<size_t>(n));
    PieceCursor more(SlowShape(), content.size());
    ssize_t r = 0;
    ASSERT_TRUE(ShapedSendfile(
        LibcSendCalls(), buffers.get(), p.server, file.fd(), nullptr,
        content.size(), more, [](size_t) {}, &counts, &r));
    if (r > 0) total += static_cast<size_t>(r);
    if (r < 0) {
      EXPECT_EQ(errno, EAGAIN);
    }
  }
  EXPECT_EQ(total, content.size() - 5);
  EXPECT_TRUE(got == content.substr(5));
}

TEST(ShapedSendfileTest, AFileOfManyBuffersIsSentWhole) {
  // More reads than a doubling size_t has bits: the read size stops at the
  // buffer's.
  const std::string content = Pattern(12 << 20, 10);
  TempFile file(content);
  std::unique_ptr<CopyBuffers> buffers(CopyBuffers::Create());
  Pair p;
  MakePair(&p);
  std::string received;
  std::thread reader([&] { received = ReadAll(p.client, content.size()); });
  off_t offset = 0;
  Shape fast = SlowShape();
  fast.piece = 60000;
  PieceCursor cursor(fast, content.size());
  ssize_t result = 0;
  ASSERT_TRUE(ShapedSendfile(
      LibcSendCalls(), buffers.get(), p.server, file.fd(), &offset,
      content.size(), cursor, [](size_t) {}, &counts, &result));
  reader.join();
  EXPECT_EQ(result, static_cast<ssize_t>(content.size()));
  EXPECT_EQ(offset, static_cast<off_t>(content.size()));
  EXPECT_TRUE(received == content);
}

TEST(ShapedSendfileTest, FirstPiecesOnlyThenTheKernelsSendfile) {
  // A fast connection's first pieces are copied; the rest is the kernel's
  // zero-copy sendfile, counted in chunks.
  const std::string content = Pattern(3 << 20, 11);
  TempFile file(content);
  std::unique_ptr<CopyBuffers> buffers(CopyBuffers::Create());
  Pair p;
  MakePair(&p);
  std::string received;
  std::thread reader([&] { received = ReadAll(p.client, content.size()); });
  lseek(file.fd(), 0, SEEK_SET);
  Shape shape;
  shape.mss = 1448;
  shape.first_left = kFirstPieces;
  shape.level = 4'000'000;  // chunks of 1 MB
  PieceCursor cursor(shape, content.size());
  ASSERT_TRUE(cursor.FirstOnly());
  ShapeCounts local;
  std::vector<size_t> counted;
  ssize_t result = 0;
  ASSERT_TRUE(ShapedSendfile(
      LibcSendCalls(), buffers.get(), p.server, file.fd(), nullptr,
      content.size(), cursor, [&](size_t b) { counted.push_back(b); }, &local,
      &result));
  reader.join();
  EXPECT_EQ(result, static_cast<ssize_t>(content.size()));
  EXPECT_EQ(lseek(file.fd(), 0, SEEK_CUR), static_cast<off_t>(content.size()));
  EXPECT_EQ(cursor.first_used(), kFirstPieces);
  EXPECT_EQ(local.pieces, kFirstPieces);
  ASSERT_GE(counted.size(), 4u);  // the first pieces' batch, then 1 MB calls
  EXPECT_EQ(counted[0], kFirstPieces * kFirstPieceBytes);
  EXPECT_TRUE(received == content);
}

TEST(ShapedSendfileTest, APipeIsLeftToTheKernelUntouched) {
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  ASSERT_EQ(write(pipefd[1], "abcdef", 6), 6);
  std::unique_ptr<CopyBuffers> buffers(CopyBuffers::Create());
  Pair p;
  MakePair(&p);
  PieceCursor cursor(SlowShape(), 6);
  ssize_t result = 0;
  errno = 55;
  EXPECT_FALSE(ShapedSendfile(
      LibcSendCalls(), buffers.get(), p.server, pipefd[0], nullptr, 6, cursor,
      [](size_t) {}, &counts, &result));
  EXPECT_EQ(errno, 55);
  char buf[8];
  EXPECT_EQ(read(pipefd[0], buf, sizeof(buf)), 6);  // nothing consumed
  close(pipefd[0]);
  close(pipefd[1]);
}

TEST(ChunkedSendfileTest, ALongCallIsCountedChunkByChunk) {
  const std::string content = Pattern(1 << 20, 8);
  TempFile file(content);
  Pair p;
  MakePair(&p);
  std::string received;
  std::thread reader([&] { received = ReadAll(p.client, content.size()); });
  lseek(file.fd(), 0, SEEK_SET);
  std::vector<size_t> counted;
  errno = 99;
  const ssize_t sent =
      ChunkedSendfile(&::sendfile, p.server, file.fd(), nullptr, content.size(),
                      64 << 10, [&](size_t b) { counted.push_back(b); });
  EXPECT_EQ(errno, 99);
  reader.join();
  EXPECT_EQ(sent, static_cast<ssize_t>(content.size()));
  EXPECT_EQ(counted.size(), 16u);  // one count per 64 KiB call
  EXPECT_EQ(lseek(file.fd(), 0, SEEK_CUR), static_cast<off_t>(content.size()));
  EXPECT_TRUE(received == content);
}

TEST(ChunkedSendfileTest, StopsAtTheFirstShortCallAndFailsOnlyFirst) {
  const std::string content = Pattern(4 << 20, 9);
  TempFile file(content);
  Pair p;
  MakePair(&p, /*sndbuf=*/8192);
  fcntl(p.server, F_SETFL, fcntl(p.server, F_GETFL) | O_NONBLOCK);
  off_t offset = 0;
  const ssize_t first =
      ChunkedSendfile(&::sendfile, p.server, file.fd(), &offset, content.size(),
                      64 << 10, [](size_t) {});
  ASSERT_GT(first, 0);
  EXPECT_LT(first, static_cast<ssize_t>(content.size()));
  EXPECT_EQ(offset, first);
  EXPECT_EQ(ChunkedSendfile(&::sendfile, p.server, file.fd(), &offset,
                            content.size(), 64 << 10, [](size_t) {}),
            -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_EQ(offset, first);
}

TEST(CopyBuffersTest, EachBufferOneCallAtATime) {
  std::unique_ptr<CopyBuffers> buffers(CopyBuffers::Create());
  ASSERT_NE(buffers, nullptr);
  std::vector<int> taken;
  for (int i = 0; i < CopyBuffers::kCount; ++i) {
    const int b = buffers->Take();
    ASSERT_GE(b, 0);
    taken.push_back(b);
    buffers->Get(b)[CopyBuffers::kBytes - 1] = 1;  // writable, whole
  }
  EXPECT_EQ(buffers->Take(), -1);
  buffers->Give(taken[1]);
  EXPECT_EQ(buffers->Take(), taken[1]);
  buffers->AfterForkChild();
  EXPECT_GE(buffers->Take(), 0);
}

}  // namespace
}  // namespace trafficrate
