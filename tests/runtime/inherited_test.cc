// Inherited sockets (inherited.h) on real loopback sockets, with an fd
// table and no Governor: a connected client socket on a governed port is
// marked pending its first send, its other fds go to on_dup, and listening
// sockets and outgoing connections are left alone.

#include "src/runtime/inherited.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "src/config/rules.h"
#include "src/runtime/fd_table.h"
#include "tests/runtime/loopback_listener.h"

namespace trafficrate {
namespace {

TEST(InheritedTest, EphemeralPortsAreARange) {
  int lo = 0, hi = 0;
  EphemeralPorts(&lo, &hi);
  EXPECT_GT(lo, 0);
  EXPECT_LE(lo, hi);
  EXPECT_LE(hi, 65535);
}

TEST(InheritedTest, OpenFdsListsThisProcesssFdsAscending) {
  const int fd = dup(0);
  ASSERT_GE(fd, 0);
  int fds[4096];
  const int n = OpenFds(fds, 4096);
  close(fd);
  ASSERT_GT(n, 0);
  EXPECT_TRUE(std::is_sorted(fds, fds + n));
  EXPECT_NE(std::find(fds, fds + n, fd), fds + n);
}

TEST(InheritedTest, AClientConnectionIsMarkedAndItsDuplicatesJoinIt) {
  uint16_t port = 0;
  const int listener = testing_util::ListenLoopback("127.0.0.1", &port);
  ASSERT_GE(listener, 0);
  const sockaddr_in addr{AF_INET, htons(port), {htonl(INADDR_LOOPBACK)}, {}};
  const int client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(client, 0);
  ASSERT_EQ(
      connect(client, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)),
      0);
  const int server = accept(listener, nullptr, nullptr);
  ASSERT_GE(server, 0);
  const int server_dup = dup(server);
  ASSERT_GT(server_dup, server);

  // Only the listener's port is governed (the ephemeral range would take
  // the listener's port, made by bind to port 0, for an outgoing one).
  absl::StatusOr<std::vector<PortRange>> ports =
      ParsePorts(std::to_string(port));
  ASSERT_TRUE(ports.ok()) << ports.status();
  absl::StatusOr<AcceptRules> rules = AcceptRules::Make(*ports, {});
  ASSERT_TRUE(rules.ok()) << rules.status();
  std::unique_ptr<FdTable> table(FdTable::Create(4096));
  ASSERT_NE(table, nullptr);
  std::vector<std::pair<int, int>> dups;
  const int n = AdoptInheritedSockets(
      *rules, table.get(),
      [](void* context, int first, int fd) {
        static_cast<std::vector<std::pair<int, int>>*>(context)->push_back(
            {first, fd});
      },
      &dups);

  EXPECT_EQ(n, 1);
  EXPECT_EQ(FdState::From(table->Get(server)->state.load()),
            FdState::PendingGroup(server));
  EXPECT_EQ(table->Get(client)->state.load(), 0u);    // outgoing
  EXPECT_EQ(table->Get(listener)->state.load(), 0u);  // listening
  EXPECT_EQ(table->Get(server_dup)->state.load(), 0u);
  ASSERT_EQ(dups.size(), 1u);
  EXPECT_EQ(dups[0], std::make_pair(server, server_dup));
  for (int fd : {server_dup, server, client, listener}) close(fd);
}

}  // namespace
}  // namespace trafficrate
