// The rule set of one process: the rules file's rules as the accept path
// reads them (RuleTable), their install into the zone's rules, and
// `trafficrate reload`. A reload publishes a new table and retires the one
// before, which the watcher frees once no call reads a table: a server
// reloaded in a loop keeps at most the tables that calls in flight still
// read.
//
//   RuleSet rules(zone, logger, options.rules_path, options.after_bytes);
//   rules.Install(file_rules, /*at_start=*/true);     // init
//   { RuleSet::Read read(rules); Classify(..., read.table(), ...); }
//   rules.ReloadIfAsked(proc);                       // watcher, each loop
//   rules.FreeRetired(/*force=*/false);              // watcher, each loop
//
// Ownership: zone and logger must outlive the RuleSet. Thread safety: Read,
// Stale, AfterBytes and AnyAfter from any thread (hot path: no allocation,
// no lock, errno untouched); Install, Reload, ReloadIfAsked and FreeRetired
// from the watcher (or init) only.

#ifndef TRAFFICRATE_SRC_RUNTIME_RULE_SET_H_
#define TRAFFICRATE_SRC_RUNTIME_RULE_SET_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "src/base/log.h"
#include "src/config/rules_file.h"
#include "src/shm/zone.h"

namespace trafficrate {

// A rules file's rules as the accept path reads them, with the zone rule of
// each (kNoRuleSlot: unlimited, or no zone rule was free) and each zone
// rule's after. Immutable once published (RuleSet::Install).
struct RuleTable {
  std::vector<Rule> rules;
  std::vector<uint32_t> slots;
  uint64_t after_by_rule[kZoneRules] = {};
  uint64_t max_after = 0;
  // The next older retired table (RuleSet::retired_).
  mutable const RuleTable* previous = nullptr;
};

class RuleSet {
 public:
  // rules_path: TRAFFICRATE_CONFIG (empty: none, and after_bytes is the one
  // rule's TRAFFICRATE_AFTER). REQUIRES: zone and logger outlive it.
  RuleSet(Zone* zone, const Logger* logger, std::string rules_path,
          uint64_t after_bytes);
  // Frees every table. REQUIRES: no call reads one any more.
  ~RuleSet();
  RuleSet(const RuleSet&) = delete;
  RuleSet& operator=(const RuleSet&) = delete;

  // A read of the table in force (null: no rules file), counted, so that
  // the table stays valid while the Read lives. Hot path.
  class Read {
   public:
    explicit Read(const RuleSet& set) : set_(set) {
      set_.readers_.fetch_add(1, std::memory_order_seq_cst);
      table_ = set_.table_.load(std::memory_order_seq_cst);
    }
    ~Read() { set_.readers_.fetch_sub(1, std::memory_order_seq_cst); }
    Read(const Read&) = delete;
    Read& operator=(const Read&) = delete;
    const RuleTable* table() const { return table_; }

   private:
    const RuleSet& set_;
    const RuleTable* table_;
  };

  // Maps the rules to zone rules (MapRuleLocked), sets their rates, and
  // publishes the table for the accept path. At start-up the first rule
  // with a rate is the zone's rule 0. False if the zone lock could not be
  // had (the rules in force stay). Watcher or init only.
  bool Install(const std::vector<Rule>& rules, bool at_start);
  // Reads the file again; on error logs and keeps the rules in force.
  // Returns how it went (*err: the errno of a file it could not read).
  ReloadStatus Reload(int* err);
  // Once per watcher loop: if `trafficrate reload` moved the zone's
  // rules_generation, reloads (or says there is no file) and reports it in
  // process slot `proc` (what the command waits for).
  void ReloadIfAsked(uint32_t proc);
  // Frees the retired tables if no call reads a table now (or, with force,
  // at destruction). Watcher (or destructor) only.
  void FreeRetired(bool force);
  // Tables replaced by reloads and not freed yet (tests).
  int RetiredForTesting() const;

  // A rules file is in use and `trafficrate reload` asked for it to be read
  // again, which this process's watcher has not done yet. Hot path.
  bool Stale() const;
  // TRAFFICRATE_AFTER of the connection's rule (after_bytes without a
  // rules file). Hot path.
  uint64_t AfterBytes(const ConnSlotShm& conn) const;
  // Whether some rule sends its first bytes unpaced (TRAFFICRATE_AFTER).
  bool AnyAfter() const;

  // In the child after fork: no thread of the parent survives to end its
  // read of the table.
  void AfterForkChild() { readers_.store(0, std::memory_order_relaxed); }

 private:
  Zone* const zone_;
  const Logger* const logger_;
  const std::string rules_path_;
  const uint64_t after_bytes_;
  std::atomic<const RuleTable*> table_{nullptr};
  // Calls reading table_ now (Read), and the tables reloads replaced, freed
  // by the watcher once that count is 0 (seq_cst on both sides: a read that
  // begins after the count was seen 0 holds the newest).
  mutable std::atomic<int> readers_{0};
  std::atomic<const RuleTable*> retired_{nullptr};
  // The zone's rules_generation the table answers to (the watcher moves it
  // after each reload); while it lags, accepted connections wait for the
  // reload (Stale).
  std::atomic<uint32_t> generation_seen_{0};
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_RULE_SET_H_
