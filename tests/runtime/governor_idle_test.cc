// The Governor on real TCP sockets over loopback and a real zone, without
// LD_PRELOAD (the test plays the interposers; the Governor is driven, see
// governor_fixture.h).
//
// This file: idle expiry in equal mode. A connection that sent nothing for
// TRAFFICRATE_IDLE and has nothing queued leaves its key at the watcher's
// idle pass (ExpireIdle, which the test calls at the times it means), and
// joins again at its next send; a stalled watcher, a queue still leaving
// and a send through a dup put expiry off; a connection written by a
// process that cannot reach the zone joins again at the watcher's look at
// its rest. Budget mode's expiry (in the tick) is in
// governor_budget_test.cc; the live watcher's in governor_live_test.cc.

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "src/runtime/governor.h"
#include "src/runtime/watcher_loop.h"
#include "src/shm/zone.h"
#include "tests/runtime/governor_fixture.h"

namespace trafficrate {
namespace {

using testing_util::Conn;
using testing_util::kLongIdleNs;
using testing_util::kRate;
using testing_util::Outq;
using testing_util::Pacing;
using testing_util::PollUntil;
using testing_util::QueueEmpties;

class GovernorIdleTest : public testing_util::GovernorFixture {
 protected:
  // Shrinks fd's send buffer and sends until it is full (its client reads
  // nothing: its window fills too), as the send interposer does.
  void FillQueue(int fd) {
    const int sndbuf = 16384;
    ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)),
              0);
    gov_->BeforeSend(fd);
    std::vector<char> data(4096, 'q');
    for (int i = 0; i < 10'000; ++i) {
      const ssize_t n =
          ::send(fd, data.data(), data.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0) break;
      gov_->AfterSend(fd, n);
    }
  }
};

