// The zone's settings: the rate, share mode and burst (changes wake the
// watchers, no change wakes nobody), rules (unused ones, names, written,
// found, mapped for a rules file under the lock), a key's rate with the
// cluster's share while the agent beats, and the budget controller's
// settings kept within what the variables accept.

#include "src/shm/zone_settings.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "src/budget/budget.h"
#include "src/budget/share.h"
#include "src/net/key.h"
#include "src/shm/zone.h"
#include "src/shm/zone_layout.h"
#include "tests/base/fake_clock.h"
#include "tests/shm/zone_fixture.h"

namespace trafficrate {
namespace {

using testing_util::FakeClock;
using testing_util::kRate;
using testing_util::MakeKey;

using ZoneSettingsTest = testing_util::ZoneFixture;

TEST_F(ZoneSettingsTest, SetRateStoresTheRateAndWakesWatchers) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  const uint32_t settings = zone->header().settings_generation.load();
  const uint32_t change = zone->changes().Current();
  zone->settings().SetRate(5 * kRate);
  EXPECT_EQ(zone->header().rate_bytes_per_sec.load(), 5 * kRate);
  EXPECT_EQ(zone->header().settings_generation.load(), settings + 1);
  EXPECT_NE(zone->changes().Current(), change);
}

TEST_F(ZoneSettingsTest, TheShareAndBurstChangeAndWakeOnlyWhenTheyDiffer) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneSettings& settings = zone->settings();
  EXPECT_EQ(settings.share_mode(), ShareMode::kEqual);
  EXPECT_EQ(settings.burst_bytes(), DefaultBurstBytes(kRate));
  const uint32_t generation = zone->header().settings_generation.load();
  const uint32_t change = zone->changes().Current();
  settings.SetShare(ShareMode::kEqual, 0);
  EXPECT_EQ(zone->header().settings_generation.load(), generation);
  EXPECT_EQ(zone->changes().Current(), change);
  settings.SetShare(ShareMode::kBudget, 300'000);
  EXPECT_EQ(settings.share_mode(), ShareMode::kBudget);
  EXPECT_EQ(settings.burst_bytes(), 300'000u);
  EXPECT_EQ(zone->header().settings_generation.load(), generation + 1);
  EXPECT_NE(zone->changes().Current(), change);
  // Any other value in the zone reads as the equal share.
  zone->header().share_mode.store(77);
  EXPECT_EQ(settings.share_mode(), ShareMode::kEqual);
}

TEST_F(ZoneSettingsTest, AnUnusedRuleOrOneOutOfRangeReadsAsUnused) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  const ZoneSettings& settings = zone->settings();
  EXPECT_EQ(settings.RuleRate(0), kRate);
  for (const uint32_t rule : {1u, kZoneRules - 1, kZoneRules, kNoSlot}) {
    EXPECT_EQ(settings.RuleRate(rule), 0u) << rule;
    EXPECT_EQ(settings.RuleBurst(rule), DefaultBurstBytes(0)) << rule;
  }
  EXPECT_EQ(settings.RuleName(0), "default");
  EXPECT_EQ(settings.RuleName(3), "rule 3");
  EXPECT_EQ(settings.RuleName(kZoneRules), absl::StrCat("rule ", kZoneRules));
  EXPECT_EQ(settings.RuleKeySpec(kZoneRules).v4_prefix,
            settings.key_spec().v4_prefix);
  EXPECT_EQ(settings.FindRule("default"), 0u);
  EXPECT_EQ(settings.FindRule(""), kNoSlot) << "unnamed, rule 0 is default";
  EXPECT_EQ(settings.FindRule("rule 3"), kNoSlot) << "unused";
  const testing_util::TestKey key = MakeKey(1);
  EXPECT_EQ(ZoneSettings::RuleOfKeyBytes(key.bytes), key.bytes[kKeyRuleByte]);
}

TEST_F(ZoneSettingsTest, SetRuleWritesTheRuleAndWakesTheWatchers) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneSettings& settings = zone->settings();
  KeySpec net24;
  net24.v4_prefix = 24;
  const uint32_t generation = zone->header().settings_generation.load();
  const uint32_t change = zone->changes().Current();
  settings.SetRule(2, "video", 2 * kRate, 0, net24);
  EXPECT_EQ(zone->header().settings_generation.load(), generation + 1);
  EXPECT_NE(zone->changes().Current(), change);
  EXPECT_EQ(settings.RuleRate(2), 2 * kRate);
  EXPECT_EQ(settings.RuleBurst(2), DefaultBurstBytes(2 * kRate));
  EXPECT_EQ(settings.RuleKeySpec(2).v4_prefix, 24);
  EXPECT_EQ(settings.RuleName(2), "video");
  EXPECT_EQ(settings.FindRule("video"), 2u);
  // Rule 0 takes only the name; its settings are SetRate's and SetShare's.
  settings.SetRule(0, "main", 5 * kRate, 9, net24);
  EXPECT_EQ(settings.RuleName(0), "main");
  EXPECT_EQ(settings.RuleRate(0), kRate);
  EXPECT_EQ(settings.RuleKeySpec(0).v4_prefix, 32);
  EXPECT_EQ(settings.FindRule("main"), 0u);
  EXPECT_EQ(settings.FindRule("default"), kNoSlot) << "it has a name now";
  // A name is cut to fit; a stray byte in it reads as '?'.
  settings.SetRule(3, std::string(40, 'n'), kRate, 1000, KeySpec());
  EXPECT_EQ(settings.RuleName(3), std::string(kRuleNameBytes - 1, 'n'));
  EXPECT_EQ(settings.RuleBurst(3), 1000u);
  zone->header().rules[3].name[1] = '/';
  EXPECT_EQ(settings.RuleName(3).substr(0, 3), "n?n");
  // Its rate to 0: unused, not found by name any more.
  settings.SetRuleRate(2, 0);
  EXPECT_EQ(settings.FindRule("video"), kNoSlot);
  settings.SetRuleRate(0, 4 * kRate);
  EXPECT_EQ(zone->header().rate_bytes_per_sec.load(), 4 * kRate);
  settings.SetRule(kZoneRules, "none", kRate, 0, KeySpec());  // ignored
  settings.SetRuleRate(kZoneRules, kRate);
  EXPECT_EQ(settings.FindRule("none"), kNoSlot);
}

