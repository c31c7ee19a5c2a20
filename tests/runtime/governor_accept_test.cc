// The Governor on real TCP sockets over loopback and a real zone, without
// LD_PRELOAD: the test plays the interposers, calling OnAccept after
// ::accept, BeforeSend/AfterSend around ::send and OnClose before ::close,
// and reads back the pacing with getsockopt(SO_MAX_PACING_RATE). The
// Governor is driven (governor_fixture.h): a clock of the test's, no
// watcher thread.
//
// This file: what an accept registers (and what it leaves alone), a full
// zone, and the accept rules (TRAFFICRATE_PORTS, TRAFFICRATE_EXEMPT). Shares
// are in governor_share_test.cc, TRAFFICRATE_AFTER in governor_after_test.cc,
// sockets inherited at start-up in governor_inherited_test.cc.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "src/config/rules.h"
#include "src/runtime/governor.h"
#include "src/shm/zone.h"
#include "tests/runtime/governor_fixture.h"

namespace trafficrate {
namespace {

using testing_util::Conn;
using testing_util::kNotPaced;
using testing_util::kRate;
using testing_util::Pacing;
using testing_util::RuleOptions;

using GovernorAcceptTest = testing_util::GovernorFixture;

TEST_F(GovernorAcceptTest, AcceptedSocketRegistersWithoutJoining) {
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

TEST_F(GovernorAcceptTest, AcceptWithoutPeerAddressAsksTheKernel) {
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

TEST_F(GovernorAcceptTest, NonInetSocketsAreNotGoverned) {
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

TEST_F(GovernorAcceptTest, FullZoneLeavesNewConnectionsUnpaced) {
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

// --- TRAFFICRATE_PORTS and TRAFFICRATE_EXEMPT.

sockaddr_in6 MappedPeer(const char* v4, uint16_t port) {
  sockaddr_in6 peer{};
  peer.sin6_family = AF_INET6;
  peer.sin6_port = htons(port);
  const std::string text = std::string("::ffff:") + v4;
  EXPECT_EQ(inet_pton(AF_INET6, text.c_str(), &peer.sin6_addr), 1);
  return peer;
}

TEST_F(GovernorAcceptTest, ConnectionOnAnUngovernedPortIsNotRegistered) {
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

TEST_F(GovernorAcceptTest, ConnectionOnAGovernedPortIsRegistered) {
  StartGovernor(RuleOptions({{1, 1}, {port_, port_}}));
  const Conn c = Open("127.0.0.2");
  ASSERT_GE(c.server, 0);
  EXPECT_NE(table_->Get(c.server)->state.load(), 0u);
  EXPECT_EQ(ConnsUsed(), 1u);
  gov_->BeforeSend(c.server);
  EXPECT_EQ(Pacing(c.server), kRate);
}

TEST_F(GovernorAcceptTest, ExemptClientIsNotRegisteredWhileAnotherClientIs) {
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

TEST_F(GovernorAcceptTest, Ipv4ExemptionCoversTheMappedPeerOfADualStackSocket) {
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

TEST_F(GovernorAcceptTest, PortsAndExemptionsApplyTogether) {
  StartGovernor(RuleOptions({{port_, port_}}, "::/0"));
  const Conn c = Open("127.0.0.3");
  ASSERT_GE(c.server, 0);
  EXPECT_EQ(ConnsUsed(), 1u) << "::/0 exempts IPv6 clients, not IPv4 ones";
}

}  // namespace
}  // namespace trafficrate
