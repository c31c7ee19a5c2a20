// The Governor on real TCP sockets over loopback and a real zone, without
// LD_PRELOAD (the test plays the interposers; the Governor is driven, see
// governor_fixture.h).
//
// This file: sockets inherited at start-up (AdoptInherited: inetd, systemd
// Accept=yes, a CGI helper's stdout). The test process plays the parent: it
// accepts with plain ::accept and tells no Governor, then starts one.

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
using testing_util::kRate;
using testing_util::Pacing;
using testing_util::RuleOptions;

using GovernorInheritedTest = testing_util::GovernorFixture;

TEST_F(GovernorInheritedTest,
       InheritedClientConnectionIsGovernedOnceWithItsDuplicates) {
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
TEST_F(GovernorInheritedTest,
       InheritedConnectionTakesItsAcceptorsRegistrationOver) {
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
                  Driven(RuleOptions({{port_, port_}})));
  EXPECT_GE(helper.AdoptInherited(), 1);
  EXPECT_EQ(ConnsUsed(), 1u);
  helper.BeforeSend(c.server);
  const ssize_t sent = ::send(c.server, "x", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  helper.AfterSend(c.server, sent);
  ASSERT_EQ(sent, 1);
  EXPECT_EQ(ConnsUsed(), 1u) << "counted once";
  EXPECT_EQ(FdState::From(table->Get(c.server)->state.load()).conn(), conn);
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

TEST_F(GovernorInheritedTest, InheritedConnectionOnAnEphemeralPortIsLeftAlone) {
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

}  // namespace
}  // namespace trafficrate
