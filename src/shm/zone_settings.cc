#include "src/shm/zone_settings.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "src/base/clock.h"
#include "src/shm/zone_segment.h"

namespace trafficrate {
namespace {

// Writes a rule's name, cut to kRuleNameBytes - 1 and NUL-padded.
void WriteRuleName(RuleSlotShm& slot, absl::string_view name) {
  uint8_t bytes[kRuleNameBytes] = {};
  std::memcpy(bytes, name.data(), std::min(name.size(), kRuleNameBytes - 1));
  StoreBytesRelaxed(slot.name, bytes, sizeof(bytes));
}

}  // namespace

void ZoneSettings::Changed() {
  header_->settings_generation.fetch_add(1, std::memory_order_release);
  changes_->WakeWatchers();
}

void ZoneSettings::SetRate(uint64_t rate_bytes_per_sec) {
  header_->rate_bytes_per_sec.store(rate_bytes_per_sec,
                                    std::memory_order_relaxed);
  Changed();
}

void ZoneSettings::SetShare(ShareMode mode, uint64_t burst_bytes) {
  const uint32_t m = static_cast<uint32_t>(mode);
  if (header_->share_mode.load(std::memory_order_relaxed) == m &&
      header_->burst_bytes.load(std::memory_order_relaxed) == burst_bytes) {
    return;
  }
  header_->share_mode.store(m, std::memory_order_relaxed);
  header_->burst_bytes.store(burst_bytes, std::memory_order_relaxed);
  Changed();
}

ShareMode ZoneSettings::share_mode() const {
  return header_->share_mode.load(std::memory_order_relaxed) ==
                 static_cast<uint32_t>(ShareMode::kBudget)
             ? ShareMode::kBudget
             : ShareMode::kEqual;
}

KeySpec ZoneSettings::key_spec() const {
  return UnpackKeySpec(header_->key_spec);
}

BudgetSettings ZoneSettings::budget_settings(uint32_t rule) const {
  // Within what TRAFFICRATE_RATE and TRAFFICRATE_BURST accept: whatever the
  // zone holds, the controller's arithmetic stays defined.
  return BudgetSettings{
      std::clamp<uint64_t>(RuleRate(rule), 1, kMaxRateBytesPerSec),
      std::min<uint64_t>(RuleBurst(rule), kMaxBurstBytes)};
}

uint64_t ZoneSettings::KeyRate(const KeySlotShm& key) const {
  const uint64_t rate = RuleRate(RuleOf(key));
  const uint64_t share = key.cluster_share.load(std::memory_order_relaxed);
  if (share == 0 || share >= rate) return rate;
  const int64_t beat = header_->cluster.beat_ns.load(std::memory_order_relaxed);
  const int64_t now = clock_->NowNs();
  if (beat == 0 || now - beat > kClusterStaleNs ||
      beat - now > kClusterStaleNs) {
    return rate;
  }
  return share;
}

BudgetSettings ZoneSettings::key_budget_settings(const KeySlotShm& key) const {
  const uint32_t rule = RuleOf(key);
  BudgetSettings settings = budget_settings(rule);
  const uint64_t rate = KeyRate(key);
  if (rate == settings.rate_bytes_per_sec || rate == 0) return settings;
  const uint64_t burst = BurstSetting(rule);
  settings.rate_bytes_per_sec = std::min(rate, kMaxRateBytesPerSec);
  if (burst == 0) settings.burst_bytes = DefaultBurstBytes(rate);
  return settings;
}

uint32_t ZoneSettings::RuleOfKeyBytes(const uint8_t* key_bytes) {
  return __atomic_load_n(&key_bytes[kKeyRuleByte], __ATOMIC_RELAXED);
}

uint32_t ZoneSettings::RuleOf(const KeySlotShm& key) const {
  return RuleOfKeyBytes(key.key);
}

uint64_t ZoneSettings::RuleRate(uint32_t rule) const {
  if (rule == 0) {
    return header_->rate_bytes_per_sec.load(std::memory_order_relaxed);
  }
  if (rule >= kZoneRules) return 0;
  return header_->rules[rule].rate_bytes_per_sec.load(
      std::memory_order_relaxed);
}

uint64_t ZoneSettings::BurstSetting(uint32_t rule) const {
  return rule == 0 ? header_->burst_bytes.load(std::memory_order_relaxed)
         : rule < kZoneRules
             ? header_->rules[rule].burst_bytes.load(std::memory_order_relaxed)
             : 0;
}

uint64_t ZoneSettings::RuleBurst(uint32_t rule) const {
  const uint64_t burst = BurstSetting(rule);
  return burst != 0 ? burst : DefaultBurstBytes(RuleRate(rule));
}

KeySpec ZoneSettings::RuleKeySpec(uint32_t rule) const {
  if (rule == 0 || rule >= kZoneRules) return key_spec();
  return UnpackKeySpec(
      header_->rules[rule].key_spec.load(std::memory_order_relaxed));
}

std::string ZoneSettings::RuleName(uint32_t rule) const {
  std::string name;
  if (rule < kZoneRules) {
    for (size_t i = 0; i + 1 < kRuleNameBytes; ++i) {
      const char c = static_cast<char>(
          __atomic_load_n(&header_->rules[rule].name[i], __ATOMIC_RELAXED));
      if (c == 0) break;
      // What a rules file allows in a name; anything else is a stray write.
      const bool ok = absl::ascii_isalnum(static_cast<uint8_t>(c)) ||
                      c == '_' || c == '.' || c == '-';
      name.push_back(ok ? c : '?');
    }
  }
  if (!name.empty()) return name;
  return rule == 0 ? "default" : absl::StrCat("rule ", rule);
}

uint32_t ZoneSettings::FindRule(absl::string_view name) const {
  for (uint32_t rule = 0; rule < kZoneRules; ++rule) {
    if (rule > 0 && RuleRate(rule) == 0) continue;
    if (RuleName(rule) == name) return rule;
  }
  return kNoSlot;
}

void ZoneSettings::SetRule(uint32_t rule, absl::string_view name,
                           uint64_t rate_bytes_per_sec, uint64_t burst_bytes,
                           const KeySpec& key_spec) {
  if (rule >= kZoneRules) return;
  RuleSlotShm& slot = header_->rules[rule];
  WriteRuleName(slot, name);
  if (rule != 0) {
    slot.key_spec.store(PackKeySpec(key_spec), std::memory_order_relaxed);
    slot.burst_bytes.store(burst_bytes, std::memory_order_relaxed);
    slot.rate_bytes_per_sec.store(rate_bytes_per_sec,
                                  std::memory_order_relaxed);
  }
  Changed();
}

uint32_t ZoneSettings::MapRuleLocked(absl::string_view name,
                                     const KeySpec& key_spec) {
  const auto named = [&](uint32_t rule) {
    const uint8_t* bytes = header_->rules[rule].name;
    if (name.empty() || name.size() >= kRuleNameBytes) return false;
    for (size_t i = 0; i < kRuleNameBytes; ++i) {
      const uint8_t c = __atomic_load_n(&bytes[i], __ATOMIC_RELAXED);
      if (i == name.size()) return c == 0;
      if (c != static_cast<uint8_t>(name[i])) return false;
    }
    return false;
  };
  const uint32_t packed = PackKeySpec(key_spec);
  const uint8_t none[kRuleNameBytes] = {};
  for (uint32_t rule = 0; rule < kZoneRules; ++rule) {
    if (!named(rule)) continue;
    const uint32_t spec =
        rule == 0
            ? header_->key_spec
            : header_->rules[rule].key_spec.load(std::memory_order_relaxed);
    if (spec == packed) return rule;
    StoreBytesRelaxed(header_->rules[rule].name, none, sizeof(none));
  }
  for (uint32_t rule = 1; rule < kZoneRules; ++rule) {
    RuleSlotShm& slot = header_->rules[rule];
    if (slot.rate_bytes_per_sec.load(std::memory_order_relaxed) != 0 ||
        __atomic_load_n(&slot.name[0], __ATOMIC_RELAXED) != 0) {
      continue;
    }
    WriteRuleName(slot, name);
    slot.key_spec.store(packed, std::memory_order_relaxed);
    return rule;
  }
  return kNoSlot;
}

void ZoneSettings::SetRuleRate(uint32_t rule, uint64_t rate_bytes_per_sec) {
  if (rule == 0) return SetRate(rate_bytes_per_sec);
  if (rule >= kZoneRules) return;
  header_->rules[rule].rate_bytes_per_sec.store(rate_bytes_per_sec,
                                                std::memory_order_relaxed);
  Changed();
}

}  // namespace trafficrate