TEST_F(ZoneSettingsTest, MapRuleLockedKeepsANameOfTheSameKeySpecElseFreesIt) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneSettings& settings = zone->settings();
  const auto map = [&](absl::string_view name, const KeySpec& spec) {
    ZoneLock lock(*zone);
    EXPECT_TRUE(lock.ok());
    return settings.MapRuleLocked(name, spec);
  };
  KeySpec net24;
  net24.v4_prefix = 24;
  settings.SetRule(0, "main", 0, 0, KeySpec());
  EXPECT_EQ(map("main", KeySpec()), 0u);
  const uint32_t video = map("video", KeySpec());
  EXPECT_EQ(video, 1u) << "the first free slot";
  EXPECT_EQ(settings.RuleName(video), "video");
  EXPECT_EQ(settings.RuleRate(video), 0u) << "its settings come after";
  EXPECT_EQ(map("video", KeySpec()), video);
  // In use with another key spec: it keeps its rate as "rule 1".
  settings.SetRule(video, "video", kRate, 0, KeySpec());
  const uint32_t again = map("video", net24);
  EXPECT_EQ(again, 2u);
  EXPECT_EQ(settings.RuleName(video), "rule 1");
  EXPECT_EQ(settings.RuleRate(video), kRate);
  EXPECT_EQ(settings.RuleName(again), "video");
  EXPECT_EQ(settings.RuleKeySpec(again).v4_prefix, 24);
  // Every slot taken: none.
  for (uint32_t rule = 2; rule < kZoneRules; ++rule) {
    settings.SetRuleRate(rule, kRate);
  }
  EXPECT_EQ(map("audio", KeySpec()), kNoSlot);
}

