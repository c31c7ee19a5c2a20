// trafficrate run, check, stat, set, gc and rm (top is in top.cc).

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "src/config.h"
#include "src/rules_file.h"
#include "src/snapshot.h"
#include "src/units.h"
#include "src/zone.h"
#include "tools/cli.h"
#include "tools/format.h"

namespace trafficrate {
namespace {

constexpr OptionSpec kConfigSpecs[] = {
    {"--rate", true},          {"--key", true},     {"--zone", true},
    {"--zone-size", true},     {"--idle", true},    {"--log", true},
    {"--ports", true},         {"--exempt", true},  {"--after", true},
    {"--share", true},         {"--burst", true},   {"--strict", false},
    {"--no-inherited", false}, {"--library", true}, {"--config", true},
};

constexpr char kConfigOptionsHelp[] =
    R"(  --rate R        per-client rate in bytes/s; k = x1024, m = x1024^2
                  (TRAFFICRATE_RATE)
  --key K         peer | peer/N | peer/N,M | local | all (TRAFFICRATE_KEY)
  --zone NAME     zone name (TRAFFICRATE_ZONE, default "default")
  --zone-size S   zone size, e.g. 32m (TRAFFICRATE_ZONE_SIZE, default 1m)
  --idle D        a connection idle this long stops taking a share, e.g.
                  200ms (TRAFFICRATE_IDLE)
  --log L         stderr | syslog | off | /path (TRAFFICRATE_LOG)
  --ports P       only govern connections accepted on these local ports,
                  e.g. 80,443 (TRAFFICRATE_PORTS)
  --exempt C      never govern these clients, e.g. 10.0.0.0/8,::1
                  (TRAFFICRATE_EXEMPT)
  --after N       bytes each connection sends before pacing starts, e.g.
                  1m (TRAFFICRATE_AFTER)
  --share M       equal: rate/active per sending connection, always (the
                  default); budget: a shared byte budget per client, measured
                  across processes, no cap while the client is under its rate
                  (TRAFFICRATE_SHARE)
  --burst N       budget mode: unused allowance a client may bank, e.g. 64k
                  (TRAFFICRATE_BURST, default 50 ms of the rate, >= 16k)
  --strict        a bad configuration stops the server at start-up
                  (TRAFFICRATE_STRICT=1)
  --no-inherited  leave alone the client connections the server inherits at
                  start-up (inetd, systemd Accept=yes), which are governed
                  by default (TRAFFICRATE_INHERITED=0)
  --config FILE   a rules file: named rules, each with its own listen ports,
                  clients, exempt, key, rate, after and burst, in place of
                  --rate, --key, --ports, --exempt, --after and --burst
                  (TRAFFICRATE_CONFIG; see README, "Rules file")
)";

const std::string kRunHelp = absl::StrCat(
    R"(usage: trafficrate run [OPTIONS] -- COMMAND [ARGS...]

Runs COMMAND with libtrafficrate.so preloaded (LD_PRELOAD) and configured:
every connection it accepts shares its client's rate with that client's other
connections, across all of the server's processes. Options set the
TRAFFICRATE_* variables; variables already set are kept unless an option
overrides them. A rate (or a rules file, --config) is required; a rules file
with a rule that can never match is refused.

)",
    kConfigOptionsHelp,
    R"(  --library P     the libtrafficrate.so to load (default: ../lib/ beside
                  this program, or this program's directory)

example: trafficrate run --rate 500k -- nginx -g 'daemon off;'
)");

const std::string kCheckHelp = absl::StrCat(
    R"(usage: trafficrate check [OPTIONS]

Validates the configuration a server would get (the TRAFFICRATE_* variables
of this environment, overridden by the options) and prints what it means;
with a rules file (--config), its rules in the order the library applies
them. Exits 1 with the library's own message if it is invalid, or with a
warning naming both rules if a rule can never match (an earlier one takes
every connection it would).

)",
    kConfigOptionsHelp);

constexpr char kStatHelp[] =
    R"(usage: trafficrate stat [--zone NAME] [--json | --prometheus] [--top N]
                        [--sort active|bytes]

Shows a zone: its rate and capacity, and per client key the active (sending)
and registered connections, the current share of each sending connection,
bytes sent, connections served and last activity.

  --zone NAME     the zone (default: $TRAFFICRATE_ZONE, else "default")
  --json          one JSON document (exact figures; see README)
  --prometheus    Prometheus text exposition (trafficrate_* metrics)
  --top N         only the N first keys
  --sort S        active (default: most sending connections first) or bytes
)";

