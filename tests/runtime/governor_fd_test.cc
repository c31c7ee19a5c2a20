// The Governor on real TCP sockets over loopback and a real zone, without
// LD_PRELOAD (the test plays the interposers; the Governor is driven, see
// governor_fixture.h).
//
// This file: fd numbers. A dup'ed fd is one connection until its last fd
// closes; a number reused by a new connection carries the new one, also
// when the old one was closed behind the interposers' back. (Idleness
// through a dup is in governor_idle_test.cc; dup2 and close under threads
// in governor_fork_test.cc.)

#include <unistd.h>

#include <cstdint>

#include "gtest/gtest.h"
#include "src/runtime/governor.h"
#include "src/shm/zone.h"
#include "tests/runtime/governor_fixture.h"

namespace trafficrate {
namespace {

using testing_util::Conn;
using testing_util::kRate;
using testing_util::Pacing;

using GovernorFdTest = testing_util::GovernorFixture;

TEST_F(GovernorFdTest, DuplicatedFdCountsOnceUntilBothAreClosed) {
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

TEST_F(GovernorFdTest, ReusedFdNumberCarriesTheNewConnection) {
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

TEST_F(GovernorFdTest, FdClosedBehindOurBackIsReleasedWhenItsNumberReturns) {
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

}  // namespace
}  // namespace trafficrate
