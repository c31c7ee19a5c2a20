// The commands that read or change a zone: trafficrate stat, set, reload,
// gc and rm (top is in top.cc).

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "src/base/clock.h"
#include "src/base/units.h"
#include "src/config/config.h"
#include "src/config/rules_file.h"
#include "src/shm/snapshot.h"
#include "src/shm/zone.h"
#include "src/shm/zone_file.h"
#include "tools/cli.h"
#include "tools/format.h"

namespace trafficrate {
namespace {

// Names the zone and attaches to it (never creates one).
bool OpenZone(const char* command, const ParsedArgs& args,
              std::unique_ptr<Zone>* zone, int* exit_code) {
  std::string name;
  if (!ZoneName(command, args, &name, exit_code)) return false;
  absl::StatusOr<std::unique_ptr<Zone>> attached = Zone::Attach(name);
  if (!attached.ok()) {
    *exit_code = Failure(std::string(attached.status().message()));
    return false;
  }
  *zone = std::move(*attached);
  return true;
}

}  // namespace

int StatCommand(const std::vector<std::string>& raw) {
  ParsedArgs args;
  std::unique_ptr<Zone> zone;
  int rc = kExitOk;
  StatOptions options;
  if (!Parse("stat", raw, false, &args, &rc) ||
      !NoPositionals("stat", args, &rc)) {
    return rc;
  }
  if (args.Has("--json") && args.Has("--prometheus")) {
    return UsageError("stat", "--json and --prometheus exclude each other");
  }
  if (args.Has("--top") &&
      (!absl::SimpleAtoi(args.Get("--top", ""), &options.top) ||
       options.top == 0)) {
    return UsageError("stat", "--top: give a positive number of keys");
  }
  const std::string sort = args.Get("--sort", "active");
  if (sort != "active" && sort != "bytes") {
    return UsageError("stat", "--sort: use active or bytes");
  }
  options.sort = sort == "bytes" ? SortBy::kBytes : SortBy::kActive;
  if (!OpenZone("stat", args, &zone, &rc)) return rc;
  absl::StatusOr<ZoneSnapshot> snap = TakeSnapshot(*zone);
  if (!snap.ok()) return Failure(std::string(snap.status().message()));
  const std::string out = args.Has("--json") ? FormatStatJson(*snap, options)
                          : args.Has("--prometheus")
                              ? FormatStatPrometheus(*snap, options)
                              : FormatStatTable(*snap, options);
  std::fputs(out.c_str(), stdout);
  return kExitOk;
}

int SetCommand(const std::vector<std::string>& raw) {
  ParsedArgs args;
  std::unique_ptr<Zone> zone;
  int rc = kExitOk;
  if (!Parse("set", raw, false, &args, &rc)) return rc;
  if (args.positional.size() != 1) {
    return UsageError("set", "give one RATE, e.g. trafficrate set 1m");
  }
  absl::StatusOr<uint64_t> rate = ParseRate(args.positional[0]);
  if (!rate.ok()) {
    // The parser names the variable; here the value is the RATE argument.
    std::string message(rate.status().message());
    const std::string prefix = absl::StrCat(kEnvRate, ": ");
    if (absl::StartsWith(message, prefix)) {
      message = absl::StrCat("RATE ", message.substr(prefix.size()));
    }
    return UsageError("set", message);
  }
  if (!OpenZone("set", args, &zone, &rc)) return rc;
  // The rules in use: rule 0 always, the others while they have a rate.
  std::vector<std::string> names;
  for (uint32_t r = 0; r < kZoneRules; ++r) {
    if (r == 0 || zone->settings().RuleRate(r) != 0)
      names.push_back(zone->settings().RuleName(r));
  }
  const bool has_rules = names.size() > 1 || names[0] != "default";
  uint32_t rule = 0;
  if (args.Has("--rule")) {
    rule = zone->settings().FindRule(args.Get("--rule", ""));
    if (rule == kNoSlot) {
      return Failure(absl::StrFormat(
          "set: zone %s has no rule \"%s\"; its "
          "rules: %s",
          zone->name(), args.Get("--rule", ""), absl::StrJoin(names, ", ")));
    }
  } else if (has_rules) {
    return UsageError(
        "set", absl::StrFormat("zone %s has rules (%s): name one with --rule "
                               "NAME",
                               zone->name(), absl::StrJoin(names, ", ")));
  }
  const uint64_t old = zone->settings().RuleRate(rule);
  zone->settings().SetRuleRate(rule, *rate);
  absl::StatusOr<ZoneSnapshot> snap = TakeSnapshot(*zone);
  std::printf(
      "zone %s%s: rate %s (%llu B/s) -> %s (%llu B/s), applied by %zu "
      "server processes\n",
      zone->name().c_str(),
      has_rules
          ? absl::StrCat(", rule ", zone->settings().RuleName(rule)).c_str()
          : "",
      HumanRate(old).c_str(), static_cast<unsigned long long>(old),
      HumanRate(*rate).c_str(), static_cast<unsigned long long>(*rate),
      snap.ok() ? LiveProcesses(*snap) : 0);
  return kExitOk;
}

namespace {

// How long `reload` waits for every process's watcher to answer.
constexpr int64_t kReloadWaitNs = 2 * kNsPerSec;

// Waits for the processes' answers to reload `generation` and says what
// each did: 0 if every one read its rules file, else 1.
int ReportReload(const Zone& zone, const std::vector<uint32_t>& procs,
                 uint32_t generation, const std::string& config) {
  const auto answered = [&](uint32_t i) {
    const ProcSlotShm& p = zone.procs().slot(i);
    return p.rules_seen.load(std::memory_order_acquire) == generation ||
           p.state.load(std::memory_order_acquire) != kProcLive ||
           ProcTable::MaybeDead(p);
  };
  const int64_t deadline = MonotonicNowNs() + kReloadWaitNs;
  while (MonotonicNowNs() < deadline &&
         !std::all_of(procs.begin(), procs.end(), answered)) {
    SleepNs(10 * kNsPerMs);
  }
  const std::string file = config.empty()
                               ? "its rules file"
                               : absl::StrCat("the rules file ", config);
  size_t ok = 0;
  std::vector<std::string> problems;
  for (const uint32_t i : procs) {
    const ProcSlotShm& p = zone.procs().slot(i);
    const int32_t pid = p.pid.load(std::memory_order_relaxed);
    const std::string user = DescribeUser(p.uid.load());
    if (p.state.load(std::memory_order_acquire) != kProcLive ||
        ProcTable::MaybeDead(p)) {
      continue;  // exited meanwhile
    }
    if (p.rules_seen.load(std::memory_order_acquire) != generation) {
      problems.push_back(absl::StrFormat(
          "process %d (user %s) did not answer within %d s (stopped?): it "
          "reads %s again when it runs",
          pid, user, kReloadWaitNs / kNsPerSec, file));
      continue;
    }
    switch (p.rules_status.load(std::memory_order_relaxed)) {
      case kReloadOk:
        ++ok;
        break;
      case kReloadNoFile:
        problems.push_back(absl::StrFormat(
            "process %d (user %s) has no rules file (TRAFFICRATE_CONFIG is "
            "unset for it): nothing to reload there",
            pid, user));
        break;
      case kReloadUnreadable:
        problems.push_back(absl::StrFormat(
            "process %d (user %s) cannot read %s (%s): it keeps the rules in "
            "force; make the file readable by user %s (a server's workers "
            "read it as the user they run as)",
            pid, user, file, strerror(p.rules_errno.load()), user));
        break;
      case kReloadInvalid:
        problems.push_back(absl::StrFormat(
            "process %d (user %s) found %s invalid: it keeps the rules in "
            "force (its log says why; `trafficrate check --config FILE` too)",
            pid, user, file));
        break;
      default:
        problems.push_back(absl::StrFormat(
            "process %d (user %s) could not install the rules (the zone lock "
            "stayed busy): it keeps the rules in force; run reload again",
            pid, user));
        break;
    }
  }
  std::printf(
      "zone %s: %zu of %zu server process%s read %s again (for the "
      "connections they accept from now on)\n",
      zone.name().c_str(), ok, procs.size(), procs.size() == 1 ? "" : "es",
      file.c_str());
  for (const std::string& line : problems) {
    std::fprintf(stderr, "trafficrate: reload: %s\n", line.c_str());
  }
  return problems.empty() ? kExitOk : kExitFailed;
}

}  // namespace

int ReloadCommand(const std::vector<std::string>& raw) {
  ParsedArgs args;
  std::unique_ptr<Zone> zone;
  int rc = kExitOk;
  if (!Parse("reload", raw, false, &args, &rc) ||
      !NoPositionals("reload", args, &rc)) {
    return rc;
  }
  if (args.Has("--config")) {
    absl::StatusOr<RulesFile> file = ReadRulesFile(args.Get("--config", ""));
    if (!file.ok()) {
      return Failure(absl::StrCat("reload: ", file.status().message(),
                                  "; nothing reloaded"));
    }
    const std::vector<std::string> shadowed = ShadowedRules(*file);
    if (!shadowed.empty()) {
      return Failure(absl::StrCat("reload: ", file->path, ": ",
                                  shadowed.front(), "; nothing reloaded"));
    }
  }
  if (!OpenZone("reload", args, &zone, &rc)) return rc;
  // The live processes now: each one's watcher answers in its slot.
  std::vector<uint32_t> procs;
  for (uint32_t i = 0; i < zone->procs().capacity(); ++i) {
    const ProcSlotShm& p = zone->procs().slot(i);
    if (p.state.load(std::memory_order_acquire) == kProcLive &&
        !ProcTable::MaybeDead(p)) {
      procs.push_back(i);
    }
  }
  if (procs.empty()) {
    return Failure(absl::StrFormat(
        "reload: zone %s has no live server process: nothing reloaded",
        zone->name()));
  }
  const uint32_t generation =
      zone->header().rules_generation.fetch_add(1, std::memory_order_acq_rel) +
      1;
  zone->changes().WakeWatchers();
  return ReportReload(*zone, procs, generation, args.Get("--config", ""));
}

int GcCommand(const std::vector<std::string>& raw) {
  ParsedArgs args;
  std::unique_ptr<Zone> zone;
  int rc = kExitOk;
  if (!Parse("gc", raw, false, &args, &rc) || !NoPositionals("gc", args, &rc) ||
      !OpenZone("gc", args, &zone, &rc)) {
    return rc;
  }
  uint32_t procs = 0;
  const uint32_t conns = zone->ReapDead(&procs);
  std::printf("zone %s: released %u connection(s) of %u dead process(es)\n",
              zone->name().c_str(), conns, procs);
  return kExitOk;
}

namespace {

// rm of a zone that could not be read (corrupt, or of another layout):
// "removed <what> NAME (PATH); <after>".
int UnlinkUnread(const std::string& name, const char* what, const char* after) {
  absl::StatusOr<std::string> path = ZoneSegment::Locate(name);
  const absl::Status removed =
      path.ok() ? ZoneSegment::UnlinkPath(*path) : path.status();
  if (!removed.ok()) return Failure(absl::StrCat("rm: ", removed.message()));
  std::printf("removed %s %s (%s); %s\n", what, name.c_str(), path->c_str(),
              after);
  return kExitOk;
}

}  // namespace

int RmCommand(const std::vector<std::string>& raw) {
  ParsedArgs args;
  std::unique_ptr<Zone> zone;
  int rc = kExitOk;
  std::string name;
  if (!Parse("rm", raw, false, &args, &rc) || !NoPositionals("rm", args, &rc) ||
      !ZoneName("rm", args, &name, &rc)) {
    return rc;
  }
  absl::StatusOr<std::unique_ptr<Zone>> attached = Zone::Attach(name);
  if (!attached.ok() && ZoneSegment::IsCorruptZone(attached.status())) {
    // Nothing in it can be trusted, not even its process table: the
    // processes using it pass through already.
    return UnlinkUnread(name, "corrupt zone",
                        "servers still using it pass through unpaced until "
                        "they restart");
  }
  if (!attached.ok() && ZoneSegment::IsOtherLayout(attached.status())) {
    // Its process table cannot be read: only the operator knows whether the
    // servers of the other version have stopped (an upgrade).
    if (!args.Has("--force")) {
      return Failure(
          absl::StrCat("rm: ", attached.status().message(),
                       " (its processes cannot be listed by this version)"));
    }
    return UnlinkUnread(name, "zone",
                        "it was made by another trafficrate version; servers "
                        "still using it keep it until they exit");
  }
  if (!attached.ok()) return Failure(std::string(attached.status().message()));
  zone = std::move(*attached);
  absl::StatusOr<ZoneSnapshot> snap = TakeSnapshot(*zone);
  std::vector<int32_t> pids;
  if (snap.ok()) {
    for (const ProcSnapshot& p : snap->processes) {
      if (p.alive) pids.push_back(p.pid);
    }
  }
  if (!pids.empty() && !args.Has("--force")) {
    return Failure(absl::StrFormat(
        "rm: zone %s is in use by %zu live process(es) (pid %s); stop them "
        "first, or use --force",
        zone->name(), pids.size(), absl::StrJoin(pids, ", ")));
  }
  const absl::Status removed = ZoneSegment::UnlinkPath(zone->path());
  if (!removed.ok()) {
    return Failure(absl::StrCat("rm: ", removed.message()));
  }
  std::printf("removed zone %s (%s)%s\n", zone->name().c_str(),
              zone->path().c_str(),
              pids.empty() ? ""
                           : absl::StrFormat("; %zu process(es) keep using it "
                                             "until they exit",
                                             pids.size())
                                 .c_str());
  return kExitOk;
}

}  // namespace trafficrate