// The client reads whatever arrives until the server's send queue is empty
// (bounded: a wait for the kernel).
bool ClientReadsAll(const Conn& conn) {
  return PollUntil([&] {
    char buf[65536];
    while (recv(conn.client, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
    }
    return Outq(conn.server) == 0;
  });
}

TEST_F(GovernorIdleTest, IdleConnectionLeavesAndRejoinsOnItsNextSend) {
  StartGovernor();
  const Conn c1 = Open();
  const Conn c2 = Open();
  ASSERT_GE(c2.server, 0);
  gov_->BeforeSend(c1.server);
  // c2's send stamp must come after c1's.
  Advance(kNsPerMs);
  gov_->BeforeSend(c2.server);
  gov_->ApplyChangedShares();
  ASSERT_EQ(Pacing(c1.server), kRate / 2);
  // Only c1 has been idle for idle_ns at this instant (nothing queued).
  const int64_t last1 = gov_->LastSendNs(c1.server);
  const int64_t last2 = gov_->LastSendNs(c2.server);
  ASSERT_LT(last1, last2);
  ASSERT_EQ(Outq(c1.server), 0);
  gov_->ExpireIdle(last1 + kLongIdleNs);
  EXPECT_EQ(ConnOf(c1.server).active.load(), 0u);
  EXPECT_EQ(ConnOf(c2.server).active.load(), 1u);
  EXPECT_EQ(Active(c1.server), 1u);
  EXPECT_EQ(Refs(c1.server), 2u) << "still registered";
  gov_->ApplyChangedShares();
  EXPECT_EQ(Pacing(c2.server), kRate) << "the sender gets it all";
  // The next send rejoins.
  gov_->BeforeSend(c1.server);
  EXPECT_EQ(ConnOf(c1.server).active.load(), 1u);
  EXPECT_EQ(Active(c1.server), 2u);
  EXPECT_EQ(Pacing(c1.server), kRate / 2);
  gov_->ApplyChangedShares();
  EXPECT_EQ(Pacing(c2.server), kRate / 2);
}

TEST_F(GovernorIdleTest, TimeItsProcessDidNotRunDoesNotMakeAConnectionIdle) {
  StartGovernor();
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  gov_->BeforeSend(c.server);
  int64_t last = gov_->LastSendNs(c.server);
  ASSERT_EQ(Outq(c.server), 0);
  // A watcher that wakes less than a quarter of TRAFFICRATE_IDLE late
  // changes nothing.
  gov_->NoteWatcherLate(kLongIdleNs / 4 - 1, last + kLongIdleNs / 2);
  gov_->ExpireIdle(last + kLongIdleNs);
  EXPECT_EQ(ConnOf(c.server).active.load(), 0u);
  gov_->BeforeSend(c.server);
  ASSERT_EQ(ConnOf(c.server).active.load(), 1u);
  last = gov_->LastSendNs(c.server);
  // One that wakes a whole idle time late or more: its process stopped
  // (SIGSTOP, no CPU) and ran again after the connection's idle time had
  // passed. The server could not write meanwhile, so the connection gets a
  // whole idle time from then.
  const int64_t ran_again = last + kLongIdleNs * 5 / 4;
  gov_->NoteWatcherLate(kLongIdleNs, ran_again);
  gov_->ExpireIdle(ran_again);
  EXPECT_EQ(ConnOf(c.server).active.load(), 1u);
  gov_->ExpireIdle(ran_again + kLongIdleNs - 1);
  EXPECT_EQ(ConnOf(c.server).active.load(), 1u);
  gov_->ExpireIdle(ran_again + kLongIdleNs);
  EXPECT_EQ(ConnOf(c.server).active.load(), 0u);
}

TEST_F(GovernorIdleTest, AShorterStallGivesAConnectionAsLongAgain) {
  StartGovernor();
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  gov_->BeforeSend(c.server);
  const int64_t last = gov_->LastSendNs(c.server);
  ASSERT_EQ(Outq(c.server), 0);
  // Half an idle time late, three quarters of one after the last send:
  // not idle before half an idle time more from then (a watcher late by
  // 50 ms every few ticks only delays expiry by that much).
  const int64_t woke = last + kLongIdleNs * 3 / 4;
  gov_->NoteWatcherLate(kLongIdleNs / 2, woke);
  gov_->ExpireIdle(last + kLongIdleNs);
  EXPECT_EQ(ConnOf(c.server).active.load(), 1u);
  gov_->ExpireIdle(woke + kLongIdleNs / 2 - 1);
  EXPECT_EQ(ConnOf(c.server).active.load(), 1u);
  gov_->ExpireIdle(woke + kLongIdleNs / 2);
  EXPECT_EQ(ConnOf(c.server).active.load(), 0u);
}

TEST_F(GovernorIdleTest, WatcherExpiresAnIdleConnection) {
  constexpr int64_t kIdleNs = 50 * kNsPerMs;
  StartGovernor(kIdleNs);
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  ASSERT_EQ(Send(c.server, 100), 100);
  EXPECT_EQ(ConnOf(c.server).active.load(), 1u);
  const uint32_t key = KeyIndex(c.server);
  // The client reads nothing, but 100 bytes fit its window: once they are
  // acknowledged the queue is empty, and the idle pass after the idle time
  // expires the connection.
  ASSERT_TRUE(QueueEmpties(c.server));
  const int64_t last = gov_->LastSendNs(c.server);
  gov_->ExpireIdle(last + kIdleNs - 1);
  EXPECT_EQ(zone_->keys().slot(key).active.load(), 1u) << "expired early";
  gov_->ExpireIdle(last + kIdleNs);
  EXPECT_EQ(zone_->keys().slot(key).active.load(), 0u);
  EXPECT_EQ(ConnOf(c.server).active.load(), 0u);
  EXPECT_EQ(Refs(c.server), 1u);
  gov_->BeforeSend(c.server);
  EXPECT_EQ(ConnOf(c.server).active.load(), 1u);
  EXPECT_EQ(zone_->keys().slot(key).active.load(), 1u);
}

// A connection whose bytes come from a process that cannot reach the zone
// (a CGI child running as another user writes the body its parent began):
// once it has left its key (nothing queued while the child starts), the
// watcher sees the socket written and joins it again, and its sibling goes
// back to half the rate. One at rest with nothing written stays out.
class GovernorRestTest : public testing_util::GovernorFixture {
 protected:
  static constexpr int64_t kIdleNs = 200 * kNsPerMs;

  // The watcher's duty that looks at connections at rest, then the clock
  // moves on to its next run: the idle pass in equal mode (a quarter of the
  // idle time apart), the budget tick in budget mode (whose visits look at
  // them; the idle pass does nothing there).
  void LookAtRest(ShareMode share) {
    if (share == ShareMode::kEqual) {
      gov_->ExpireIdle(Now());
      Advance(WatcherLoop::IdleTickNs(kIdleNs));
    } else {
      clock_.SetNs(std::max(Now(), gov_->TickBudget(Now())));
    }
  }

  void WrittenElsewhereRejoins(ShareMode share) {
    StartGovernor(kIdleNs);
    zone_->settings().SetShare(share, 0);
    const Conn quiet = Open();
    const Conn cgi = Open();
    const Conn sibling = Open();
    ASSERT_GE(sibling.server, 0);
    ASSERT_EQ(Send(quiet.server), 100);
    ASSERT_EQ(Send(cgi.server), 100);
    const uint32_t key = KeyIndex(cgi.server);
    // Both rest: their bytes acknowledged, the idle time passed.
    ASSERT_TRUE(QueueEmpties(quiet.server));
    ASSERT_TRUE(QueueEmpties(cgi.server));
    Advance(kIdleNs);
    LookAtRest(share);
    ASSERT_EQ(zone_->keys().slot(key).active.load(), 0u);
    // The sibling sends on, through the library; the other two rest.
    ASSERT_EQ(Send(sibling.server), 100);
    ASSERT_EQ(ConnOf(cgi.server).active.load(), 0u);
    if (share == ShareMode::kEqual) {
      ASSERT_EQ(Pacing(sibling.server), kRate);
    }
    // Written behind the library's back, a little at a time, for at most
    // 2 s of the watcher's looks.
    const std::vector<char> data(1000, 'c');
    const int64_t give_up = Now() + 2 * kNsPerSec;
    while (ConnOf(cgi.server).active.load() == 0 && Now() < give_up) {
      ::send(cgi.server, data.data(), data.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      Send(sibling.server);
      LookAtRest(share);
    }
    ASSERT_EQ(ConnOf(cgi.server).active.load(), 1u);
    EXPECT_EQ(zone_->keys().slot(key).active.load(), 2u);
    if (share == ShareMode::kEqual) {
      EXPECT_EQ(Pacing(cgi.server), kRate / 2);
      gov_->ApplyChangedShares();
      EXPECT_EQ(Pacing(sibling.server), kRate / 2);
    }
    EXPECT_EQ(ConnOf(quiet.server).active.load(), 0u) << "nothing written";
  }
};

TEST_F(GovernorRestTest, ConnectionWrittenByAnotherProcessRejoinsInEqualMode) {
  WrittenElsewhereRejoins(ShareMode::kEqual);
}

TEST_F(GovernorRestTest, ConnectionWrittenByAnotherProcessRejoinsInBudgetMode) {
  WrittenElsewhereRejoins(ShareMode::kBudget);
}

TEST_F(GovernorIdleTest, ConnectionWithUnsentDataIsNotExpired) {
  StartGovernor();
  const Conn c = Open("127.0.0.1", /*client_rcvbuf=*/4096);
  ASSERT_GE(c.server, 0);
  // The client does not read: fill its window and our send buffer.
  FillQueue(c.server);
  ASSERT_GT(Outq(c.server), 0);
  gov_->ExpireIdle(Now() + 2 * kLongIdleNs);
  EXPECT_EQ(ConnOf(c.server).active.load(), 1u) << "expired with data queued";
  EXPECT_EQ(Active(c.server), 1u);
  // Once the client has read everything, the same check expires it.
  ASSERT_TRUE(ClientReadsAll(c));
  // Not at once: a connection found with data queued is not looked at again
  // before that data could have left at its pace, at most 8 s later.
  gov_->ExpireIdle(Now() + 2 * kLongIdleNs + kNsPerSec);
  EXPECT_EQ(ConnOf(c.server).active.load(), 0u);
  EXPECT_EQ(Active(c.server), 0u);
}

TEST_F(GovernorIdleTest,
       AQueuedConnectionIsLookedAtAgainSoonerOnceItsPaceRises) {
  StartGovernor();
  constexpr uint64_t kSlowRate = 20'000;
  zone_->settings().SetRate(kSlowRate);
  const Conn a = Open("127.0.0.1", /*client_rcvbuf=*/4096);
  const Conn b = Open("127.0.0.1", /*client_rcvbuf=*/4096);
  ASSERT_GE(a.server, 0);
  ASSERT_GE(b.server, 0);
  // Neither client reads: both have a queue, so neither is idle.
  FillQueue(a.server);
  FillQueue(b.server);
  gov_->ApplyChangedShares();
  ASSERT_EQ(Pacing(a.server), kSlowRate / 2);
  const int queued = Outq(a.server);
  ASSERT_GT(queued, 8192);
  // Found with its queue: not looked at again before that queue can have
  // left at its pace (three quarters of the time it takes).
  const int64_t t = Now() + 2 * kLongIdleNs;
  gov_->ExpireIdle(t);
  ASSERT_EQ(ConnOf(a.server).active.load(), 1u);
  ASSERT_EQ(ConnOf(b.server).active.load(), 1u);
  ASSERT_TRUE(ClientReadsAll(a));
  const int64_t at_full_rate = static_cast<int64_t>(
      0.75 * queued * kNsPerSec / kSlowRate * 1.2);  // with a margin
  gov_->ExpireIdle(t + at_full_rate);
  EXPECT_EQ(ConnOf(a.server).active.load(), 1u) << "looked at too soon";
  // Its sibling closes: its pace doubles, and so the same time is enough.
  CloseServer(b.server);
  gov_->ApplyChangedShares();
  ASSERT_EQ(Pacing(a.server), kSlowRate);
  gov_->ExpireIdle(t + at_full_rate);
  EXPECT_EQ(ConnOf(a.server).active.load(), 0u);
}

// Idleness is a connection's, not an fd's: when a connection has two fds
// (dup, dup2 onto 0/1 as inetd-style servers do) and the host writes through
// only one of them, it must not leave its key (that would make the key's
// membership, and its siblings' shares, flap every idle period).
TEST_F(GovernorIdleTest, ConnectionSendingThroughADupIsNotExpired) {
  StartGovernor();
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  gov_->BeforeSend(c.server);
  const int64_t last_original = gov_->LastSendNs(c.server);
  const int dup_fd = dup(c.server);
  ASSERT_GE(dup_fd, 0);
  gov_->OnDup(c.server, dup_fd);
  // The clock moves on before the host writes through the dup only.
  Advance(kNsPerMs);
  gov_->BeforeSend(dup_fd);
  const int64_t last_dup = gov_->LastSendNs(dup_fd);
  ASSERT_LT(last_original, last_dup);
  EXPECT_EQ(gov_->LastSendNs(c.server), last_dup) << "idle is per connection";
  ASSERT_EQ(Outq(dup_fd), 0);
  // idle_ns after the original's last send, less after the dup's.
  gov_->ExpireIdle(last_original + kLongIdleNs);
  EXPECT_EQ(ConnOf(dup_fd).active.load(), 1u)
      << "a connection written through a dup was expired as idle";
  gov_->OnClose(dup_fd);
  close(dup_fd);
}

}  // namespace
}  // namespace trafficrate
