// The Governor on real TCP sockets over loopback and a real zone, without
// LD_PRELOAD (the test plays the interposers; the Governor is driven, see
// governor_fixture.h).
//
// This file: budget mode's connections closed with data still queued. The
// Governor keeps such a socket open through a private duplicate until the
// kernel has sent what is queued, so that the key's level still reaches it;
// the duplicate is taken out of the host's epoll sets, given up when the
// host runs out of fds or forks, and never used once the host closes its
// number. The kernel sends the queue in real time (the client's reads wait
// for it); what the watcher does about the drain (measure it, pace it,
// close the kept fd, end the modelled drain) the test does, with the
// watcher's duty: the budget tick, or the drains alone in equal mode.

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "src/budget/budget.h"
#include "src/runtime/governor.h"
#include "src/shm/zone.h"
#include "tests/runtime/governor_fixture.h"

namespace trafficrate {
namespace {

using testing_util::Conn;
using testing_util::Pacing;
using testing_util::PollUntil;
using testing_util::QueueEmpties;
using testing_util::WaitChild;

// Slow enough that what the test queues takes a while to leave.
constexpr uint64_t kSlowRate = 100'000;  // bytes/s
constexpr size_t kQueued = 150'000;      // 1.5 s at kSlowRate
constexpr int kMss = 1448;               // a 1500-byte path's

ino_t InodeOf(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

// The fd of this process on the socket with inode `ino`, -1 if none.
int FdOfInode(ino_t ino) {
  for (int fd = 0; fd < testing_util::kTableSize; ++fd) {
    struct stat st {};
    if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == ino) {
      return fd;
    }
  }
  return -1;
}

struct Received {
  size_t bytes = 0;
  bool eof = false;
  bool reset = false;
};

// Reads fd until EOF or an error, or until it got `want` bytes, at most
// timeout_ns: a wait for the kernel, which sends at the socket's pace.
Received ReadAll(int fd, size_t want = SIZE_MAX,
                 int64_t timeout_ns = 10 * kNsPerSec) {
  Received got;
  std::vector<char> buf(65536);
  PollUntil(
      [&] {
        for (int i = 0; i < 1000 && got.bytes < want; ++i) {
          const ssize_t n = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
          if (n > 0) {
            got.bytes += static_cast<size_t>(n);
            continue;
          }
          if (n == 0) got.eof = true;
          if (n < 0 && errno != EAGAIN) got.reset = true;
          break;
        }
        return got.eof || got.reset || got.bytes >= want;
      },
      timeout_ns);
  return got;
}

class GovernorDrainTest : public testing_util::GovernorFixture {
 protected:
  void SetUp() override {
    GovernorFixture::SetUp();
    StartGovernor();
    zone_->settings().SetShare(ShareMode::kBudget, 0);
    zone_->settings().SetRate(kSlowRate);
  }