constexpr char kSetHelp[] =
    R"(usage: trafficrate set [--zone NAME] [--rule NAME] RATE

Changes a running zone's per-client rate, e.g. `trafficrate set 1m`. Every
server process applies it to its sending connections within milliseconds. A
server started later with TRAFFICRATE_RATE (or a rules file) sets the rates
again. A zone whose server has a rules file takes the rule to change.

  --zone NAME     the zone (default: $TRAFFICRATE_ZONE, else "default")
  --rule NAME     the rule of the rules file whose rate to change
)";

constexpr char kReloadHelp[] =
    R"(usage: trafficrate reload [--zone NAME] [--config FILE]

Makes every server process of a zone read its rules file (TRAFFICRATE_CONFIG)
again, without signalling it: the connections each accepts from then on
follow the new rules; existing connections keep their rule, whose rate the
file may change. A rule keeps its place by name; a new one takes a free one
of the zone's 16. A process that cannot read the file logs one line and
keeps the rules in force.

  --zone NAME     the zone (default: $TRAFFICRATE_ZONE, else "default")
  --config FILE   check FILE first (it should be the servers' file) and
                  reload only if it is valid and every rule can match
)";

constexpr char kGcHelp[] =
    R"(usage: trafficrate gc [--zone NAME]

Releases the connections registered by processes that died without closing
them (killed with SIGKILL, crashed). Live server processes do this by
themselves within a second; gc is for a zone no live process watches.

  --zone NAME     the zone (default: $TRAFFICRATE_ZONE, else "default")
)";

constexpr char kRmHelp[] =
    R"(usage: trafficrate rm [--zone NAME] [--force]

Removes a zone (/dev/shm/trafficrate.NAME). Refused while live processes are
registered in it, unless --force: they keep using it until they exit, and
servers started afterwards create a new, separate zone. A corrupt zone (see
stat) is removed without --force: its processes pass through already.

  --zone NAME     the zone (default: $TRAFFICRATE_ZONE, else "default")
  --force         remove it even though processes use it
)";

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

// The library beside this program: <prefix>/bin/trafficrate ->
// <prefix>/lib/libtrafficrate.so, or the build tree's own directory.
std::string FindLibrary() {
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "";
  exe[n] = '\0';
  std::string dir(exe);
  dir.resize(dir.rfind('/'));
  for (const std::string& candidate :
       {absl::StrCat(dir, "/../lib/libtrafficrate.so"),
        absl::StrCat(dir, "/libtrafficrate.so")}) {
    char resolved[PATH_MAX];
    if (realpath(candidate.c_str(), resolved) != nullptr) return resolved;
  }
  return "";
}

// The rules of a rules file that can never match, as one line each naming
// the file and both rules.
std::vector<std::string> Shadowed(const Config& config) {
  std::vector<std::string> lines;
  for (const std::string& line :
       ShadowedRules(RulesFile{config.rules_path, config.rules})) {
    lines.push_back(absl::StrCat(config.rules_path, ": ", line));
  }
  return lines;
}