// A key's rate is this host's share of a fleet-wide rate only while the
// zone's cluster agent beats; a burst left to its default follows it.
TEST_F(ZoneSettingsTest, AKeysRateIsItsClusterShareWhileTheAgentBeats) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  const ZoneSettings& settings = zone->settings();
  KeySlotShm& key = zone->keys().slot(0);
  ASSERT_EQ(settings.RuleOf(key), 0u);
  key.cluster_share.store(kRate / 4);
  EXPECT_EQ(settings.KeyRate(key), kRate) << "no agent ever beat";
  std::atomic<int64_t>& beat = settings.cluster().beat_ns;
  beat.store(MonotonicNowNs());
  EXPECT_EQ(settings.KeyRate(key), kRate / 4);
  BudgetSettings budget = settings.key_budget_settings(key);
  EXPECT_EQ(budget.rate_bytes_per_sec, kRate / 4);
  EXPECT_EQ(budget.burst_bytes, DefaultBurstBytes(kRate / 4));
  zone->settings().SetShare(ShareMode::kBudget, 123'456);
  EXPECT_EQ(settings.key_budget_settings(key).burst_bytes, 123'456u)
      << "a burst set stays";
  beat.store(MonotonicNowNs() - 2 * kClusterStaleNs);
  EXPECT_EQ(settings.KeyRate(key), kRate) << "the agent stopped";
  beat.store(MonotonicNowNs() + 2 * kClusterStaleNs);
  EXPECT_EQ(settings.KeyRate(key), kRate) << "a beat from the future";
  beat.store(MonotonicNowNs());
  key.cluster_share.store(2 * kRate);
  EXPECT_EQ(settings.KeyRate(key), kRate) << "never above the rule's rate";
}

// The beat's age is read on the zone's clock (Zone::UseClock): the share
// holds until the clock has moved kClusterStaleNs past the beat, whatever
// the real time.
TEST_F(ZoneSettingsTest, TheClusterBeatAgesOnTheZonesClock) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  FakeClock clock;
  zone->UseClock(&clock);
  KeySlotShm& key = zone->keys().slot(0);
  key.cluster_share.store(kRate / 4);
  zone->settings().cluster().beat_ns.store(clock.NowNs());
  EXPECT_EQ(zone->settings().KeyRate(key), kRate / 4);
  clock.AdvanceNs(kClusterStaleNs);
  EXPECT_EQ(zone->settings().KeyRate(key), kRate / 4) << "just fresh";
  clock.AdvanceNs(1);
  EXPECT_EQ(zone->settings().KeyRate(key), kRate) << "stale by a nanosecond";
}

// A join's and a leave's stamp of the key (KeySlotShm::last_active_ns) is
// the zone's clock's time.
TEST_F(ZoneSettingsTest, AJoinStampsItsKeyOnTheZonesClock) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  FakeClock clock(12'345 * kNsPerMs);
  zone->UseClock(&clock);
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const uint32_t k =
      zone->keys().FindOrInsertLocked(MakeKey(7).bytes, clock.NowNs());
  ASSERT_NE(k, kNoSlot);
  const uint32_t c =
      zone->conns().RegisterLocked(k, 0, 3, testing_util::kPeer, 80);
  ASSERT_NE(c, kNoSlot);
  clock.AdvanceNs(kNsPerSec);
  ASSERT_TRUE(zone->conns().JoinLocked(c));
  EXPECT_EQ(zone->keys().slot(k).last_active_ns.load(), 13'345 * kNsPerMs);
  clock.AdvanceNs(kNsPerSec);
  ASSERT_TRUE(zone->conns().LeaveLocked(c));
  EXPECT_EQ(zone->keys().slot(k).last_active_ns.load(), 14'345 * kNsPerMs);
}

TEST_F(ZoneSettingsTest, TheBudgetSettingsStayWithinWhatTheVariablesAccept) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneSettings& settings = zone->settings();
  settings.SetRate(0);
  EXPECT_EQ(settings.budget_settings().rate_bytes_per_sec, 1u);
  settings.SetRate(kMaxRateBytesPerSec + 1);
  settings.SetShare(ShareMode::kBudget, kMaxBurstBytes + 1);
  EXPECT_EQ(settings.budget_settings().rate_bytes_per_sec, kMaxRateBytesPerSec);
  EXPECT_EQ(settings.budget_settings().burst_bytes, kMaxBurstBytes);
  EXPECT_EQ(settings.budget_settings(kNoSlot).rate_bytes_per_sec, 1u);
}

}  // namespace
}  // namespace trafficrate
