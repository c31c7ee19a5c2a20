#include "src/runtime/rule_set.h"

#include <errno.h>

#include <algorithm>
#include <memory>
#include <utility>

namespace trafficrate {

RuleSet::RuleSet(Zone* zone, const Logger* logger, std::string rules_path,
                 uint64_t after_bytes)
    : zone_(zone),
      logger_(logger),
      rules_path_(std::move(rules_path)),
      after_bytes_(after_bytes) {
  generation_seen_.store(
      zone_->header().rules_generation.load(std::memory_order_acquire),
      std::memory_order_release);
}

RuleSet::~RuleSet() {
  delete table_.exchange(nullptr);
  FreeRetired(/*force=*/true);
}

uint64_t RuleSet::AfterBytes(const ConnSlotShm& conn) const {
  const Read rules(*this);
  const RuleTable* table = rules.table();
  if (table == nullptr) return after_bytes_;
  if (table->max_after == 0) return 0;
  const uint32_t key = conn.key_index.load(std::memory_order_relaxed);
  if (key >= zone_->keys().capacity()) return 0;
  const uint32_t rule = zone_->settings().RuleOf(zone_->keys().slot(key));
  return rule < kZoneRules ? table->after_by_rule[rule] : 0;
}

bool RuleSet::Stale() const {
  return !rules_path_.empty() &&
         zone_->header().rules_generation.load(std::memory_order_acquire) !=
             generation_seen_.load(std::memory_order_acquire);
}

bool RuleSet::AnyAfter() const {
  const Read rules(*this);
  const RuleTable* table = rules.table();
  return table != nullptr ? table->max_after > 0 : after_bytes_ > 0;
}

bool RuleSet::Install(const std::vector<Rule>& rules, bool at_start) {
  auto table = std::make_unique<RuleTable>();
  table->rules = rules;
  table->slots.assign(rules.size(), kNoRuleSlot);
  const Rule* first = nullptr;
  for (const Rule& rule : rules) {
    if (!rule.unlimited && first == nullptr) first = &rule;
  }
  // At start-up the zone's own rate, key and burst are the first rule's.
  if (at_start && first != nullptr) {
    zone_->settings().SetRule(0, first->name, 0, 0, first->key);
  }
  {
    ZoneLock lock(*zone_, kWatcherLockWaitNs);
    if (!lock.ok()) return false;
    for (size_t i = 0; i < rules.size(); ++i) {
      if (rules[i].unlimited) continue;
      table->slots[i] =
          zone_->settings().MapRuleLocked(rules[i].name, rules[i].key);
    }
  }
  for (size_t i = 0; i < rules.size(); ++i) {
    const Rule& rule = rules[i];
    const uint32_t slot = table->slots[i];
    if (rule.unlimited) continue;
    if (slot >= kZoneRules) {
      logger_->Warning(
          "rule \"%s\": every one of the zone's %u rules is taken (by this "
          "file and earlier ones); its connections pass through unpaced "
          "until the zone is made afresh",
          rule.name.c_str(), kZoneRules);
      continue;
    }
    if (slot == 0) {
      if (!at_start) {
        if (zone_->settings().RuleRate(0) != rule.rate_bytes_per_sec) {
          zone_->settings().SetRate(rule.rate_bytes_per_sec);
        }
        zone_->settings().SetShare(zone_->settings().share_mode(),
                                   rule.burst_bytes);
      }
    } else {
      zone_->settings().SetRule(slot, rule.name, rule.rate_bytes_per_sec,
                                rule.burst_bytes, rule.key);
    }
    table->after_by_rule[slot] = rule.after_bytes;
    table->max_after = std::max(table->max_after, rule.after_bytes);
  }
  // The one before stays readable until no call can still read it: see
  // RuleTable.
  const RuleTable* before =
      table_.exchange(table.release(), std::memory_order_seq_cst);
  if (before != nullptr) {
    before->previous = retired_.load(std::memory_order_relaxed);
    while (!retired_.compare_exchange_weak(before->previous, before,
                                           std::memory_order_acq_rel)) {
    }
  }
  return true;
}

void RuleSet::FreeRetired(bool force) {
  if (retired_.load(std::memory_order_acquire) == nullptr ||
      (!force && readers_.load(std::memory_order_seq_cst) != 0)) {
    return;
  }
  // Every read counted from now on began after these tables were replaced
  // (the count was 0 after the exchange), so it holds a newer table.
  for (const RuleTable* t =
           retired_.exchange(nullptr, std::memory_order_acq_rel);
       t != nullptr;) {
    const RuleTable* previous = t->previous;
    delete t;
    t = previous;
  }
}

int RuleSet::RetiredForTesting() const {
  int n = 0;
  for (const RuleTable* t = retired_.load(); t != nullptr; t = t->previous) {
    ++n;
  }
  return n;
}

ReloadStatus RuleSet::Reload(int* err) {
  *err = 0;
  absl::StatusOr<RulesFile> file = ReadRulesFile(rules_path_);
  if (!file.ok()) {
    logger_->Error("reload: %s; the rules in force stay",
                   std::string(file.status().message()).c_str());
    const absl::Status& status = file.status();
    if (absl::IsPermissionDenied(status)) *err = EACCES;
    if (absl::IsNotFound(status)) *err = ENOENT;
    return *err != 0 ? kReloadUnreadable : kReloadInvalid;
  }
  for (const std::string& line : ShadowedRules(*file)) {
    logger_->Warning("reload: %s: %s", rules_path_.c_str(), line.c_str());
  }
  if (!Install(file->rules, /*at_start=*/false)) {
    logger_->Warning(
        "reload: the zone lock stayed busy; the rules in force stay (run "
        "trafficrate reload again)");
    return kReloadBusy;
  }
  logger_->Notice(
      "reload: %zu rule(s) from %s, for the connections accepted from now on",
      file->rules.size(), rules_path_.c_str());
  return kReloadOk;
}

void RuleSet::ReloadIfAsked(uint32_t proc) {
  const uint32_t rules =
      zone_->header().rules_generation.load(std::memory_order_acquire);
  if (rules == generation_seen_.load(std::memory_order_relaxed)) return;
  int err = 0;
  const ReloadStatus status =
      rules_path_.empty() ? kReloadNoFile : Reload(&err);
  // After the new table is published (or the old one kept): connections
  // accepted meanwhile waited for this (Stale).
  generation_seen_.store(rules, std::memory_order_release);
  // What `trafficrate reload` waits for.
  if (proc < zone_->procs().capacity()) {
    ProcSlotShm& slot = zone_->procs().slot(proc);
    slot.rules_errno.store(static_cast<uint16_t>(err),
                           std::memory_order_relaxed);
    slot.rules_status.store(status, std::memory_order_relaxed);
    slot.rules_seen.store(rules, std::memory_order_release);
  }
}

}  // namespace trafficrate