  // An accepted connection with kQueued bytes handed to its socket (a send
  // buffer big enough for them), not yet sent.
  Conn Queued(size_t bytes = kQueued) {
    Conn c = Open("127.0.0.1", 0, kMss);
    const int sndbuf = 1 << 20;
    setsockopt(c.server, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
    EXPECT_EQ(Send(c.server, bytes), static_cast<ssize_t>(bytes));
    return c;
  }

  // Queued(), then closed as the host does: the host's (now closed) fd
  // number, the socket's inode, and the fd the Governor keeps it open with
  // (-1 if none).
  struct Closed {
    Conn conn;
    int fd = -1;
    ino_t ino = 0;
    int kept = -1;
  };
  Closed QueuedAndClosed() {
    Closed closed;
    closed.conn = Queued();
    closed.fd = closed.conn.server;
    closed.ino = InodeOf(closed.fd);
    CloseServer(closed.fd);
    closed.kept = FdOfInode(closed.ino);
    return closed;
  }

  // The budget tick, now, and the clock moves on to the next it asks for.
  void Tick() { clock_.SetNs(std::max(Now(), gov_->TickBudget(Now()))); }

  // The client reads what the kernel sends of the kept socket (at its
  // pace): every byte queued, and no end of the stream while the kept fd
  // holds the socket open. Once all is sent, `pass` (the watcher's duty,
  // which moves the clock on) closes the kept fd, and the end follows.
  // Returns what the client got in all.
  template <typename Pass>
  Received ReadThroughTheDrain(const Closed& k, Pass pass) {
    Received got = ReadAll(k.conn.client, kQueued);
    EXPECT_EQ(got.bytes, kQueued);
    EXPECT_FALSE(got.eof || got.reset) << "ended before the kept fd closed";
    EXPECT_TRUE(QueueEmpties(k.kept));
    for (int i = 0; i < 100 && FdOfInode(k.ino) >= 0; ++i) pass();
    EXPECT_LT(FdOfInode(k.ino), 0) << "the watcher kept it open";
    const Received end = ReadAll(k.conn.client);
    got.bytes += end.bytes;
    got.eof = end.eof;
    got.reset = end.reset;
    return got;
  }
};

TEST_F(GovernorDrainTest, ClosedSocketStaysOpenUntilItsQueueHasLeft) {
  const Closed k = QueuedAndClosed();
  ASSERT_GE(k.kept, 0) << "no fd keeps the closed socket open";
  EXPECT_NE(k.kept, k.fd);
  EXPECT_EQ(fcntl(k.kept, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  // Still its key's: counted, and paced at the level.
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(Pacing(k.kept), kSlowRate);
  // The client gets every byte and then the end of the stream: the kept fd
  // is closed once the queue is empty (the tick measures it so), and the FIN
  // follows the data.
  const Received got = ReadThroughTheDrain(k, [&] { Tick(); });
  EXPECT_EQ(got.bytes, kQueued);
  EXPECT_TRUE(got.eof);
  EXPECT_FALSE(got.reset);
  EXPECT_LT(FdOfInode(k.ino), 0);
  EXPECT_EQ(ConnsUsed(), 0u);
}

TEST_F(GovernorDrainTest, KeptSocketTakesALevelChange) {
  const Closed k = QueuedAndClosed();
  ASSERT_GE(k.kept, 0);
  // An orphaned socket would send the rest at the old rate for good.
  zone_->settings().SetRate(4 * kSlowRate);
  EXPECT_TRUE(TickBudgetUntil([&] { return Pacing(k.kept) == 4 * kSlowRate; },
                              kNsPerSec))
      << Pacing(k.kept);
  const Received got = ReadThroughTheDrain(k, [&] { Tick(); });
  EXPECT_EQ(got.bytes, kQueued);
  EXPECT_TRUE(got.eof);
}

TEST_F(GovernorDrainTest, DrainEndsAfterAnotherProcessSwitchesToEqualShares) {
  const Closed k = QueuedAndClosed();
  ASSERT_GE(k.kept, 0);
  // Another process of the zone starts with TRAFFICRATE_SHARE=equal: the
  // budget's ticks stop (the watcher runs FinishDrains instead), but the
  // kept socket is still closed once sent, and the connection leaves its
  // key.
  zone_->settings().SetShare(ShareMode::kEqual, 0);
  ASSERT_FALSE(gov_->BudgetWanted());
  const Received got = ReadThroughTheDrain(k, [&] {
    Advance(kBudgetTickNs);
    gov_->FinishDrains(Now());
  });
  EXPECT_EQ(got.bytes, kQueued);
  EXPECT_TRUE(got.eof);
  EXPECT_LT(FdOfInode(k.ino), 0);
  EXPECT_EQ(ConnsUsed(), 0u);
}

TEST_F(GovernorDrainTest, KeptSocketIsTakenOutOfTheHostsEpollSets) {
  Conn c = Queued();
  const int known = epoll_create1(EPOLL_CLOEXEC);
  const int unknown = epoll_create1(EPOLL_CLOEXEC);
  ASSERT_GE(known, 0);
  ASSERT_GE(unknown, 0);
  gov_->OnEpollCreate(known);  // as the epoll_create1 interposer does
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLET;
  ev.data.u64 = 42;
  ASSERT_EQ(epoll_ctl(known, EPOLL_CTL_ADD, c.server, &ev), 0);
  ASSERT_EQ(epoll_ctl(unknown, EPOLL_CTL_ADD, c.server, &ev), 0);
  const ino_t ino = InodeOf(c.server);
  CloseServer(c.server);
  ASSERT_GE(FdOfInode(ino), 0);
  // The client writes to the closed socket. An epoll set the socket was
  // not taken out of reports it, for an fd the host has closed (epoll(7):
  // a registration lives as long as the open file); the host's does not.
  ASSERT_EQ(send(c.client, "x", 1, MSG_NOSIGNAL), 1);
  epoll_event out{};
  EXPECT_EQ(epoll_wait(unknown, &out, 1, 2000), 1);
  EXPECT_EQ(out.data.u64, 42u);
  EXPECT_EQ(epoll_wait(known, &out, 1, 200), 0);
  close(known);
  close(unknown);
}

TEST_F(GovernorDrainTest, HostClosingTheKeptFdNumberStopsItsUse) {
  const Closed k = QueuedAndClosed();
  ASSERT_GE(k.kept, 0);
  // A host that closes every fd number, then reuses this one for a pipe.
  gov_->OnClose(k.kept);
  close(k.kept);
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  ASSERT_EQ(fcntl(pipefd[0], F_DUPFD, k.kept), k.kept);
  // The socket drains as an orphan (modelled: over once its queue's time at
  // the pace has passed on the watcher's clock), and the watcher leaves the
  // pipe alone: it is still open once the drain is over.
  const Received got = ReadAll(k.conn.client);
  EXPECT_EQ(got.bytes, kQueued);
  EXPECT_TRUE(TickBudgetUntil([&] { return ConnsUsed() == 0; }));
  struct stat st {};
  ASSERT_EQ(fstat(k.kept, &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  close(k.kept);
  close(pipefd[0]);
  close(pipefd[1]);
}

TEST_F(GovernorDrainTest, LingeringOrUnreadSocketIsClosedAsTheHostAsked) {
  // SO_LINGER: the host's close waits for (or resets) the connection.
  Conn lingering = Queued(10'000);
  const linger lg{1, 5};
  ASSERT_EQ(
      setsockopt(lingering.server, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
  const ino_t lingering_ino = InodeOf(lingering.server);
  CloseServer(lingering.server);
  EXPECT_LT(FdOfInode(lingering_ino), 0);
  // Data the host never read: its close resets the connection.
  Conn unread = Open();
  ASSERT_EQ(send(unread.client, "request", 7, MSG_NOSIGNAL), 7);
  ASSERT_TRUE(PollUntil([&] {
    int n = 0;
    return ioctl(unread.server, FIONREAD, &n) == 0 && n == 7;
  }));
  const int sndbuf = 1 << 20;
  setsockopt(unread.server, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
  ASSERT_EQ(Send(unread.server, kQueued), static_cast<ssize_t>(kQueued));
  const ino_t unread_ino = InodeOf(unread.server);
  CloseServer(unread.server);
  EXPECT_LT(FdOfInode(unread_ino), 0);
  EXPECT_TRUE(ReadAll(unread.client).reset);
}

TEST_F(GovernorDrainTest, KeptFdsAreGivenBackWhenTheHostRunsOutOfFds) {
  const Closed k = QueuedAndClosed();
  ASSERT_GE(k.kept, 0);
  EXPECT_EQ(gov_->ReleaseKeptDrains(), 1);
  EXPECT_LT(FdOfInode(k.ino), 0);
  EXPECT_EQ(gov_->ReleaseKeptDrains(), 0);
  // The kernel sends the rest on its own, as it would have without us; the
  // drain, modelled from then on, ends on the watcher's clock.
  const Received got = ReadAll(k.conn.client);
  EXPECT_EQ(got.bytes, kQueued);
  EXPECT_TRUE(got.eof);
  EXPECT_TRUE(TickBudgetUntil([&] { return ConnsUsed() == 0; }));
}

TEST_F(GovernorDrainTest, ForkedChildDoesNotHoldKeptSockets) {
  const Closed k = QueuedAndClosed();
  ASSERT_GE(k.kept, 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    gov_->AfterForkChild();  // as the library's atfork handler does
    _exit(FdOfInode(k.ino) < 0 ? 0 : 1);
  }
  EXPECT_EQ(WaitChild(pid), 0) << "the child still holds the kept socket";
  EXPECT_GE(FdOfInode(k.ino), 0);
}

}  // namespace
}  // namespace trafficrate