absl::StatusOr<Config> ParseEnvironment(
    const std::map<std::string, std::string>& env) {
  return ParseConfig([&env](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

}  // namespace

int RunCommand(const std::vector<std::string>& raw) {
  ParsedArgs args;
  int rc = kExitOk;
  if (!Parse("run", raw, kConfigSpecs, true, kRunHelp, &args, &rc) ||
      !NoPositionals("run", args, &rc)) {
    return rc;
  }
  if (args.command.empty()) {
    return UsageError("run",
                      "give the server after --, e.g. trafficrate run "
                      "--rate 500k -- nginx");
  }
  const std::map<std::string, std::string> env =
      ConfigEnvironment(args, TrafficrateEnvironment());
  if (env.count(kEnvRate) == 0 && env.count(kEnvConfig) == 0) {
    return UsageError("run",
                      "--rate or --config is required (e.g. --rate 500k)");
  }
  absl::StatusOr<Config> config = ParseEnvironment(env);
  if (!config.ok()) {
    return UsageError("run",
                      ForOptions(args, std::string(config.status().message())));
  }
  if (const std::vector<std::string> shadowed = Shadowed(*config);
      !shadowed.empty()) {
    return Failure(absl::StrCat("run: ", shadowed.front()));
  }
  std::string library = args.Get("--library", "");
  if (library.empty()) library = FindLibrary();
  if (library.empty() || access(library.c_str(), R_OK) != 0) {
    return Failure(absl::StrCat(
        "run: cannot read libtrafficrate.so (",
        library.empty() ? "not found beside this program" : library,
        "); give it with --library PATH"));
  }
  for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
  const char* preload = getenv("LD_PRELOAD");
  const std::string value = preload != nullptr && *preload != '\0'
                                ? absl::StrCat(library, ":", preload)
                                : library;
  setenv("LD_PRELOAD", value.c_str(), 1);
  std::vector<char*> argv;
  for (const std::string& a : args.command) {
    argv.push_back(const_cast<char*>(a.c_str()));
  }
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  return Failure(absl::StrCat("run: cannot execute ", args.command[0], ": ",
                              strerror(errno)));
}

namespace {

std::string KeyInWords(const KeySpec& spec) {
  switch (spec.mode) {
    case KeyMode::kLocal:
      return "one bucket per server address and port (local)";
    case KeyMode::kAll:
      return "one bucket for all clients together (all)";
    case KeyMode::kPeer:
      break;
  }
  if (spec.v4_prefix == 32 && spec.v6_prefix == 128) {
    return "one bucket per client IP address; IPv4-mapped IPv6 counts as "
           "IPv4 (peer)";
  }
  return absl::StrFormat(
      "one bucket per client network: IPv4 /%d, IPv6 /%d (%s)", spec.v4_prefix,
      spec.v6_prefix, DescribeKeySpec(spec));
}

std::string LogInWords(const Config& config) {
  switch (config.log) {
    case LogTarget::kStderr:
      return "stderr";
    case LogTarget::kSyslog:
      return "syslog (facility daemon)";
    case LogTarget::kOff:
      return "off";
    case LogTarget::kFile:
      break;
  }
  return absl::StrCat("appended to ", config.log_path);
}

std::string ZoneInWords(const Config& config) {
  const ZoneGeometry g = ComputeZoneGeometry(config.zone_size_bytes);
  std::string text = absl::StrFormat(
      "%s (%s), %s: room for %u client keys, %u connections, %u processes",
      config.zone_name, absl::StrCat("/dev/shm", ZoneShmName(config.zone_name)),
      HumanBytes(config.zone_size_bytes), g.key_capacity, g.conn_capacity,
      g.proc_capacity);
  absl::StatusOr<std::unique_ptr<Zone>> zone = Zone::Attach(config.zone_name);
  if (!zone.ok()) return absl::StrCat(text, "; not created yet");
  const ZoneHeaderShm& h = (*zone)->header();
  if (h.zone_size != config.zone_size_bytes ||
      DescribeKeySpec((*zone)->key_spec()) != DescribeKeySpec(config.key)) {
    return absl::StrFormat(
        "%s; WARNING: the existing zone has size %s and key %s, so a server "
        "with this configuration would run unpaced",
        text, HumanBytes(h.zone_size), DescribeKeySpec((*zone)->key_spec()));
  }
  return absl::StrFormat("%s; exists, rate now %s", text,
                         HumanRate(h.rate_bytes_per_sec.load()));
}

// The single rule of TRAFFICRATE_RATE, _KEY, _PORTS, _EXEMPT and _AFTER.
void AppendSingleRule(const Config& config, std::string* out) {
  absl::StrAppendFormat(out, "  key     %s\n", KeyInWords(config.key));
  absl::StrAppendFormat(
      out, "  ports   %s\n",
      config.ports.empty()
          ? "connections accepted on every local port are governed"
          : absl::StrCat("only connections accepted on local port(s) ",
                         FormatPorts(config.ports), " are governed"));
  std::vector<std::string> exempt;
  for (const Cidr& c : config.exempt) exempt.push_back(FormatCidr(c));
  absl::StrAppendFormat(
      out, "  exempt  %s\n",
      exempt.empty()
          ? "none: every client is governed"
          : absl::StrCat(absl::StrJoin(exempt, ", "), " never governed"));
  absl::StrAppendFormat(
      out, "  after   %s\n",
      config.after_bytes == 0
          ? "0: paced from the first byte"
          : absl::StrFormat("each connection's first %s (%u bytes) unpaced",
                            HumanBytes(config.after_bytes),
                            config.after_bytes));
}

// What holds for every rule: share mode, burst, log, inherited, strict.
void AppendSharedSettings(const Config& config, std::string* out) {
  absl::StrAppendFormat(
      out, "  share   %s\n",
      config.share == ShareMode::kEqual
          ? "equal: each sending connection gets rate / active, always "
            "(TRAFFICRATE_SHARE=equal)"
          : "budget: a shared byte budget per key, measured across "
            "processes; no cap while the key is clearly under its rate, "
            "max-min fair levels near it, debts repaid "
            "(TRAFFICRATE_SHARE=budget)");
  if (config.share == ShareMode::kBudget && config.rules.empty()) {
    const uint64_t burst = config.burst_bytes != 0
                               ? config.burst_bytes
                               : DefaultBurstBytes(config.rate_bytes_per_sec);
    absl::StrAppendFormat(
        out, "  burst   %s (%u bytes) a key may bank while under its rate%s\n",
        HumanBytes(burst), burst,
        config.burst_bytes != 0 ? "" : " (default: 50 ms of the rate)");
  }
  absl::StrAppendFormat(out, "  log     %s\n", LogInWords(config));
  absl::StrAppendFormat(
      out, "  inherited %s\n",
      config.inherited
          ? "client connections inherited at start-up (inetd, systemd "
            "Accept=yes) are governed"
          : "connections inherited at start-up are left alone "
            "(TRAFFICRATE_INHERITED=0)");
  absl::StrAppendFormat(
      out, "  strict  %s\n",
      config.strict ? "yes: a bad configuration stops the server at start-up"
                    : "no: a bad configuration leaves the server unpaced");
}

}  // namespace

int CheckCommand(const std::vector<std::string>& raw) {
  ParsedArgs args;
  int rc = kExitOk;
  if (!Parse("check", raw, kConfigSpecs, false, kCheckHelp, &args, &rc) ||
      !NoPositionals("check", args, &rc)) {
    return rc;
  }
  const std::map<std::string, std::string> env =
      ConfigEnvironment(args, TrafficrateEnvironment());
  absl::StatusOr<Config> config = ParseEnvironment(env);
  if (!config.ok()) return Failure(std::string(config.status().message()));
  std::string out = "trafficrate configuration:\n";
  if (!config->rules.empty()) {
    absl::StrAppendFormat(
        &out,
        "  rules   %s (TRAFFICRATE_CONFIG): %zu rule(s); a connection is "
        "governed by the first that matches it at accept\n",
        config->rules_path, config->rules.size());
    for (absl::string_view line : absl::StrSplit(
             FormatRules(RulesFile{config->rules_path, config->rules}), '\n',
             absl::SkipEmpty())) {
      absl::StrAppend(&out, "    ", line, "\n");
    }
  } else if (config->enabled) {
    absl::StrAppendFormat(&out,
                          "  rate    %s (%u B/s) per client key, shared by "
                          "its sending connections (TRAFFICRATE_RATE=%s)\n",
                          HumanRate(config->rate_bytes_per_sec),
                          config->rate_bytes_per_sec, env.at(kEnvRate));
  } else {
    absl::StrAppend(&out,
                    "  rate    unset: the library does nothing (set "
                    "TRAFFICRATE_RATE or --rate)\n");
  }
  if (config->rules.empty()) {
    AppendSingleRule(*config, &out);
  }
  absl::StrAppendFormat(&out, "  zone    %s\n", ZoneInWords(*config));
  absl::StrAppendFormat(&out,
                        "  idle    a connection that sends nothing for %s "
                        "stops taking a share\n",
                        FormatDurationNs(config->idle_ns));
  AppendSharedSettings(*config, &out);
  std::fputs(out.c_str(), stdout);
  if (const std::vector<std::string> shadowed = Shadowed(*config);
      !shadowed.empty()) {
    for (const std::string& line : shadowed) {
      std::fprintf(stderr, "trafficrate: %s\n", line.c_str());
    }
    return kExitFailed;
  }
  return kExitOk;
}

int StatCommand(const std::vector<std::string>& raw) {
  static constexpr OptionSpec kSpecs[] = {
      {"--zone", true}, {"--json", false}, {"--prometheus", false},
      {"--top", true},  {"--sort", true},
  };
  ParsedArgs args;
  std::unique_ptr<Zone> zone;
  int rc = kExitOk;
  StatOptions options;
  if (!Parse("stat", raw, kSpecs, false, kStatHelp, &args, &rc) ||
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
  static constexpr OptionSpec kSpecs[] = {{"--zone", true}, {"--rule", true}};
  ParsedArgs args;
  std::unique_ptr<Zone> zone;
  int rc = kExitOk;
  if (!Parse("set", raw, kSpecs, false, kSetHelp, &args, &rc)) return rc;
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
    if (r == 0 || zone->RuleRate(r) != 0) names.push_back(zone->RuleName(r));
  }
  const bool has_rules = names.size() > 1 || names[0] != "default";
  uint32_t rule = 0;
  if (args.Has("--rule")) {
    rule = zone->FindRule(args.Get("--rule", ""));
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
  const uint64_t old = zone->RuleRate(rule);
  zone->SetRuleRate(rule, *rate);
  absl::StatusOr<ZoneSnapshot> snap = TakeSnapshot(*zone);
  std::printf(
      "zone %s%s: rate %s (%llu B/s) -> %s (%llu B/s), applied by %zu "
      "server processes\n",
      zone->name().c_str(),
      has_rules ? absl::StrCat(", rule ", zone->RuleName(rule)).c_str() : "",
      HumanRate(old).c_str(), static_cast<unsigned long long>(old),
      HumanRate(*rate).c_str(), static_cast<unsigned long long>(*rate),
      snap.ok() ? LiveProcesses(*snap) : 0);
  return kExitOk;
}

int ReloadCommand(const std::vector<std::string>& raw) {
  static constexpr OptionSpec kSpecs[] = {{"--zone", true}, {"--config", true}};
  ParsedArgs args;
  std::unique_ptr<Zone> zone;
  int rc = kExitOk;
  if (!Parse("reload", raw, kSpecs, false, kReloadHelp, &args, &rc) ||
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
  absl::StatusOr<ZoneSnapshot> snap = TakeSnapshot(*zone);
  zone->header().rules_generation.fetch_add(1, std::memory_order_acq_rel);
  zone->WakeWatchers();
  std::printf(
      "zone %s: reload asked of %zu server processes; each reads its rules "
      "file again within about 20 ms and logs what it did\n",
      zone->name().c_str(), snap.ok() ? LiveProcesses(*snap) : 0);
  return kExitOk;
}

int GcCommand(const std::vector<std::string>& raw) {
  static constexpr OptionSpec kSpecs[] = {{"--zone", true}};
  ParsedArgs args;
  std::unique_ptr<Zone> zone;
  int rc = kExitOk;
  if (!Parse("gc", raw, kSpecs, false, kGcHelp, &args, &rc) ||
      !NoPositionals("gc", args, &rc) || !OpenZone("gc", args, &zone, &rc)) {
    return rc;
  }
  uint32_t procs = 0;
  const uint32_t conns = zone->ReapDead(&procs);
  std::printf("zone %s: released %u connection(s) of %u dead process(es)\n",
              zone->name().c_str(), conns, procs);
  return kExitOk;
}

int RmCommand(const std::vector<std::string>& raw) {
  static constexpr OptionSpec kSpecs[] = {{"--zone", true}, {"--force", false}};
  ParsedArgs args;
  std::unique_ptr<Zone> zone;
  int rc = kExitOk;
  std::string name;
  if (!Parse("rm", raw, kSpecs, false, kRmHelp, &args, &rc) ||
      !NoPositionals("rm", args, &rc) || !ZoneName("rm", args, &name, &rc)) {
    return rc;
  }
  absl::StatusOr<std::unique_ptr<Zone>> attached = Zone::Attach(name);
  if (!attached.ok() && Zone::IsCorruptZone(attached.status())) {
    // Nothing in it can be trusted, not even its process table: the
    // processes using it pass through already.
    const absl::Status removed = Zone::Unlink(name);
    if (!removed.ok()) return Failure(absl::StrCat("rm: ", removed.message()));
    std::printf(
        "removed corrupt zone %s (/dev/shm%s); servers still using it pass "
        "through unpaced until they restart\n",
        name.c_str(), ZoneShmName(name).c_str());
    return kExitOk;
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
  const std::string shm = absl::StrCat("/dev/shm", ZoneShmName(zone->name()));
  if (!pids.empty() && !args.Has("--force")) {
    return Failure(absl::StrFormat(
        "rm: zone %s is in use by %zu live process(es) (pid %s); stop them "
        "first, or use --force",
        zone->name(), pids.size(), absl::StrJoin(pids, ", ")));
  }
  const absl::Status removed = Zone::Unlink(zone->name());
  if (!removed.ok()) {
    return Failure(absl::StrCat("rm: ", removed.message()));
  }
  std::printf("removed zone %s (%s)%s\n", zone->name().c_str(), shm.c_str(),
              pids.empty() ? ""
                           : absl::StrFormat("; %zu process(es) keep using it "
                                             "until they exit",
                                             pids.size())
                                 .c_str());
  return kExitOk;
}

}  // namespace trafficrate
