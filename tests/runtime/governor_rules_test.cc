// The Governor under a rules file (TRAFFICRATE_CONFIG, rules_file.h): the
// first matching rule decides at accept, its key carries its zone rule, each
// rule paces at its own rate, unlimited rules and exempt clients are left
// alone, and `trafficrate reload` (the zone's rules_generation) makes the
// watcher read the file again (CheckZone, which the test calls). Real
// loopback sockets and a driven Governor, as in the other
// governor_*_test.cc (governor_fixture.h).

#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "src/config/rules_file.h"
#include "src/runtime/governor.h"
#include "src/shm/zone.h"
#include "src/shm/zone_layout.h"
#include "tests/runtime/governor_fixture.h"

namespace trafficrate {
namespace {

using testing_util::Conn;
using testing_util::kLongIdleNs;
using testing_util::kRate;
using testing_util::Pacing;
using GovernorRulesTest = testing_util::GovernorFixture;

using testing_util::kNotPaced;

std::vector<Rule> Rules(const std::string& text) {
  absl::StatusOr<RulesFile> file = ParseRulesText("t.rules", text);
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? file->rules : std::vector<Rule>{};
}

GovernorOptions FileOptions(const std::string& path,
                            const std::vector<Rule>& rules) {
  GovernorOptions options;
  options.idle_ns = kLongIdleNs;
  options.rules_path = path;
  options.file_rules = rules;
  return options;
}

uint32_t RuleOfConn(const Zone& zone, uint32_t key_index) {
  return key_index < zone.keys().capacity()
             ? zone.settings().RuleOf(zone.keys().slot(key_index))
             : kNoSlot;
}

TEST_F(GovernorRulesTest, FirstMatchingRuleDecidesAndPacesAtItsRate) {
  // The fixture's zone has rule 0 at kRate; the rules' first with a rate
  // names it, the others take free places.
  const std::string port = std::to_string(port_);
  StartGovernor(FileOptions(
      "", Rules("[internal]\nclients = 127.0.0.9\nrate = unlimited\n"
                "[vip]\nlisten = " +
                port +
                "\nclients = 127.0.0.4, 127.0.0.5\n"
                "exempt = 127.0.0.5\nrate = 1000000\n"
                "[api]\nlisten = 127.0.0.1:" +
                port +
                "\nkey = all\n"
                "rate = 300000\n[never]\nlisten = 1\nrate = 5\n")));
  EXPECT_EQ(zone_->settings().RuleName(0), "vip");
  const uint32_t api = zone_->settings().FindRule("api");
  ASSERT_NE(api, kNoSlot);
  EXPECT_EQ(zone_->settings().RuleRate(api), 300000u);
  const Conn vip = Open("127.0.0.4");
  const Conn a = Open("127.0.0.2");
  const Conn b = Open("127.0.0.3");
  const Conn internal = Open("127.0.0.9");
  const Conn exempt = Open("127.0.0.5");
  for (const Conn* c : {&vip, &a, &b, &internal, &exempt}) {
    ASSERT_GE(c->server, 0);
    EXPECT_EQ(Send(c->server), 100);
  }
  EXPECT_EQ(RuleOfConn(*zone_, KeyIndex(vip.server)), 0u);
  EXPECT_EQ(Pacing(vip.server), kRate);  // rule 0: the zone's own rate
  // key = all: both clients in one key of the api rule, sharing its rate.
  EXPECT_EQ(RuleOfConn(*zone_, KeyIndex(a.server)), api);
  EXPECT_EQ(KeyIndex(a.server), KeyIndex(b.server));
  gov_->BeforeSend(a.server);
  EXPECT_EQ(Pacing(b.server), 150000u);
  EXPECT_EQ(table_->Get(internal.server)->state.load(), 0u);
  EXPECT_EQ(table_->Get(exempt.server)->state.load(), 0u);
  EXPECT_EQ(Pacing(internal.server), kNotPaced);
  EXPECT_EQ(Pacing(exempt.server), kNotPaced);
  EXPECT_EQ(ConnsUsed(), 3u);
  // A live change of one rule's rate reaches its sockets only (the
  // watcher's pass over the changed shares).
  zone_->settings().SetRuleRate(api, 600000);
  gov_->ApplyChangedShares();
  EXPECT_EQ(Pacing(a.server), 300000u);
  EXPECT_EQ(Pacing(vip.server), kRate);
}

TEST_F(GovernorRulesTest, EachRuleHasItsOwnAfter) {
  StartGovernor(FileOptions(
      "", Rules("[late]\nclients = 127.0.0.2\nrate = 1000000\nafter = 3000\n"
                "[prompt]\nrate = 400000\n")));
  const Conn late = Open("127.0.0.2");
  const Conn prompt = Open("127.0.0.3");
  ASSERT_GE(late.server, 0);
  ASSERT_GE(prompt.server, 0);
  // prompt joins at its first send; late only once 3000 bytes have left it.
  EXPECT_EQ(Send(prompt.server, 1000), 1000);
  EXPECT_EQ(Active(prompt.server), 1u);
  EXPECT_EQ(Pacing(prompt.server), 400000u);
  EXPECT_EQ(Send(late.server, 2000), 2000);
  EXPECT_EQ(Active(late.server), 0u);
  EXPECT_EQ(Pacing(late.server), kNotPaced);
  EXPECT_EQ(Send(late.server, 1500), 1500);
  ASSERT_TRUE(testing_util::QueueEmpties(late.server));
  gov_->BeforeSend(late.server);
  EXPECT_EQ(Active(late.server), 1u);
  EXPECT_EQ(Pacing(late.server), kRate);
}

TEST_F(GovernorRulesTest, ReloadReadsTheFileAgainForNewConnections) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/governor_rules_test.", getpid());
  const std::string port = std::to_string(port_);
  const auto write = [&](const std::string& text) {
    std::ofstream(path) << text;
  };
  write("[main]\nrate = 1000000\n");
  absl::StatusOr<RulesFile> first = ReadRulesFile(path);
  ASSERT_TRUE(first.ok()) << first.status();
  StartGovernor(FileOptions(path, first->rules));
  const Conn before = Open("127.0.0.2");
  EXPECT_EQ(Send(before.server), 100);
  EXPECT_EQ(RuleOfConn(*zone_, KeyIndex(before.server)), 0u);
  // A broken file: the rules in force stay.
  write("[main]\nrate = 1x\n");
  zone_->header().rules_generation.fetch_add(1);
  ASSERT_TRUE(gov_->CheckZone(Now()));
  const Conn still = Open("127.0.0.3");
  EXPECT_EQ(Send(still.server), 100);
  EXPECT_EQ(RuleOfConn(*zone_, KeyIndex(still.server)), 0u);
  // A new rule ahead of main, for one client.
  write("[slow]\nclients = 127.0.0.4\nrate = 200000\n[main]\nrate = 1000000\n");
  zone_->header().rules_generation.fetch_add(1);
  // Accepted before the watcher read it: pending, and classified at its
  // first send after the reload.
  const Conn early = Open("127.0.0.4");
  ASSERT_GE(early.server, 0);
  EXPECT_EQ(table_->Get(early.server)->state.load(), FdState::Pending().word());
  ASSERT_TRUE(gov_->CheckZone(Now()));
  EXPECT_EQ(Send(early.server), 100);
  const uint32_t slow = zone_->settings().FindRule("slow");
  ASSERT_NE(slow, kNoSlot);
  EXPECT_NE(slow, 0u);
  EXPECT_EQ(RuleOfConn(*zone_, KeyIndex(early.server)), slow);
  EXPECT_EQ(Pacing(early.server), 200000u);
  // The existing connection kept its rule.
  EXPECT_EQ(RuleOfConn(*zone_, KeyIndex(before.server)), 0u);
  unlink(path.c_str());
}

TEST_F(GovernorRulesTest, TablesReplacedByReloadsAreFreed) {
  const std::string path = absl::StrCat(::testing::TempDir(),
                                        "/governor_rules_test.loop.", getpid());
  std::ofstream(path) << "[main]\nrate = 1000000\n";
  absl::StatusOr<RulesFile> file = ReadRulesFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  StartGovernor(FileOptions(path, file->rules));
  // A deploy loop: 200 reloads, a connection accepted between each.
  for (int i = 0; i < 200; ++i) {
    zone_->header().rules_generation.fetch_add(1);
    ASSERT_TRUE(gov_->CheckZone(Now()));
    if (i % 50 == 0) {
      // Registered at once: the look above read the file.
      const Conn c = Open("127.0.0.2");
      EXPECT_EQ(Send(c.server), 100);
      EXPECT_EQ(RuleOfConn(*zone_, KeyIndex(c.server)), 0u);
    }
  }
  // Freed at the next look with no call reading a table.
  EXPECT_TRUE(gov_->CheckZone(Now()));
  EXPECT_EQ(gov_->RetiredRuleTablesForTesting(), 0);
  unlink(path.c_str());
}

}  // namespace
}  // namespace trafficrate
