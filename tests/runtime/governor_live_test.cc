// The Governor with its live watcher: the real clock and the watcher thread
// (StartLiveGovernor, governor_fixture.h), end to end, as the library runs
// them. Every other Governor test drives the duties itself on a clock of
// its own; these check that the thread runs them: it expires an idle
// connection on its own ticks, and wakes on the zone's change word when
// another process joins or leaves a key, to re-apply the new share to this
// process's sockets. They poll (bounded) for what the thread does.

#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <memory>

#include "gtest/gtest.h"
#include "src/runtime/fd_table.h"
#include "src/runtime/governor.h"
#include "src/shm/zone.h"
#include "tests/runtime/governor_fixture.h"

namespace trafficrate {
namespace {

using testing_util::AcceptUntold;
using testing_util::Conn;
using testing_util::kLongIdleNs;
using testing_util::kRate;
using testing_util::Pacing;
using testing_util::PollUntil;

using GovernorLiveTest = testing_util::GovernorFixture;

TEST_F(GovernorLiveTest, LiveWatcherExpiresAnIdleConnection) {
  GovernorOptions options;
  options.idle_ns = 50 * kNsPerMs;
  StartLiveGovernor(options);
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

// Two processes of one server, as far as the zone can tell: two Governors
// with their own fd tables and watcher threads. A join and a leave in the
// other one reach this one's socket, which sends nothing, through its
// watcher alone.
TEST_F(GovernorLiveTest, LiveWatcherAppliesAJoinAndALeaveOfAnotherProcess) {
  GovernorOptions options;
  options.idle_ns = kLongIdleNs;
  StartLiveGovernor(options);
  std::unique_ptr<FdTable> other_table(
      FdTable::Create(testing_util::kTableSize));
  Governor other(zone_.get(), other_table.get(), &logger_, options);
  const Conn mine = Open("127.0.0.2");
  ASSERT_GE(mine.server, 0);
  ASSERT_EQ(Send(mine.server), 100);
  ASSERT_EQ(Pacing(mine.server), kRate);
  // The other process accepts a connection of the same client and sends.
  Conn theirs = AcceptUntold(listener_, "127.0.0.2");
  ASSERT_GE(theirs.server, 0);
  other.OnAccept(theirs.server, nullptr, 0);
  other.BeforeSend(theirs.server);
  ASSERT_NE(other.proc_index(), gov_->proc_index());
  EXPECT_EQ(Active(mine.server), 2u);
  EXPECT_EQ(Pacing(theirs.server), kRate / 2) << "applied by the joiner";
  EXPECT_TRUE(PollUntil([&] { return Pacing(mine.server) == kRate / 2; }))
      << Pacing(mine.server);
  // It closes: the whole rate again, by the same way.
  other.OnClose(theirs.server);
  close(theirs.server);
  close(theirs.client);
  EXPECT_EQ(Active(mine.server), 1u);
  EXPECT_TRUE(PollUntil([&] { return Pacing(mine.server) == kRate; }))
      << Pacing(mine.server);
}

}  // namespace
}  // namespace trafficrate
