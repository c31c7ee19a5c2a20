// What a TCP socket still has to send, on real loopback connections: a
// client that does not read leaves data queued, a client that reads takes
// it all; a client that closed (FIN or RST) is no longer reading; what is
// not a connected TCP socket is unknown (-1) and not reading. And LeftOf,
// what has left of what was handed.

#include "src/net/send_queue.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "tests/test_util.h"

namespace trafficrate {
namespace {

using testing_util::kWaitNs;
using testing_util::PollUntil;

// A loopback TCP connection: `server` is the accepted end (the one a
// governed host writes to), `client` the peer. Buffers are kept small, so
// that a client that does not read leaves data queued at the server.
class Connection {
 public:
  Connection() {
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (listener_ < 0 ||
        bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) !=
            0 ||
        listen(listener_, 1) != 0 ||
        getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return;
    }
    client_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int small = 16 * 1024;
    // Before connect, so that the window the client offers stays small.
    setsockopt(client_, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    if (client_ < 0 || connect(client_, reinterpret_cast<sockaddr*>(&addr),
                               sizeof(addr)) != 0) {
      return;
    }
    server_ = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (server_ >= 0) {
      setsockopt(server_, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
    }
  }
  ~Connection() {
    for (const int fd : {listener_, client_, server_}) {
      if (fd >= 0) close(fd);
    }
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  bool ok() const { return server_ >= 0 && client_ >= 0; }
  int server() const { return server_; }
  int client() const { return client_; }
  int listener() const { return listener_; }

  // Writes to the server end without blocking until the socket takes no
  // more (bounded); returns the bytes it took.
  uint64_t FillServer() {
    const int flags = fcntl(server_, F_GETFL);
    fcntl(server_, F_SETFL, flags | O_NONBLOCK);
    std::vector<char> chunk(4096, 'x');
    uint64_t total = 0;
    for (int i = 0; i < 10'000; ++i) {
      const ssize_t n = send(server_, chunk.data(), chunk.size(), MSG_NOSIGNAL);
      if (n > 0) {
        total += static_cast<uint64_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      break;  // EAGAIN: full
    }
    fcntl(server_, F_SETFL, flags);
    return total;
  }

  // Reads what the client has (bounded, without blocking long); returns
  // the bytes read.
  uint64_t Drain(uint64_t want) {
    std::vector<char> buf(65536);
    uint64_t got = 0;
    const int64_t deadline = MonotonicNowNs() + kWaitNs;
    for (int i = 0; i < 100'000 && got < want; ++i) {
      if (MonotonicNowNs() > deadline) break;
      pollfd p{client_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = read(client_, buf.data(), buf.size());
      if (n <= 0) break;
      got += static_cast<uint64_t>(n);
    }
    return got;
  }

  // Closes the client end; with `reset`, by RST (unread data, or linger 0).
  void CloseClient(bool reset) {
    if (reset) {
      const linger now{1, 0};
      setsockopt(client_, SOL_SOCKET, SO_LINGER, &now, sizeof(now));
    }
    close(client_);
    client_ = -1;
  }

 private:
  int listener_ = -1;
  int client_ = -1;
  int server_ = -1;
};

// Waits (bounded) until the server end has seen the client's FIN or RST.
bool ServerSawHangUp(int server) {
  pollfd p{server, POLLRDHUP, 0};
  return poll(&p, 1, static_cast<int>(kWaitNs / kNsPerMs)) == 1 &&
         (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

TEST(SendQueueTest, NothingWrittenNothingUnsent) {
  Connection conn;
  ASSERT_TRUE(conn.ok());
  EXPECT_EQ(UnsentBytes(conn.server()), 0);
  EXPECT_EQ(UnsentBytes(conn.client()), 0);
  EXPECT_TRUE(PeerStillReading(conn.server()));
  EXPECT_TRUE(PeerStillReading(conn.client()));
}

TEST(SendQueueTest, AClientThatDoesNotReadLeavesDataUnsent) {
  Connection conn;
  ASSERT_TRUE(conn.ok());
  const uint64_t written = conn.FillServer();
  ASSERT_GT(written, 0u);
  // What the client's window took left; the rest waits for it to read.
  const int64_t unsent = UnsentBytes(conn.server());
  EXPECT_GT(unsent, 0);
  EXPECT_LE(static_cast<uint64_t>(unsent), written);
  EXPECT_LT(static_cast<uint64_t>(unsent), written) << "some left";
  EXPECT_TRUE(PeerStillReading(conn.server())) << "it is connected";
  // It reads everything: nothing is left unsent.
  EXPECT_EQ(conn.Drain(written), written);
  EXPECT_TRUE(PollUntil([&] { return UnsentBytes(conn.server()) == 0; }));
  EXPECT_EQ(UnsentBytes(conn.server()), 0);
}

TEST(SendQueueTest, AClientThatClosedIsNotReading) {
  Connection conn;
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE(PeerStillReading(conn.server()));
  conn.CloseClient(/*reset=*/false);
  ASSERT_TRUE(ServerSawHangUp(conn.server()));
  EXPECT_FALSE(PeerStillReading(conn.server()));
  EXPECT_EQ(UnsentBytes(conn.server()), 0);
}

TEST(SendQueueTest, AClientThatHungUpOnQueuedDataIsNotReading) {
  Connection conn;
  ASSERT_TRUE(conn.ok());
  ASSERT_GT(conn.FillServer(), 0u);
  ASSERT_GT(UnsentBytes(conn.server()), 0);
  // Unread data in its buffer: its close sends a RST.
  conn.CloseClient(/*reset=*/true);
  ASSERT_TRUE(ServerSawHangUp(conn.server()));
  EXPECT_FALSE(PeerStillReading(conn.server()));
}

TEST(SendQueueTest, WhatIsNotAConnectedTcpSocketIsUnknown) {
  Connection conn;
  ASSERT_TRUE(conn.ok());
  EXPECT_EQ(UnsentBytes(conn.listener()), -1) << "listening";
  EXPECT_FALSE(PeerStillReading(conn.listener())) << "listening";
  int pipe_fds[2] = {-1, -1};
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  EXPECT_EQ(UnsentBytes(pipe_fds[1]), -1);
  EXPECT_FALSE(PeerStillReading(pipe_fds[1]));
  const int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(udp, 0);
  EXPECT_FALSE(PeerStillReading(udp));
  int pair[2] = {-1, -1};
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  EXPECT_FALSE(PeerStillReading(pair[0]));
  for (const int fd : {pipe_fds[0], pipe_fds[1], udp, pair[0], pair[1]}) {
    close(fd);
  }
  // Closed fds, and no fd at all.
  EXPECT_EQ(UnsentBytes(pipe_fds[1]), -1);
  EXPECT_FALSE(PeerStillReading(pipe_fds[1]));
  EXPECT_EQ(UnsentBytes(-1), -1);
  EXPECT_FALSE(PeerStillReading(-1));
}

TEST(SendQueueTest, LeftOfIsWhatWasHandedLessWhatIsQueued) {
  EXPECT_EQ(LeftOf(1000, 0), 1000u);
  EXPECT_EQ(LeftOf(1000, 400), 600u);
  EXPECT_EQ(LeftOf(1000, 1000), 0u);
  // More queued than was handed (handed counted from a later start): none.
  EXPECT_EQ(LeftOf(1000, 5000), 0u);
  EXPECT_EQ(LeftOf(0, 0), 0u);
  EXPECT_EQ(LeftOf(UINT64_MAX, 1), UINT64_MAX - 1);
  // An unknown queue (-1) gives nothing: nothing is counted as left.
  EXPECT_EQ(LeftOf(1000, -1), 0u);
}

}  // namespace
}  // namespace trafficrate
