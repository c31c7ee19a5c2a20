// trafficrate run and check: the configuration a server would get, checked
// with the library's own parser, and the server started under the library.

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "src/base/units.h"
#include "src/config/cluster_url.h"
#include "src/config/config.h"
#include "src/config/rules_file.h"
#include "src/net/address.h"
#include "src/shm/zone.h"
#include "src/shm/zone_file.h"
#include "tools/cli.h"
#include "tools/format.h"
#include "tools/program_check.h"

namespace trafficrate {
namespace {

// The installed library, found from this program's place so that an
// unpacked or relocated tree finds its own: <bindir>/<the configured libdir
// relative to bindir> (../lib/x86_64-linux-gnu with the prefix /usr),
// <prefix>/lib, the build tree's own directory, and last the configured
// library directory itself.
std::string FindLibrary() {
  std::vector<std::string> candidates;
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    std::string dir(exe);
    dir.resize(dir.rfind('/'));
    candidates = {
        absl::StrCat(dir, "/", TRAFFICRATE_LIBDIR_FROM_BINDIR,
                     "/libtrafficrate.so"),
        absl::StrCat(dir, "/../lib/libtrafficrate.so"),
        absl::StrCat(dir, "/libtrafficrate.so"),
    };
  }
  candidates.push_back(TRAFFICRATE_LIBRARY_PATH);
  for (const std::string& candidate : candidates) {
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
  if (!Parse("run", raw, true, &args, &rc) ||
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
  // It still runs: a launcher may start a program the library can pace.
  if (const std::string line =
          NotPacedLine(args.command[0], config->log == LogTarget::kStderr);
      !line.empty()) {
    std::fprintf(stderr, "trafficrate: %s\n", line.c_str());
  }
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
  if (spec.v4_prefix == kV4Bits && spec.v6_prefix == kV6Bits) {
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

// The zone: its room, where it is (or would be made) and who owns it, and
// whether a server with this configuration could use it.
std::string ZoneInWords(const Config& config) {
  const ZoneGeometry g = ComputeZoneGeometry(config.zone_size_bytes);
  std::string text = absl::StrFormat(
      "%s, %s: room for %u client keys, %u connections, %u processes",
      config.zone_name, HumanBytes(config.zone_size_bytes), g.key_capacity,
      g.conn_capacity, g.proc_capacity);
  const ZonePlaces places = ZonePlaces::ForUser(geteuid());
  ZonePlaceNotes notes;
  absl::StatusOr<ZoneFile> file =
      FindZoneFile(places, config.zone_name, &notes);
  if (absl::IsNotFound(file.status())) {
    const std::string dir = NewZoneDir(places, &notes);
    absl::StrAppendFormat(
        &text,
        "; not created yet: a server started now as user %s makes it "
        "in %s",
        DescribeUser(places.uid), dir);
  } else if (!file.ok()) {
    return absl::StrCat(text, "; WARNING: ", file.status().message());
  } else {
    absl::StrAppendFormat(&text, "; %s, %s", file->path(),
                          DescribeOwner(file->fd()));
  }
  if (const std::string line = notes.Line(config.zone_name); !line.empty()) {
    absl::StrAppend(&text, "; ", line);
  }
  if (!file.ok()) return text;
  absl::StatusOr<std::unique_ptr<Zone>> zone = Zone::AttachPath(file->path());
  if (!zone.ok()) {
    return absl::StrCat(text, "; WARNING: ", zone.status().message());
  }
  const ZoneHeaderShm& h = (*zone)->header();
  if (h.zone_size != config.zone_size_bytes ||
      DescribeKeySpec((*zone)->settings().key_spec()) !=
          DescribeKeySpec(config.key)) {
    return absl::StrFormat(
        "%s; WARNING: the existing zone has size %s and key %s, so a server "
        "with this configuration would run unpaced",
        text, HumanBytes(h.zone_size),
        DescribeKeySpec((*zone)->settings().key_spec()));
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

// What holds for every rule: share mode, burst, log, inherited, shape,
// strict.
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
      out, "  shape   %s\n",
      config.shape
          ? "on: connections paced below 2.5 MB/s send small MSG_EOR pieces, "
            "and every connection's first bytes go as 100-byte pieces"
          : "off: every send goes to the kernel as the server made it "
            "(TRAFFICRATE_SHAPE=0)");
  absl::StrAppendFormat(
      out, "  strict  %s\n",
      config.strict ? "yes: a bad configuration stops the server at start-up"
                    : "no: a bad configuration leaves the server unpaced");
  if (!config.cluster) {
    absl::StrAppend(out,
                    "  cluster none: each key's rate is this host's alone "
                    "(set TRAFFICRATE_CLUSTER to share it across hosts)\n");
  } else {
    absl::StrAppendFormat(
        out,
        "  cluster %s, name %s, this host %s: each key's rate is shared "
        "with the other hosts there (client keys hashed with "
        "TRAFFICRATE_CLUSTER_SECRET); while Redis is away the last shares "
        "reach the full local rate in %s\n",
        DescribeClusterUrl(config.cluster_url), config.cluster_name,
        ClusterHostId(config.cluster_host, config.zone_name),
        FormatDurationNs(config.cluster_decay_ns));
  }
}

}  // namespace

int CheckCommand(const std::vector<std::string>& raw) {
  ParsedArgs args;
  int rc = kExitOk;
  if (!Parse("check", raw, true, &args, &rc) ||
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
  // A program the library cannot pace (or that cannot run) fails the check.
  const std::string program_problem =
      args.command.empty() ? "" : DescribeProgram(args.command[0], &out);
  std::fputs(out.c_str(), stdout);
  if (!program_problem.empty()) {
    std::fprintf(stderr, "trafficrate: %s\n", program_problem.c_str());
  }
  if (const std::vector<std::string> shadowed = Shadowed(*config);
      !shadowed.empty()) {
    for (const std::string& line : shadowed) {
      std::fprintf(stderr, "trafficrate: %s\n", line.c_str());
    }
    return kExitFailed;
  }
  return program_problem.empty() ? kExitOk : kExitFailed;
}

}  // namespace trafficrate
