// The Governor on real TCP sockets over loopback and a real zone, without
// LD_PRELOAD: the test plays the interposers, calling OnAccept after
// ::accept, BeforeSend/AfterSend around ::send and OnClose before ::close,
// and reads back the pacing with getsockopt(SO_MAX_PACING_RATE).
//
// This file: registration on accept, joining on the first send, shares per
// key, idle expiry, dup'ed and reused fd numbers, rate changes, a full
// zone, and the accept rules (TRAFFICRATE_PORTS, TRAFFICRATE_EXEMPT) and
// TRAFFICRATE_AFTER. Forked children, reaping and threads are in
// governor_fork_test.cc; the fixture is in test_util.h.

#include "src/runtime/governor.h"

#include <arpa/inet.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "src/budget/budget.h"
#include "src/config/config.h"
#include "src/config/rules.h"
#include "src/shm/zone.h"
#include "tests/runtime/governor_fixture.h"

namespace trafficrate {
namespace {

using testing_util::Conn;
using testing_util::kLongIdleNs;
using testing_util::kRate;
using testing_util::Pacing;
using testing_util::PollUntil;

using testing_util::kNotPaced;
using testing_util::Outq;

using GovernorTest = testing_util::GovernorFixture;

TEST_F(GovernorTest, AcceptedSocketRegistersWithoutJoining) {
  StartGovernor();
  const Conn c = Open("127.0.0.2");
  ASSERT_GE(c.server, 0);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(KeysUsed(), 1u);
  ASSERT_NE(ConnIndex(c.server), kNoSlot);
  EXPECT_EQ(Refs(c.server), 1u);
  EXPECT_EQ(Active(c.server), 0u);
  const ConnSlotShm& slot = ConnOf(c.server);
  EXPECT_EQ(slot.active.load(), 0u);
  EXPECT_EQ(slot.fd.load(), c.server);
  EXPECT_NE(gov_->proc_index(), kNoSlot);
  EXPECT_EQ(slot.proc_index.load(), gov_->proc_index());
  EXPECT_EQ(zone_->procs().slot(gov_->proc_index()).pid.load(), getpid());
  const uint8_t mapped[16] = {0, 0, 0,    0,    0,   0, 0, 0,
                              0, 0, 0xff, 0xff, 127, 0, 0, 2};
  EXPECT_EQ(std::memcmp(slot.peer, mapped, 16), 0);
  sockaddr_in client{};
  socklen_t len = sizeof(client);
  ASSERT_EQ(getsockname(c.client, reinterpret_cast<sockaddr*>(&client), &len),
            0);
  EXPECT_EQ(slot.peer_port, ntohs(client.sin_port));
  EXPECT_EQ(table_->high_water(), c.server + 1);
  EXPECT_EQ(Pacing(c.server), kNotPaced) << "nothing applied before a send";
}

TEST_F(GovernorTest, AcceptWithoutPeerAddressAsksTheKernel) {
  StartGovernor();
  const Conn c = Open("127.0.0.3");
  ASSERT_GE(c.server, 0);
  // Replay the accept as if the host passed no address buffer.
  gov_->OnClose(c.server);
  EXPECT_EQ(ConnsUsed(), 0u);
  gov_->OnAccept(c.server, nullptr, 0);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(ConnOf(c.server).peer[15], 3);
}

TEST_F(GovernorTest, NonInetSocketsAreNotGoverned) {
  StartGovernor();
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  gov_->OnAccept(pair[0], nullptr, 0);
  EXPECT_EQ(table_->Get(pair[0])->state.load(), 0u);
  const int udp = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(udp, 0);
  gov_->OnAccept(udp, nullptr, 0);
  EXPECT_EQ(table_->Get(udp)->state.load(), 0u);
  gov_->BeforeSend(pair[0]);
  EXPECT_EQ(ConnsUsed(), 0u);
  close(udp);
  close(pair[0]);
  close(pair[1]);
}

TEST_F(GovernorTest, FirstSendJoinsAndAppliesTheWholeRate) {
  StartGovernor();
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  const uint32_t generation =
      zone_->keys().slot(KeyIndex(c.server)).generation.load();
  EXPECT_EQ(Send(c.server, 1000), 1000);
  EXPECT_EQ(Active(c.server), 1u);
  EXPECT_EQ(ConnOf(c.server).active.load(), 1u);
  EXPECT_NE(zone_->keys().slot(KeyIndex(c.server)).generation.load(),
            generation);
  EXPECT_EQ(Pacing(c.server), kRate);
  EXPECT_EQ(ConnOf(c.server).share_bytes_per_sec.load(), kRate);
  EXPECT_EQ(ConnOf(c.server).bytes_sent.load(), 1000u);
  // Further sends change nothing but the byte count.
  EXPECT_EQ(Send(c.server, 500), 500);
  EXPECT_EQ(Active(c.server), 1u);
  EXPECT_EQ(Refs(c.server), 1u);
  EXPECT_EQ(ConnOf(c.server).bytes_sent.load(), 1500u);
}

TEST_F(GovernorTest, BeforeSendGivesTheShaperItsShape) {
  StartGovernor();
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  // A fresh connection at a low level: pieces for its level, its first
  // pieces still to go, its MSS read once.
  const Shape shape = gov_->BeforeSend(c.server);
  ASSERT_LT(kRate, kShapeBelowBytesPerSec);
  EXPECT_EQ(
      shape.piece,
      PieceBytes(kRate,
                 VaryIndex(StateConn(table_->Get(c.server)->state.load()))));
  EXPECT_EQ(shape.first_left, kFirstPieces);
  EXPECT_GT(shape.mss, 0u);
  gov_->UsedFirstPieces(c.server, 4);
  EXPECT_EQ(gov_->BeforeSend(c.server).first_left, kFirstPieces - 4);
  gov_->UsedFirstPieces(c.server, 100);
  EXPECT_EQ(gov_->BeforeSend(c.server).first_left, 0u);
  // A second connection halves the level: the piece follows the pacing.
  const Conn c2 = Open();
  ASSERT_GE(c2.server, 0);
  const Shape half = gov_->BeforeSend(c2.server);
  EXPECT_EQ(
      half.piece,
      PieceBytes(kRate / 2,
                 VaryIndex(StateConn(table_->Get(c2.server)->state.load()))));
}

TEST_F(GovernorTest, ShaperOffGivesNoShape) {
  GovernorOptions options;
  options.idle_ns = kLongIdleNs;
  options.shape = false;
  StartGovernor(options);
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  EXPECT_FALSE(gov_->BeforeSend(c.server).Active());
  EXPECT_EQ(Pacing(c.server), kRate);
  EXPECT_EQ(gov_->copy_buffers(), nullptr);
}

TEST_F(GovernorTest, SecondConnectionFromTheSameAddressHalvesBoth) {
  StartGovernor();
  const Conn c1 = Open();
  const Conn c2 = Open();
  ASSERT_GE(c2.server, 0);
  gov_->BeforeSend(c1.server);
  EXPECT_EQ(Pacing(c1.server), kRate);
  gov_->BeforeSend(c2.server);
  EXPECT_EQ(KeysUsed(), 1u);
  EXPECT_EQ(KeyIndex(c1.server), KeyIndex(c2.server));
  EXPECT_EQ(Refs(c1.server), 2u);
  EXPECT_EQ(Active(c1.server), 2u);
  EXPECT_EQ(Pacing(c2.server), kRate / 2) << "applied by the joiner";
  // c1 sends nothing more: the watcher pushes its new share.
  EXPECT_TRUE(PacingBecomes(c1.server, kRate / 2)) << Pacing(c1.server);
  EXPECT_EQ(ConnOf(c1.server).share_bytes_per_sec.load(), kRate / 2);
}

TEST_F(GovernorTest, DifferentClientAddressesGetSeparateKeys) {
  StartGovernor();
  const Conn a = Open("127.0.0.2");
  const Conn b = Open("127.0.0.3");
  ASSERT_GE(b.server, 0);
  gov_->BeforeSend(a.server);
  gov_->BeforeSend(b.server);
  EXPECT_EQ(KeysUsed(), 2u);
  EXPECT_NE(KeyIndex(a.server), KeyIndex(b.server));
  EXPECT_EQ(Active(a.server), 1u);
  EXPECT_EQ(Active(b.server), 1u);
  EXPECT_EQ(Pacing(a.server), kRate);
  EXPECT_EQ(Pacing(b.server), kRate);
  // A second connection from .2 halves .2 only.
  const Conn a2 = Open("127.0.0.2");
  gov_->BeforeSend(a2.server);
  EXPECT_EQ(Pacing(a2.server), kRate / 2);
  EXPECT_TRUE(PacingBecomes(a.server, kRate / 2));
  EXPECT_EQ(Pacing(b.server), kRate);
  EXPECT_EQ(KeysUsed(), 2u);
}

TEST_F(GovernorTest, KeyModeAllPutsEveryClientInOneKey) {
  StartGovernor(kLongIdleNs, KeyMode::kAll);
  const Conn a = Open("127.0.0.2");
  const Conn b = Open("127.0.0.3");
  ASSERT_GE(b.server, 0);
  gov_->BeforeSend(a.server);
  gov_->BeforeSend(b.server);
  EXPECT_EQ(KeysUsed(), 1u);
  EXPECT_EQ(Active(a.server), 2u);
  EXPECT_EQ(Pacing(b.server), kRate / 2);
  EXPECT_TRUE(PacingBecomes(a.server, kRate / 2));
}

TEST_F(GovernorTest, ClosingOneConnectionGivesTheSiblingTheWholeRate) {
  StartGovernor();
  const Conn c1 = Open();
  const Conn c2 = Open();
  ASSERT_GE(c2.server, 0);
  gov_->BeforeSend(c1.server);
  gov_->BeforeSend(c2.server);
  ASSERT_TRUE(PacingBecomes(c1.server, kRate / 2));
  const uint32_t key = KeyIndex(c1.server);
  CloseKept(c2.server);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(zone_->keys().slot(key).active.load(), 1u);
  EXPECT_EQ(Refs(c1.server), 1u);
  EXPECT_TRUE(PacingBecomes(c1.server, kRate)) << Pacing(c1.server);
  CloseKept(c1.server);
  EXPECT_EQ(ConnsUsed(), 0u);
  EXPECT_EQ(KeysUsed(), 0u);
}

TEST_F(GovernorTest, IdleConnectionLeavesAndRejoinsOnItsNextSend) {
  StartGovernor();
  const Conn c1 = Open();
  const Conn c2 = Open();
  ASSERT_GE(c2.server, 0);
  gov_->BeforeSend(c1.server);
  // Send stamps are a kernel tick's (CoarseMonotonicNowNs): c2's must come
  // after c1's.
  testing_util::WaitForCoarseTick(gov_->LastSendNs(c1.server));
  gov_->BeforeSend(c2.server);
  ASSERT_TRUE(PacingBecomes(c1.server, kRate / 2));
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
  EXPECT_TRUE(PacingBecomes(c2.server, kRate)) << "the sender gets it all";
  // The next send rejoins.
  gov_->BeforeSend(c1.server);
  EXPECT_EQ(ConnOf(c1.server).active.load(), 1u);
  EXPECT_EQ(Active(c1.server), 2u);
  EXPECT_EQ(Pacing(c1.server), kRate / 2);
  EXPECT_TRUE(PacingBecomes(c2.server, kRate / 2));
}

TEST_F(GovernorTest, TimeItsProcessDidNotRunDoesNotMakeAConnectionIdle) {
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

TEST_F(GovernorTest, AShorterStallGivesAConnectionAsLongAgain) {
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

TEST_F(GovernorTest, WatcherExpiresAnIdleConnection) {
  StartGovernor(/*idle_ns=*/50 * kNsPerMs);
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  ASSERT_EQ(Send(c.server, 100), 100);
  EXPECT_EQ(ConnOf(c.server).active.load(), 1u);
  const uint32_t key = KeyIndex(c.server);
  // The client reads nothing, but 100 bytes fit its window: once they are
  // acknowledged the queue is empty and the watcher expires the connection.
  EXPECT_TRUE(
      PollUntil([&] { return zone_->keys().slot(key).active.load() == 0; }));
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
  void WrittenElsewhereRejoins(ShareMode share) {
    StartGovernor(/*idle_ns=*/200 * kNsPerMs);
    zone_->settings().SetShare(share, 0);
    const Conn quiet = Open();
    const Conn cgi = Open();
    const Conn sibling = Open();
    ASSERT_GE(sibling.server, 0);
    ASSERT_EQ(Send(quiet.server), 100);
    ASSERT_EQ(Send(cgi.server), 100);
    const uint32_t key = KeyIndex(cgi.server);
    ASSERT_TRUE(
        PollUntil([&] { return zone_->keys().slot(key).active.load() == 0; }));
    // The sibling sends on, through the library; the other two rest.
    ASSERT_EQ(Send(sibling.server), 100);
    ASSERT_EQ(ConnOf(cgi.server).active.load(), 0u);
    if (share == ShareMode::kEqual) {
      ASSERT_TRUE(PacingBecomes(sibling.server, kRate));
    }
    // Written behind the library's back, a little at a time.
    const std::vector<char> data(1000, 'c');
    const auto rejoined = [&] {
      ::send(cgi.server, data.data(), data.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      Send(sibling.server);
      return ConnOf(cgi.server).active.load() == 1;
    };
    ASSERT_TRUE(PollUntil(rejoined, 2 * kNsPerSec));
    EXPECT_EQ(zone_->keys().slot(key).active.load(), 2u);
    if (share == ShareMode::kEqual) {
      EXPECT_EQ(Pacing(cgi.server), kRate / 2);
      EXPECT_TRUE(PacingBecomes(sibling.server, kRate / 2));
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

TEST_F(GovernorTest, ConnectionWithUnsentDataIsNotExpired) {
  StartGovernor();
  const Conn c = Open("127.0.0.1", /*client_rcvbuf=*/4096);
  ASSERT_GE(c.server, 0);
  const int sndbuf = 16384;
  ASSERT_EQ(
      setsockopt(c.server, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)), 0);
  // The client does not read: fill its window and our send buffer.
  gov_->BeforeSend(c.server);
  std::vector<char> data(4096, 'q');
  for (int i = 0; i < 10'000; ++i) {
    const ssize_t n =
        ::send(c.server, data.data(), data.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) break;
    gov_->AfterSend(c.server, n);
  }
  ASSERT_GT(Outq(c.server), 0);
  gov_->ExpireIdle(MonotonicNowNs() + 2 * kLongIdleNs);
  EXPECT_EQ(ConnOf(c.server).active.load(), 1u) << "expired with data queued";
  EXPECT_EQ(Active(c.server), 1u);
  // Once the client has read everything, the same check expires it.
  const bool drained = PollUntil([&] {
    char buf[65536];
    while (recv(c.client, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
    }
    return Outq(c.server) == 0;
  });
  ASSERT_TRUE(drained);
  // Not at once: a connection found with data queued is not looked at again
  // before that data could have left at its pace, at most 8 s later.
  gov_->ExpireIdle(MonotonicNowNs() + 2 * kLongIdleNs + kNsPerSec);
  EXPECT_EQ(ConnOf(c.server).active.load(), 0u);
  EXPECT_EQ(Active(c.server), 0u);
}

TEST_F(GovernorTest, AQueuedConnectionIsLookedAtAgainSoonerOnceItsPaceRises) {
  StartGovernor();
  constexpr uint64_t kSlowRate = 20'000;
  zone_->settings().SetRate(kSlowRate);
  const Conn a = Open("127.0.0.1", /*client_rcvbuf=*/4096);
  const Conn b = Open("127.0.0.1", /*client_rcvbuf=*/4096);
  ASSERT_GE(a.server, 0);
  ASSERT_GE(b.server, 0);
  // Neither client reads: both have a queue, so neither is idle.
  for (const int fd : {a.server, b.server}) {
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
  gov_->ApplyChangedShares();
  ASSERT_EQ(Pacing(a.server), kSlowRate / 2);
  const int queued = Outq(a.server);
  ASSERT_GT(queued, 8192);
  // Found with its queue: not looked at again before that queue can have
  // left at its pace (three quarters of the time it takes).
  const int64_t t = MonotonicNowNs() + 2 * kLongIdleNs;
  gov_->ExpireIdle(t);
  ASSERT_EQ(ConnOf(a.server).active.load(), 1u);
  ASSERT_EQ(ConnOf(b.server).active.load(), 1u);
  ASSERT_TRUE(PollUntil([&] {
    char buf[65536];
    while (recv(a.client, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
    }
    return Outq(a.server) == 0;
  }));
  const int64_t at_full_rate = static_cast<int64_t>(
      0.75 * queued * kNsPerSec / kSlowRate * 1.2);  // with a margin
  gov_->ExpireIdle(t + at_full_rate);
  EXPECT_EQ(ConnOf(a.server).active.load(), 1u) << "looked at too soon";
  // Its sibling closes: its pace doubles, and so the same time is enough.
  gov_->OnClose(b.server);
  ::close(b.server);
  gov_->ApplyChangedShares();
  ASSERT_EQ(Pacing(a.server), kSlowRate);
  gov_->ExpireIdle(t + at_full_rate);
  EXPECT_EQ(ConnOf(a.server).active.load(), 0u);
}

TEST_F(GovernorTest, BudgetModeExpiresIdleConnectionsInTheTickNotThePass) {
  StartGovernor(/*idle_ns=*/300 * kNsPerMs);
  zone_->settings().SetShare(ShareMode::kBudget, 0);
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  ASSERT_EQ(Send(c.server, 100), 100);
  const uint32_t key = KeyIndex(c.server);
  EXPECT_EQ(zone_->keys().slot(key).active.load(), 1u);
  // The idle pass does nothing in budget mode (the tick visits the sending
  // connections and expires them there), even long after the last send.
  gov_->ExpireIdle(MonotonicNowNs() + 10 * kNsPerSec);
  EXPECT_EQ(ConnOf(c.server).active.load(), 1u);
  // The watcher's tick does, once the 100 bytes are acknowledged and the
  // idle time has passed.
  EXPECT_TRUE(
      PollUntil([&] { return zone_->keys().slot(key).active.load() == 0; }));
  gov_->BeforeSend(c.server);
  EXPECT_EQ(zone_->keys().slot(key).active.load(), 1u);
}

TEST_F(GovernorTest, BudgetTickWithNothingDueSleepsUpToATenthOfASecond) {
  // No watcher runs: nothing here has joined.
  StartGovernor();
  zone_->settings().SetShare(ShareMode::kBudget, 0);
  const int64_t now = MonotonicNowNs();
  const int64_t next = gov_->TickBudget(now);
  EXPECT_GT(next, now + Governor::kMaxBudgetSleepNs - 2 * kBudgetTickNs);
  EXPECT_LE(next, now + Governor::kMaxBudgetSleepNs);
}

TEST_F(GovernorTest, BudgetWatcherPublishesItsCpuAndStretch) {
  StartGovernor();
  zone_->settings().SetShare(ShareMode::kBudget, 0);
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  ASSERT_EQ(Send(c.server, 100), 100);
  const uint32_t proc = gov_->proc_index();
  ASSERT_LT(proc, zone_->procs().capacity());
  // Published from its first tick (stretch 1, no CPU measured yet), then
  // once a second. What one connection costs it depends on the build (1.5%
  // of a core under ThreadSanitizer, over the floor): with a single
  // connection nothing is spaced out whatever it costs.
  EXPECT_TRUE(PollUntil(
      [&] { return zone_->procs().slot(proc).watcher_stretch.load() != 0; }));
  SleepNs(1'200 * kNsPerMs);
  EXPECT_EQ(zone_->procs().slot(proc).watcher_stretch.load(), 100u);
  EXPECT_LT(zone_->procs().slot(proc).watcher_cpu.load(), 10000u);  // < a core
}

TEST_F(GovernorTest, DuplicatedFdCountsOnceUntilBothAreClosed) {
  StartGovernor();
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  const int dup_fd = dup(c.server);
  ASSERT_GE(dup_fd, 0);
  gov_->OnDup(c.server, dup_fd);
  EXPECT_EQ(table_->Get(dup_fd)->state.load(),
            table_->Get(c.server)->state.load());
  gov_->BeforeSend(c.server);
  gov_->BeforeSend(dup_fd);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(Refs(c.server), 1u);
  EXPECT_EQ(Active(c.server), 1u);
  EXPECT_EQ(Pacing(dup_fd), kRate);
  const uint32_t key = KeyIndex(c.server);
  // Closing the original keeps the registration: the dup still holds it.
  CloseServer(c.server);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(zone_->keys().slot(key).active.load(), 1u);
  gov_->BeforeSend(dup_fd);
  EXPECT_EQ(zone_->keys().slot(key).active.load(), 1u);
  // Closing the last one ends it.
  gov_->OnClose(dup_fd);
  close(dup_fd);
  EXPECT_EQ(ConnsUsed(), 0u);
  EXPECT_EQ(KeysUsed(), 0u);
}

// Idleness is a connection's, not an fd's: when a connection has two fds
// (dup, dup2 onto 0/1 as inetd-style servers do) and the host writes through
// only one of them, it must not leave its key (that would make the key's
// membership, and its siblings' shares, flap every idle period).
TEST_F(GovernorTest, ConnectionSendingThroughADupIsNotExpired) {
  StartGovernor();
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  gov_->BeforeSend(c.server);
  const int64_t last_original = gov_->LastSendNs(c.server);
  const int dup_fd = dup(c.server);
  ASSERT_GE(dup_fd, 0);
  gov_->OnDup(c.server, dup_fd);
  // The clock must move on before the host writes through the dup only.
  testing_util::WaitForCoarseTick(last_original);
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

TEST_F(GovernorTest, ReusedFdNumberCarriesTheNewConnection) {
  StartGovernor();
  const Conn old_conn = Open("127.0.0.2");
  ASSERT_GE(old_conn.server, 0);
  gov_->BeforeSend(old_conn.server);
  const int fd = old_conn.server;
  const uint64_t old_state = table_->Get(fd)->state.load();
  CloseKept(fd);
  EXPECT_EQ(ConnsUsed(), 0u);
  const Conn fresh = Open("127.0.0.3");
  ASSERT_EQ(fresh.server, fd) << "the kernel reuses the lowest free fd";
  EXPECT_NE(table_->Get(fd)->state.load(), old_state);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(KeysUsed(), 1u);
  EXPECT_EQ(ConnOf(fd).peer[15], 3) << "the state is the new connection's";
  EXPECT_EQ(ConnOf(fd).active.load(), 0u);
  gov_->BeforeSend(fd);
  EXPECT_EQ(Active(fd), 1u);
  EXPECT_EQ(Pacing(fd), kRate);
}

TEST_F(GovernorTest, FdClosedBehindOurBackIsReleasedWhenItsNumberReturns) {
  StartGovernor();
  const Conn old_conn = Open("127.0.0.2");
  ASSERT_GE(old_conn.server, 0);
  gov_->BeforeSend(old_conn.server);
  const int fd = old_conn.server;
  // Closed without OnClose (e.g. a close the interposers did not see).
  close(fd);
  for (Conn& conn : conns_) {
    if (conn.server == fd) {
      conn.server = -1;
      close(conn.client);  // frees the number the next client socket takes
      conn.client = -1;
    }
  }
  EXPECT_EQ(ConnsUsed(), 1u);
  const Conn fresh = Open("127.0.0.3");
  ASSERT_EQ(fresh.server, fd);
  EXPECT_EQ(ConnsUsed(), 1u) << "the stale registration is released";
  EXPECT_EQ(KeysUsed(), 1u);
  EXPECT_EQ(ConnOf(fd).peer[15], 3);
}

TEST_F(GovernorTest, RateChangeReachesSocketsThroughTheWatcher) {
  StartGovernor();
  const Conn c1 = Open();
  const Conn c2 = Open();
  const Conn other = Open("127.0.0.2");
  ASSERT_GE(other.server, 0);
  gov_->BeforeSend(c1.server);
  gov_->BeforeSend(c2.server);
  gov_->BeforeSend(other.server);
  ASSERT_TRUE(PacingBecomes(c1.server, kRate / 2));
  zone_->settings().SetRate(3 * kRate);
  EXPECT_TRUE(PacingBecomes(c1.server, 3 * kRate / 2)) << Pacing(c1.server);
  EXPECT_TRUE(PacingBecomes(c2.server, 3 * kRate / 2)) << Pacing(c2.server);
  EXPECT_TRUE(PacingBecomes(other.server, 3 * kRate)) << Pacing(other.server);
}

TEST_F(GovernorTest, FullZoneLeavesNewConnectionsUnpaced) {
  StartGovernor();
  // Fill the connection table behind the Governor's back.
  std::vector<uint32_t> fillers;
  {
    ZoneLock lock(*zone_);
    uint8_t key[kKeyBytes] = {9};
    const uint32_t k = zone_->keys().FindOrInsertLocked(key, 1);
    ASSERT_NE(k, kNoSlot);
    const uint8_t peer[16] = {};
    for (uint32_t i = 0; i < zone_->conns().capacity(); ++i) {
      const uint32_t c = zone_->conns().RegisterLocked(k, 0, -1, peer, 0);
      ASSERT_NE(c, kNoSlot);
      fillers.push_back(c);
    }
  }
  const uint64_t full_before = zone_->header().table_full.load();
  const Conn c = Open("127.0.0.2");
  ASSERT_GE(c.server, 0);
  EXPECT_EQ(table_->Get(c.server)->state.load(), 0u) << "not governed";
  EXPECT_GT(zone_->header().table_full.load(), full_before);
  EXPECT_EQ(KeysUsed(), 1u) << "the new key was not left behind";
  EXPECT_EQ(Send(c.server), 100);
  EXPECT_EQ(Pacing(c.server), kNotPaced);
  // Room again: the next connection is governed.
  {
    ZoneLock lock(*zone_);
    for (const uint32_t conn : fillers) zone_->conns().DeregisterLocked(conn);
  }
  const Conn next = Open("127.0.0.2");
  EXPECT_NE(table_->Get(next.server)->state.load(), 0u);
  gov_->BeforeSend(next.server);
  EXPECT_EQ(Pacing(next.server), kRate);
}

// --- TRAFFICRATE_PORTS, TRAFFICRATE_EXEMPT and TRAFFICRATE_AFTER.

GovernorOptions RuleOptions(const std::vector<PortRange>& ports,
                            const char* exempt = nullptr) {
  GovernorOptions options;
  options.idle_ns = kLongIdleNs;
  std::vector<Cidr> cidrs;
  if (exempt != nullptr) cidrs = ParseExempt(exempt).value();
  options.rules = AcceptRules::Make(ports, cidrs).value();
  return options;
}

sockaddr_in6 MappedPeer(const char* v4, uint16_t port) {
  sockaddr_in6 peer{};
  peer.sin6_family = AF_INET6;
  peer.sin6_port = htons(port);
  const std::string text = std::string("::ffff:") + v4;
  EXPECT_EQ(inet_pton(AF_INET6, text.c_str(), &peer.sin6_addr), 1);
  return peer;
}

// --- Sockets inherited at start-up (AdoptInherited: inetd, systemd
// Accept=yes). The test process plays the parent: it accepts with plain
// ::accept and tells no Governor, then starts one.

// A client connection to `listener`, accepted without the Governor.
Conn AcceptUntold(int listener, const char* from) {
  sockaddr_in server{};
  socklen_t len = sizeof(server);
  if (getsockname(listener, reinterpret_cast<sockaddr*>(&server), &len) != 0) {
    return Conn{};
  }
  Conn conn;
  conn.client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in local = testing_util::Inet(from, 0);
  if (conn.client < 0 ||
      bind(conn.client, reinterpret_cast<sockaddr*>(&local), sizeof(local)) !=
          0 ||
      connect(conn.client, reinterpret_cast<sockaddr*>(&server),
              sizeof(server)) != 0) {
    if (conn.client >= 0) close(conn.client);
    return Conn{};
  }
  conn.server = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  return conn;
}

TEST_F(GovernorTest, InheritedClientConnectionIsGovernedOnceWithItsDuplicates) {
  Conn c = AcceptUntold(listener_, "127.0.0.2");
  ASSERT_GE(c.server, 0);
  const int dup_fd = dup(c.server);  // inetd: the socket is fd 0 and fd 1
  ASSERT_GE(dup_fd, 0);
  // TRAFFICRATE_PORTS names the listener's port: its connections are
  // clients', whatever the port.
  StartGovernor(RuleOptions({{port_, port_}}));
  EXPECT_EQ(gov_->AdoptInherited(), 1);
  // Registered at its first send, through either fd: a process that never
  // sends on it (a shell that execs the program that does) takes no slot.
  EXPECT_EQ(ConnsUsed(), 0u);
  EXPECT_EQ(gov_->proc_index(), kNoSlot);
  EXPECT_NE(table_->Get(c.server)->state.load(), 0u);
  EXPECT_EQ(table_->Get(c.client)->state.load(), 0u)
      << "the client end's local port is not the listener's";
  EXPECT_EQ(table_->Get(listener_)->state.load(), 0u);
  EXPECT_EQ(Send(dup_fd, 1000), 1000);
  EXPECT_EQ(Pacing(dup_fd), kRate);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(KeysUsed(), 1u);
  const uint64_t state = table_->Get(c.server)->state.load();
  ASSERT_NE(state, 0u);
  EXPECT_EQ(table_->Get(dup_fd)->state.load(), state);
  EXPECT_EQ(Send(c.server, 1000), 1000);
  EXPECT_EQ(ConnsUsed(), 1u) << "one socket, one registration";
  gov_->OnClose(dup_fd);
  close(dup_fd);
  EXPECT_EQ(ConnsUsed(), 1u) << "fd 0 still holds it";
  Close(c);
  EXPECT_EQ(ConnsUsed(), 0u);
  EXPECT_EQ(KeysUsed(), 0u);
}

// A CGI-style helper: the server accepted (and registered) the connection,
// then started a program with the socket as its stdout, which inherits it.
// The program's first send takes the server's registration over, as a
// forked child's would, instead of counting the connection twice.
TEST_F(GovernorTest, InheritedConnectionTakesItsAcceptorsRegistrationOver) {
  StartGovernor(RuleOptions({{port_, port_}}));  // the server
  const Conn c = Open("127.0.0.2");
  ASSERT_GE(c.server, 0);
  const uint32_t conn = ConnIndex(c.server);
  ASSERT_NE(conn, kNoSlot);
  ASSERT_EQ(ConnsUsed(), 1u);
  // The helper: another Governor over its own fd table (a process of its
  // own, as far as the zone can tell), which inherited c.server.
  std::unique_ptr<FdTable> table(FdTable::Create(testing_util::kTableSize));
  Governor helper(zone_.get(), table.get(), &logger_,
                  RuleOptions({{port_, port_}}));
  EXPECT_GE(helper.AdoptInherited(), 1);
  EXPECT_EQ(ConnsUsed(), 1u);
  helper.BeforeSend(c.server);
  const ssize_t sent = ::send(c.server, "x", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  helper.AfterSend(c.server, sent);
  ASSERT_EQ(sent, 1);
  EXPECT_EQ(ConnsUsed(), 1u) << "counted once";
  EXPECT_EQ(StateConn(table->Get(c.server)->state.load()), conn);
  EXPECT_EQ(zone_->conns().slot(conn).proc_index.load(), helper.proc_index())
      << "the sender owns it";
  EXPECT_EQ(zone_->conns().slot(conn).active.load(), 1u);
  EXPECT_EQ(Pacing(c.server), kRate);
  // The server's close leaves it to its new owner; the helper's ends it.
  gov_->OnClose(c.server);
  EXPECT_EQ(ConnsUsed(), 1u);
  helper.OnClose(c.server);
  EXPECT_EQ(ConnsUsed(), 0u);
  EXPECT_EQ(KeysUsed(), 0u);
  helper.StopWatcher();
}

TEST_F(GovernorTest, InheritedConnectionOnAnEphemeralPortIsLeftAlone) {
  // Without TRAFFICRATE_PORTS, a local port in the kernel's ephemeral range
  // is an outgoing connection's: the fixture's listener got one (port 0).
  Conn outgoing = AcceptUntold(listener_, "127.0.0.2");
  ASSERT_GE(outgoing.server, 0);
  // A server port: below the range, as every well-known port is.
  int low = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(low, 0);
  const int one = 1;
  setsockopt(low, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  bool bound = false;
  for (int port = 20000; port < 20200 && !bound; ++port) {
    sockaddr_in addr = testing_util::Inet("127.0.0.1", port);
    bound = bind(low, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ASSERT_TRUE(bound);
  ASSERT_EQ(listen(low, 8), 0);
  Conn client = AcceptUntold(low, "127.0.0.3");
  ASSERT_GE(client.server, 0);
  StartGovernor();
  EXPECT_EQ(gov_->AdoptInherited(), 1);
  EXPECT_EQ(table_->Get(outgoing.server)->state.load(), 0u);
  EXPECT_NE(table_->Get(client.server)->state.load(), 0u);
  EXPECT_EQ(Send(client.server), 100);
  EXPECT_EQ(Send(outgoing.server), 100);
  EXPECT_EQ(ConnsUsed(), 1u);
  Close(client);
  Close(outgoing);
  close(low);
  EXPECT_EQ(ConnsUsed(), 0u);
}

TEST_F(GovernorTest, ConnectionOnAnUngovernedPortIsNotRegistered) {
  const uint16_t other = port_ == 65535 ? port_ - 1 : port_ + 1;
  StartGovernor(RuleOptions({{other, other}, {1, 1}}));
  const Conn c = Open("127.0.0.2");
  ASSERT_GE(c.server, 0);
  EXPECT_EQ(table_->Get(c.server)->state.load(), 0u);
  EXPECT_EQ(ConnsUsed(), 0u);
  EXPECT_EQ(KeysUsed(), 0u);
  EXPECT_EQ(Send(c.server, 1000), 1000);
  EXPECT_EQ(Send(c.server, 1000), 1000);
  EXPECT_EQ(ConnsUsed(), 0u) << "a send does not register it either";
  EXPECT_EQ(Pacing(c.server), kNotPaced);
}

TEST_F(GovernorTest, ConnectionOnAGovernedPortIsRegistered) {
  StartGovernor(RuleOptions({{1, 1}, {port_, port_}}));
  const Conn c = Open("127.0.0.2");
  ASSERT_GE(c.server, 0);
  EXPECT_NE(table_->Get(c.server)->state.load(), 0u);
  EXPECT_EQ(ConnsUsed(), 1u);
  gov_->BeforeSend(c.server);
  EXPECT_EQ(Pacing(c.server), kRate);
}

TEST_F(GovernorTest, ExemptClientIsNotRegisteredWhileAnotherClientIs) {
  StartGovernor(RuleOptions({}, "10.0.0.0/8,127.0.0.3,::1"));
  const Conn exempt = Open("127.0.0.3");
  const Conn governed = Open("127.0.0.2");
  ASSERT_GE(governed.server, 0);
  EXPECT_EQ(table_->Get(exempt.server)->state.load(), 0u);
  EXPECT_NE(table_->Get(governed.server)->state.load(), 0u);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(KeysUsed(), 1u);
  EXPECT_EQ(Send(exempt.server), 100);
  EXPECT_EQ(Send(governed.server), 100);
  EXPECT_EQ(Pacing(exempt.server), kNotPaced);
  EXPECT_EQ(Pacing(governed.server), kRate);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(ConnOf(governed.server).peer[15], 2);
}

TEST_F(GovernorTest, Ipv4ExemptionCoversTheMappedPeerOfADualStackSocket) {
  StartGovernor(RuleOptions({}, "127.0.0.3"));
  const Conn c = Open("127.0.0.3");
  ASSERT_GE(c.server, 0);
  EXPECT_EQ(ConnsUsed(), 0u);
  // Replay the accept as a dual-stack (AF_INET6) listener reports it.
  const sockaddr_in6 mapped = MappedPeer("127.0.0.3", 4000);
  gov_->OnAccept(c.server, reinterpret_cast<const sockaddr*>(&mapped),
                 sizeof(mapped));
  EXPECT_EQ(table_->Get(c.server)->state.load(), 0u);
  EXPECT_EQ(ConnsUsed(), 0u);
  const sockaddr_in6 other = MappedPeer("127.0.0.2", 4000);
  gov_->OnAccept(c.server, reinterpret_cast<const sockaddr*>(&other),
                 sizeof(other));
  EXPECT_EQ(ConnsUsed(), 1u) << "::ffff:127.0.0.2 is not exempt";
}

TEST_F(GovernorTest, PortsAndExemptionsApplyTogether) {
  StartGovernor(RuleOptions({{port_, port_}}, "::/0"));
  const Conn c = Open("127.0.0.3");
  ASSERT_GE(c.server, 0);
  EXPECT_EQ(ConnsUsed(), 1u) << "::/0 exempts IPv6 clients, not IPv4 ones";
}

TEST_F(GovernorTest, AfterLeavesAConnectionUnpacedUntilItHasSentThatMuch) {
  GovernorOptions options = RuleOptions({});
  options.after_bytes = 3000;
  StartGovernor(options);
  const Conn c = Open("127.0.0.2");
  ASSERT_GE(c.server, 0);
  EXPECT_EQ(ConnsUsed(), 1u) << "registered (stat shows it), not joined";
  EXPECT_EQ(Send(c.server, 1000), 1000);
  EXPECT_EQ(Send(c.server, 1000), 1000);
  EXPECT_EQ(ConnOf(c.server).active.load(), 0u);
  EXPECT_EQ(Active(c.server), 0u);
  EXPECT_EQ(Pacing(c.server), kNotPaced);
  // The send that crosses 3000 bytes is the last unpaced one.
  EXPECT_EQ(Send(c.server, 1500), 1500);
  EXPECT_EQ(ConnOf(c.server).bytes_sent.load(), 3500u);
  EXPECT_EQ(ConnOf(c.server).active.load(), 0u);
  EXPECT_EQ(Pacing(c.server), kNotPaced);
  EXPECT_EQ(ConnOf(c.server).share_bytes_per_sec.load(), 0u);
  // The next one joins and applies the share before its data is queued.
  gov_->BeforeSend(c.server);
  EXPECT_EQ(ConnOf(c.server).active.load(), 1u);
  EXPECT_EQ(Active(c.server), 1u);
  EXPECT_EQ(Pacing(c.server), kRate);
  EXPECT_EQ(ConnOf(c.server).share_bytes_per_sec.load(), kRate);
}

// Queued is not sent: a share applied while the first AFTER bytes still wait
// in the socket would pace them too (the kernel paces queued data), so the
// connection joins only once they have left it, by its next send or, with no
// send, by the watcher's tick.
TEST_F(GovernorTest, AfterCountsOnlyBytesThatLeftTheSocket) {
  GovernorOptions options = RuleOptions({});
  options.after_bytes = 32 * 1024;
  options.idle_ns = kLongIdleNs;
  StartGovernor(options);
  const Conn c = Open("127.0.0.1", /*client_rcvbuf=*/4096);
  ASSERT_GE(c.server, 0);
  const int sndbuf = 256 * 1024;
  ASSERT_EQ(
      setsockopt(c.server, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)), 0);
  // The client does not read: most of what is queued cannot be sent.
  uint64_t queued = 0;
  for (int i = 0; i < 1000 && queued < 4 * options.after_bytes; ++i) {
    const ssize_t n = Send(c.server, 4096);
    if (n <= 0) break;
    queued += static_cast<uint64_t>(n);
  }
  ASSERT_GE(queued, 2 * options.after_bytes);
  int unsent = 0;
  ASSERT_EQ(ioctl(c.server, SIOCOUTQNSD, &unsent), 0);
  ASSERT_GT(queued - static_cast<uint64_t>(unsent), 0u);
  ASSERT_LT(queued - static_cast<uint64_t>(unsent), options.after_bytes)
      << "the client's window should hold back most of it";
  gov_->BeforeSend(c.server);
  EXPECT_EQ(Active(c.server), 0u) << "joined with its first bytes unsent";
  EXPECT_EQ(Pacing(c.server), kNotPaced);
  gov_->ExpireIdle(MonotonicNowNs());
  EXPECT_EQ(Active(c.server), 0u);
  // The client reads: the first bytes leave; the watcher's tick joins.
  const bool drained = PollUntil([&] {
    char buf[65536];
    while (recv(c.client, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
    }
    return ioctl(c.server, SIOCOUTQNSD, &unsent) == 0 && unsent == 0;
  });
  ASSERT_TRUE(drained);
  gov_->ExpireIdle(MonotonicNowNs());
  EXPECT_EQ(ConnOf(c.server).active.load(), 1u);
  EXPECT_EQ(Active(c.server), 1u);
  EXPECT_EQ(Pacing(c.server), kRate);
}

TEST_F(GovernorTest, AfterReachedExactlyJoinsOnTheNextSend) {
  GovernorOptions options = RuleOptions({});
  options.after_bytes = 1000;
  StartGovernor(options);
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  EXPECT_EQ(Send(c.server, 999), 999);
  gov_->BeforeSend(c.server);
  EXPECT_EQ(Active(c.server), 0u) << "999 of 1000 bytes";
  gov_->AfterSend(c.server, 1);
  gov_->BeforeSend(c.server);
  EXPECT_EQ(Active(c.server), 1u);
  EXPECT_EQ(Pacing(c.server), kRate);
}

TEST_F(GovernorTest, ConnectionWithinAfterTakesNoShareOfItsKey) {
  GovernorOptions options = RuleOptions({});
  options.after_bytes = 2000;
  StartGovernor(options);
  const Conn early = Open("127.0.0.2");
  const Conn late = Open("127.0.0.2");
  ASSERT_GE(late.server, 0);
  EXPECT_EQ(Send(early.server, 2000), 2000);
  EXPECT_EQ(Send(late.server, 100), 100);
  gov_->BeforeSend(early.server);
  EXPECT_EQ(Active(early.server), 1u) << "late is still within AFTER";
  EXPECT_EQ(Pacing(early.server), kRate);
  EXPECT_EQ(Pacing(late.server), kNotPaced);
  // late crosses AFTER: from its next send the two split the rate.
  EXPECT_EQ(Send(late.server, 1900), 1900);
  gov_->BeforeSend(late.server);
  EXPECT_EQ(Active(late.server), 2u);
  EXPECT_EQ(Pacing(late.server), kRate / 2);
  EXPECT_TRUE(PacingBecomes(early.server, kRate / 2)) << Pacing(early.server);
}

TEST_F(GovernorTest, AfterIsPerConnectionSoAnIdleConnectionRejoinsAtOnce) {
  GovernorOptions options = RuleOptions({});
  options.after_bytes = 1000;
  StartGovernor(options);
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  EXPECT_EQ(Send(c.server, 1000), 1000);
  gov_->BeforeSend(c.server);
  ASSERT_EQ(Active(c.server), 1u);
  ASSERT_TRUE(PollUntil([&] { return Outq(c.server) == 0; }));
  gov_->ExpireIdle(gov_->LastSendNs(c.server) + kLongIdleNs);
  ASSERT_EQ(Active(c.server), 0u);
  // Unlike nginx's limit_rate_after (per request), the count is not reset:
  // the next response on this connection is paced from its first byte.
  gov_->BeforeSend(c.server);
  EXPECT_EQ(Active(c.server), 1u);
}

}  // namespace
}  // namespace trafficrate
