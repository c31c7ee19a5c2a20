// The rule set (rule_set.h) on a zone of its own, without a Governor or a
// watcher: install, the table readers see, retired tables freed only once
// no read holds one, and `trafficrate reload` through the zone's
// rules_generation.

#include "src/runtime/rule_set.h"

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "src/base/log.h"
#include "src/config/rules_file.h"
#include "src/shm/zone.h"
#include "tests/shm/zone_fixture.h"

namespace trafficrate {
namespace {

std::vector<Rule> Rules(const std::string& text) {
  absl::StatusOr<RulesFile> file = ParseRulesText("t.rules", text);
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? file->rules : std::vector<Rule>{};
}

class RuleSetTest : public testing_util::ZoneFixture {
 protected:
  void SetUp() override {
    ZoneFixture::SetUp();
    zone_ = Open();
    ASSERT_NE(zone_, nullptr);
  }
  void TearDown() override {
    zone_.reset();
    ZoneFixture::TearDown();
  }

  std::unique_ptr<Zone> zone_;
  Logger logger_;
};

TEST_F(RuleSetTest, WithoutAFileThereIsNoTableAndAfterIsTheOption) {
  RuleSet rules(zone_.get(), &logger_, "", 5000);
  const RuleSet::Read read(rules);
  EXPECT_EQ(read.table(), nullptr);
  EXPECT_TRUE(rules.AnyAfter());
  EXPECT_EQ(rules.AfterBytes(zone_->conns().slot(0)), 5000u);
  zone_->header().rules_generation.fetch_add(1);
  EXPECT_FALSE(rules.Stale());  // no file: nothing to wait for
}

TEST_F(RuleSetTest, InstallMapsRulesToZoneRulesAndPublishesTheTable) {
  RuleSet rules(zone_.get(), &logger_, "", 0);
  ASSERT_TRUE(rules.Install(Rules("[free]\nrate = unlimited\n"
                                  "[main]\nrate = 1000000\n"
                                  "[slow]\nrate = 2000\nafter = 65536\n"),
                            /*at_start=*/true));
  EXPECT_EQ(zone_->settings().RuleName(0), "main");
  const uint32_t slow = zone_->settings().FindRule("slow");
  ASSERT_NE(slow, kNoSlot);
  EXPECT_EQ(zone_->settings().RuleRate(slow), 2000u);
  const RuleSet::Read read(rules);
  ASSERT_NE(read.table(), nullptr);
  ASSERT_EQ(read.table()->slots.size(), 3u);
  EXPECT_EQ(read.table()->slots[0], kNoRuleSlot);
  EXPECT_EQ(read.table()->slots[1], 0u);
  EXPECT_EQ(read.table()->slots[2], slow);
  EXPECT_EQ(read.table()->after_by_rule[slow], 65536u);
  EXPECT_EQ(read.table()->max_after, 65536u);
  EXPECT_TRUE(rules.AnyAfter());
}

TEST_F(RuleSetTest, ARetiredTableIsFreedOnlyOnceNoReadHoldsOne) {
  RuleSet rules(zone_.get(), &logger_, "", 0);
  const std::vector<Rule> file = Rules("[main]\nrate = 1000000\n");
  ASSERT_TRUE(rules.Install(file, /*at_start=*/true));
  {
    const RuleSet::Read read(rules);
    const RuleTable* old = read.table();
    ASSERT_TRUE(rules.Install(file, /*at_start=*/false));
    EXPECT_EQ(rules.RetiredForTesting(), 1);
    rules.FreeRetired(/*force=*/false);
    EXPECT_EQ(rules.RetiredForTesting(), 1);  // still read
    EXPECT_EQ(old->rules.size(), 1u);
  }
  rules.FreeRetired(/*force=*/false);
  EXPECT_EQ(rules.RetiredForTesting(), 0);
}

TEST_F(RuleSetTest, AReloadAskedForIsStaleUntilTheWatcherReadsTheFile) {
  const std::string path = "/tmp/" + zone_name_ + ".rules";
  std::ofstream(path) << "[main]\nrate = 1000000\n";
  RuleSet rules(zone_.get(), &logger_, path, 0);
  EXPECT_FALSE(rules.Stale());
  zone_->header().rules_generation.fetch_add(1);
  EXPECT_TRUE(rules.Stale());
  const uint32_t proc = ClaimProc(*zone_);
  ASSERT_NE(proc, kNoSlot);
  rules.ReloadIfAsked(proc);
  EXPECT_FALSE(rules.Stale());
  const ProcSlotShm& slot = zone_->procs().slot(proc);
  EXPECT_EQ(slot.rules_status.load(), kReloadOk);
  EXPECT_EQ(slot.rules_seen.load(), zone_->header().rules_generation.load());
  {
    const RuleSet::Read read(rules);
    ASSERT_NE(read.table(), nullptr);
    EXPECT_EQ(read.table()->rules[0].name, "main");
  }
  // An unreadable file: reported, and the rules in force stay.
  unlink(path.c_str());
  zone_->header().rules_generation.fetch_add(1);
  rules.ReloadIfAsked(proc);
  EXPECT_FALSE(rules.Stale());
  EXPECT_EQ(slot.rules_status.load(), kReloadUnreadable);
  EXPECT_EQ(slot.rules_errno.load(), ENOENT);
  const RuleSet::Read read(rules);
  ASSERT_NE(read.table(), nullptr);
}

}  // namespace
}  // namespace trafficrate
