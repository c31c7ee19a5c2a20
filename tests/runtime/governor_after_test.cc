// The Governor on real TCP sockets over loopback and a real zone, without
// LD_PRELOAD (the test plays the interposers; the Governor is driven, see
// governor_fixture.h).
//
// This file: TRAFFICRATE_AFTER. A connection joins its key only once it has
// sent that many bytes, counted per connection, and only bytes that left
// the socket: by its next send, or with no send by the watcher's idle pass
// (ExpireIdle), which the test calls.

#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cstdint>

#include "gtest/gtest.h"
#include "src/runtime/governor.h"
#include "src/shm/zone.h"
#include "tests/runtime/governor_fixture.h"

namespace trafficrate {
namespace {

using testing_util::Conn;
using testing_util::kLongIdleNs;
using testing_util::kNotPaced;
using testing_util::kRate;
using testing_util::Pacing;
using testing_util::PollUntil;
using testing_util::QueueEmpties;
using testing_util::RuleOptions;

using GovernorAfterTest = testing_util::GovernorFixture;

TEST_F(GovernorAfterTest, AfterLeavesAConnectionUnpacedUntilItHasSentThatMuch) {
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
// send, by the watcher's idle pass.
TEST_F(GovernorAfterTest, AfterCountsOnlyBytesThatLeftTheSocket) {
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
  gov_->ExpireIdle(Now());
  EXPECT_EQ(Active(c.server), 0u);
  // The client reads: the first bytes leave (a wait for the kernel); the
  // watcher's idle pass joins.
  const bool drained = PollUntil([&] {
    char buf[65536];
    while (recv(c.client, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
    }
    return ioctl(c.server, SIOCOUTQNSD, &unsent) == 0 && unsent == 0;
  });
  ASSERT_TRUE(drained);
  EXPECT_EQ(Active(c.server), 0u) << "nothing joins it but the pass";
  gov_->ExpireIdle(Now());
  EXPECT_EQ(ConnOf(c.server).active.load(), 1u);
  EXPECT_EQ(Active(c.server), 1u);
  EXPECT_EQ(Pacing(c.server), kRate);
}

TEST_F(GovernorAfterTest, AfterReachedExactlyJoinsOnTheNextSend) {
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

TEST_F(GovernorAfterTest, ConnectionWithinAfterTakesNoShareOfItsKey) {
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
  gov_->ApplyChangedShares();
  EXPECT_EQ(Pacing(early.server), kRate / 2);
}

TEST_F(GovernorAfterTest, AfterIsPerConnectionSoAnIdleConnectionRejoinsAtOnce) {
  GovernorOptions options = RuleOptions({});
  options.after_bytes = 1000;
  StartGovernor(options);
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  EXPECT_EQ(Send(c.server, 1000), 1000);
  gov_->BeforeSend(c.server);
  ASSERT_EQ(Active(c.server), 1u);
  ASSERT_TRUE(QueueEmpties(c.server));
  gov_->ExpireIdle(gov_->LastSendNs(c.server) + kLongIdleNs);
  ASSERT_EQ(Active(c.server), 0u);
  // Unlike nginx's limit_rate_after (per request), the count is not reset:
  // the next response on this connection is paced from its first byte.
  gov_->BeforeSend(c.server);
  EXPECT_EQ(Active(c.server), 1u);
}

}  // namespace
}  // namespace trafficrate
