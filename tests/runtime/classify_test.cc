// Classifying accepted sockets (classify.h) on real loopback sockets, with
// no zone and no Governor: TCP from a client that is not exempt, on a
// governed port, is governed with its key; the rest is not.

#include "src/runtime/classify.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "src/config/rules.h"
#include "src/config/rules_file.h"
#include "src/net/key.h"
#include "src/runtime/rule_set.h"
#include "tests/runtime/loopback_listener.h"

namespace trafficrate {
namespace {

sockaddr_in Inet(const char* address, uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, address, &addr.sin_addr);
  return addr;
}

AcceptRules MakeRules(const std::string& ports, const std::string& exempt) {
  std::vector<PortRange> port_list;
  std::vector<Cidr> exempt_list;
  if (!ports.empty()) {
    absl::StatusOr<std::vector<PortRange>> parsed = ParsePorts(ports);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    if (parsed.ok()) port_list = *parsed;
  }
  if (!exempt.empty()) {
    absl::StatusOr<std::vector<Cidr>> parsed = ParseExempt(exempt);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    if (parsed.ok()) exempt_list = *parsed;
  }
  absl::StatusOr<AcceptRules> rules = AcceptRules::Make(port_list, exempt_list);
  EXPECT_TRUE(rules.ok()) << rules.status();
  return rules.ok() ? *rules : AcceptRules();
}

// A listener on 127.0.0.1 and one connection to it from 127.0.0.2.
class ClassifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    listener_ = testing_util::ListenLoopback("127.0.0.1", &port_);
    ASSERT_GE(listener_, 0);
    sockaddr_in addr = Inet("127.0.0.1", port_);
    client_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(client_, 0);
    sockaddr_in from = Inet("127.0.0.2", 0);
    ASSERT_EQ(bind(client_, reinterpret_cast<sockaddr*>(&from), sizeof(from)),
              0);
    ASSERT_EQ(
        connect(client_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    socklen_t len = sizeof(from);
    ASSERT_EQ(getsockname(client_, reinterpret_cast<sockaddr*>(&from), &len),
              0);
    client_port_ = ntohs(from.sin_port);
    peer_len_ = sizeof(peer_);
    server_ =
        accept(listener_, reinterpret_cast<sockaddr*>(&peer_), &peer_len_);
    ASSERT_GE(server_, 0);
  }
  void TearDown() override {
    for (int fd : {server_, client_, listener_}) {
      if (fd >= 0) close(fd);
    }
  }

  bool Classify(const AcceptRules& rules, const RuleTable* table = nullptr,
                bool give_peer = true) {
    const sockaddr* peer =
        give_peer ? reinterpret_cast<const sockaddr*>(&peer_) : nullptr;
    return ClassifyConn(server_, KeySpec(), rules, table, peer,
                        give_peer ? peer_len_ : 0, &key_, peer16_, &peer_port_);
  }

  int listener_ = -1;
  int client_ = -1;
  int server_ = -1;
  uint16_t port_ = 0;
  uint16_t client_port_ = 0;
  sockaddr_storage peer_{};
  socklen_t peer_len_ = 0;
  ConnKey key_;
  uint8_t peer16_[16] = {};
  uint16_t peer_port_ = 0;
};

constexpr uint8_t kClient16[16] = {0, 0, 0,    0,    0,   0, 0, 0,
                                   0, 0, 0xff, 0xff, 127, 0, 0, 2};

TEST_F(ClassifyTest, ATcpClientIsGovernedWithItsAddressAndPort) {
  ASSERT_TRUE(Classify(AcceptRules()));
  EXPECT_EQ(std::memcmp(peer16_, kClient16, 16), 0);
  EXPECT_EQ(peer_port_, client_port_);
  ConnKey expected;
  ASSERT_TRUE(MakeConnKey(KeySpec(), reinterpret_cast<const sockaddr*>(&peer_),
                          peer_len_, nullptr, 0, &expected));
  EXPECT_EQ(std::memcmp(key_.bytes, expected.bytes, kKeyBytes), 0);
}

TEST_F(ClassifyTest, WithoutAPeerAddressTheKernelIsAsked) {
  ASSERT_TRUE(Classify(AcceptRules(), nullptr, /*give_peer=*/false));
  EXPECT_EQ(std::memcmp(peer16_, kClient16, 16), 0);
  EXPECT_EQ(peer_port_, client_port_);
}

TEST_F(ClassifyTest, AnExemptClientIsNotGoverned) {
  EXPECT_FALSE(Classify(MakeRules("", "127.0.0.2")));
  EXPECT_TRUE(Classify(MakeRules("", "127.0.0.3")));
}

TEST_F(ClassifyTest, OnlyTheGovernedLocalPortsAre) {
  EXPECT_TRUE(Classify(MakeRules(std::to_string(port_), "")));
  const uint16_t other = port_ == 65535 ? 1 : port_ + 1;
  EXPECT_FALSE(Classify(MakeRules(std::to_string(other), "")));
}

TEST_F(ClassifyTest, ASocketThatIsNotTcpIsNotGoverned) {
  const int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(udp, 0);
  ConnKey key;
  uint8_t peer16[16];
  uint16_t port = 0;
  EXPECT_FALSE(ClassifyConn(udp, KeySpec(), AcceptRules(), nullptr,
                            reinterpret_cast<const sockaddr*>(&peer_),
                            peer_len_, &key, peer16, &port));
  close(udp);
}

TEST_F(ClassifyTest, UnderRulesTheFirstMatchDecidesAndTheKeyCarriesItsRule) {
  absl::StatusOr<RulesFile> file =
      ParseRulesText("t.rules",
                     "[free]\nclients = 127.0.0.3\nrate = unlimited\n"
                     "[main]\nrate = 1000\n");
  ASSERT_TRUE(file.ok()) << file.status();
  RuleTable table;
  table.rules = file->rules;
  table.slots = {kNoRuleSlot, 5};
  ASSERT_TRUE(Classify(AcceptRules(), &table));
  EXPECT_EQ(key_.bytes[kKeyRuleByte], 5);
  // The unlimited rule matches this client: never governed.
  table.rules[0].clients = table.rules[1].clients;
  EXPECT_FALSE(Classify(AcceptRules(), &table));
  // A rule without a zone rule (none was free) governs nothing either.
  table.rules = {file->rules[1]};
  table.slots = {kNoRuleSlot};
  EXPECT_FALSE(Classify(AcceptRules(), &table));
}

}  // namespace
}  // namespace trafficrate
