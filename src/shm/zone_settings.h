// The zone's live settings, in its header: the rate, share mode and burst of
// rule 0 (TRAFFICRATE_RATE, _SHARE, _BURST: the last server started sets
// them, `trafficrate set` changes them), the rules of a rules file
// (RuleSlotShm, kZoneRules of them), and the cluster agent's state, from
// which a key's rate on this host is its share of a fleet-wide rate.
//
//   const uint64_t rate = settings.KeyRate(key);       // hot path
//   settings.SetRule(rule, "video", 2'000'000, 0, spec);  // a reload
//
// A key's rule is its byte kKeyRuleByte. Every change bumps the header's
// settings generation and wakes the watchers (ChangeWord), so that every
// socket's share is recomputed.
//
// Thread and process safety: the reads are lock-free, take any rule index
// (one out of range reads as an unused rule) and do not allocate unless they
// say so; the writes are lock-free too, except MapRuleLocked (REQUIRES: the
// zone lock held). The writes wake the watchers: never under the lock.

#ifndef TRAFFICRATE_SRC_SHM_ZONE_SETTINGS_H_
#define TRAFFICRATE_SRC_SHM_ZONE_SETTINGS_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "src/base/clock.h"
#include "src/budget/budget.h"
#include "src/budget/share.h"
#include "src/net/key.h"
#include "src/shm/change_word.h"
#include "src/shm/zone_layout.h"

namespace trafficrate {

class ZoneSettings {
 public:
  // `header` and `changes` must outlive the ZoneSettings.
  ZoneSettings(ZoneHeaderShm& header, ChangeWord& changes)
      : header_(&header), changes_(&changes) {}

  // Where KeyRate takes the time from (Zone::UseClock).
  void UseClock(const Clock* clock) { clock_ = clock; }

  // Sets rule 0's live rate.
  void SetRate(uint64_t rate_bytes_per_sec);
  // TRAFFICRATE_SHARE and TRAFFICRATE_BURST (0: the default for the rate),
  // live settings like the rate: the last server started sets them. No
  // change, no wake.
  void SetShare(ShareMode mode, uint64_t burst_bytes);
  ShareMode share_mode() const;
  // The burst in force: the setting, or DefaultBurstBytes of the live rate.
  uint64_t burst_bytes() const { return RuleBurst(0); }
  // The TRAFFICRATE_KEY the zone's keys (rule 0's) were built with.
  KeySpec key_spec() const;
  // The live rate and burst of a rule, for the budget controller.
  BudgetSettings budget_settings(uint32_t rule = 0) const;
  // A key's rate on this host: its rule's rate, or, while the zone's
  // cluster agent is alive (its beat at most kClusterStaleNs old), this
  // host's share of it across the fleet (KeySlotShm::cluster_share, at most
  // the rule's rate). Lock-free, no allocation: the hot path's.
  uint64_t KeyRate(const KeySlotShm& key) const;
  // budget_settings of the key's rule with KeyRate as the rate (a default
  // burst follows it).
  BudgetSettings key_budget_settings(const KeySlotShm& key) const;
  // The cluster agent's shared state (zone_layout.h).
  ClusterShm& cluster() const { return header_->cluster; }

  // Rules (RuleSlotShm). Rule 0 is the header's rate, key spec and burst.
  static uint32_t RuleOfKeyBytes(const uint8_t* key_bytes);
  uint32_t RuleOf(const KeySlotShm& key) const;
  // The live rate (0: the rule is unused), its burst in force and the key
  // spec its keys are built with.
  uint64_t RuleRate(uint32_t rule) const;
  uint64_t RuleBurst(uint32_t rule) const;
  KeySpec RuleKeySpec(uint32_t rule) const;
  // Its name, printable ASCII ("default" for an unnamed rule 0, "rule N"
  // for an unnamed other one). Allocates; not for the hot path.
  std::string RuleName(uint32_t rule) const;
  // The rule in use of that name (RuleName: rule 0 is "default" while it
  // has none), or kNoSlot; an empty name is none. Not for the hot path.
  uint32_t FindRule(absl::string_view name) const;
  // Writes rule `rule` (1..kZoneRules-1; rule 0 takes only the name, its
  // settings are SetRate and SetShare's): name (cut to kRuleNameBytes - 1),
  // live rate, burst (0: the default for the rate) and key spec; bumps the
  // settings generation and wakes the watchers, like SetRate.
  void SetRule(uint32_t rule, absl::string_view name,
               uint64_t rate_bytes_per_sec, uint64_t burst_bytes,
               const KeySpec& key_spec);
  // One rule's live rate (rule 0: SetRate).
  void SetRuleRate(uint32_t rule, uint64_t rate_bytes_per_sec);
  // The zone rule for a rules file's rule `name` whose keys are built with
  // `key_spec`, for start-up and reload: every process of a server maps a
  // file's rules alike because each does it under the zone lock. The slot
  // named so, if its key spec is the same (rule 0: the zone's key spec);
  // else a free one (no name, no rate), whose name it writes at once (the
  // caller sets its settings with SetRule after unlocking). A slot of that
  // name with another key spec loses its name: its keys keep their rate
  // under "rule N" until they close. kNoSlot when every slot is taken.
  // REQUIRES: zone lock held.
  uint32_t MapRuleLocked(absl::string_view name, const KeySpec& key_spec);

 private:
  const Clock* clock_ = &MonotonicClock();
  // The burst setting of a rule (0: the default for its rate).
  uint64_t BurstSetting(uint32_t rule) const;
  // Bumps the settings generation and wakes the watchers.
  void Changed();

  ZoneHeaderShm* header_;
  ChangeWord* changes_;
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_SHM_ZONE_SETTINGS_H_
