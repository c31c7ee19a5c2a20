#include "src/config/config.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "src/base/status_macros.h"
#include "src/config/rules.h"
#include "src/net/key.h"

namespace trafficrate {

// The configuration while ParseConfig reads the variables.
struct ConfigReading {
  Config config;
  // The first variable set that a rules file replaces (TRAFFICRATE_CONFIG).
  const char* replaced = nullptr;
  // The first TRAFFICRATE_CLUSTER_* variable set: the check that it has
  // TRAFFICRATE_CLUSTER comes last (CheckCluster).
  const char* cluster_companion_set = nullptr;
};

namespace {

// TRAFFICRATE_CLUSTER_SECRET, _NAME, _DECAY and _HOST.
constexpr char kClusterCompanionPrefix[] = "TRAFFICRATE_CLUSTER_";

constexpr char kConfigForm[] =
    "use the absolute path of a rules file, e.g. /etc/trafficrate/rules.conf";

// Each variable's reader: its parser, into its member.
template <typename T, typename Parsed>
absl::Status Store(absl::StatusOr<Parsed> parsed, T* member) {
  if (!parsed.ok()) return std::move(parsed).status();
  *member = *std::move(parsed);
  return absl::OkStatus();
}

absl::Status ReadRate(absl::string_view value, ConfigReading& r) {
  r.config.enabled = true;
  return Store(ParseRate(value), &r.config.rate_bytes_per_sec);
}
absl::Status ReadKey(absl::string_view value, ConfigReading& r) {
  return Store(ParseKeySpec(value), &r.config.key);
}
absl::Status ReadZone(absl::string_view value, ConfigReading& r) {
  return Store(ParseZoneName(value), &r.config.zone_name);
}
absl::Status ReadZoneSize(absl::string_view value, ConfigReading& r) {
  return Store(ParseZoneSize(value), &r.config.zone_size_bytes);
}
absl::Status ReadPorts(absl::string_view value, ConfigReading& r) {
  return Store(ParsePorts(value), &r.config.ports);
}
absl::Status ReadExempt(absl::string_view value, ConfigReading& r) {
  return Store(ParseExempt(value), &r.config.exempt);
}
absl::Status ReadAfter(absl::string_view value, ConfigReading& r) {
  return Store(ParseAfter(value), &r.config.after_bytes);
}
absl::Status ReadLog(absl::string_view value, ConfigReading& r) {
  return Store(ParseLogTarget(value, &r.config.log_path), &r.config.log);
}
absl::Status ReadStrict(absl::string_view value, ConfigReading& r) {
  return Store(ParseStrict(value), &r.config.strict);
}
absl::Status ReadIdle(absl::string_view value, ConfigReading& r) {
  return Store(ParseIdleNs(value), &r.config.idle_ns);
}
absl::Status ReadShare(absl::string_view value, ConfigReading& r) {
  return Store(ParseShare(value), &r.config.share);
}
absl::Status ReadBurst(absl::string_view value, ConfigReading& r) {
  return Store(ParseBurst(value), &r.config.burst_bytes);
}
absl::Status ReadInherited(absl::string_view value, ConfigReading& r) {
  return Store(ParseInherited(value), &r.config.inherited);
}
absl::Status ReadShape(absl::string_view value, ConfigReading& r) {
  return Store(ParseShape(value), &r.config.shape);
}

// TRAFFICRATE_CONFIG: reads the rules file into the configuration; an error
// if a variable it replaces is set too.
absl::Status ReadRules(absl::string_view value, ConfigReading& r) {
  Config* config = &r.config;
  if (value.empty() || value.front() != '/') {
    return VariableError(kEnvConfig, value, "is not an absolute path",
                         kConfigForm);
  }
  if (const char* also_set = r.replaced; also_set != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        kEnvConfig, ": ", also_set,
        " is set too; with a rules file each rule has its own rate, key, "
        "listen, exempt, after and burst: put them in the file and unset ",
        also_set));
  }
  absl::StatusOr<RulesFile> file = ReadRulesFile(std::string(value));
  if (!file.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kEnvConfig, ": ", file.status().message()));
  }
  config->rules_path = std::string(value);
  config->rules = std::move(file->rules);
  config->enabled = false;
  for (const Rule& rule : config->rules) {
    if (rule.unlimited) continue;
    config->enabled = true;
    config->rate_bytes_per_sec = rule.rate_bytes_per_sec;
    config->key = rule.key;
    config->burst_bytes = rule.burst_bytes;
    break;
  }
  return absl::OkStatus();
}

// A variable that names something in the zone name's form (the cluster, a
// host).
absl::Status ReadNamed(const char* variable, absl::string_view value,
                       absl::string_view what, std::string* name) {
  absl::StatusOr<std::string> parsed = ParseZoneName(value);
  if (!parsed.ok()) {
    return VariableError(variable, value,
                         absl::StrCat("is not a ", what, " name"),
                         kZoneNameForm);
  }
  *name = *std::move(parsed);
  return absl::OkStatus();
}

// TRAFFICRATE_CLUSTER and its companions (TRAFFICRATE_CLUSTER_*), which
// mean nothing without it (CheckCluster).
absl::Status ReadCluster(absl::string_view value, ConfigReading& r) {
  r.config.cluster = true;
  return Store(ParseClusterUrl(value), &r.config.cluster_url);
}
absl::Status ReadClusterSecret(absl::string_view value, ConfigReading& r) {
  return Store(ParseClusterSecret(value), &r.config.cluster_secret);
}
absl::Status ReadClusterName(absl::string_view value, ConfigReading& r) {
  return ReadNamed(kEnvClusterName, value, "cluster", &r.config.cluster_name);
}
absl::Status ReadClusterDecay(absl::string_view value, ConfigReading& r) {
  return Store(ParseClusterDecayNs(value), &r.config.cluster_decay_ns);
}
absl::Status ReadClusterHost(absl::string_view value, ConfigReading& r) {
  return ReadNamed(kEnvClusterHost, value, "host", &r.config.cluster_host);
}

absl::Status CheckCluster(const ConfigReading& r) {
  // A secret that was set is never empty (ParseClusterSecret).
  if (r.config.cluster && r.config.cluster_secret.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kEnvClusterSecret, ": unset, but ", kEnvCluster, " is set; use ",
        kMinClusterSecretBytes, " to ", kMaxClusterSecretBytes,
        " printable characters without spaces, the same on every host "
        "(client keys are hashed with it before they go to Redis)"));
  }
  if (!r.config.cluster && r.cluster_companion_set != nullptr) {
    const char* companion = r.cluster_companion_set;
    return absl::InvalidArgumentError(absl::StrCat(
        companion, ": set, but ", kEnvCluster, " is not; use it with ",
        kEnvCluster, "=redis://HOST[:PORT][/DB], or unset ", companion));
  }
  return absl::OkStatus();
}

// The variables, in the order they are read (and documented).
constexpr Variable kVariables[] = {
    {kEnvRate, "--rate", "R", "",
     "per-client rate in bytes/s; k = x1024, m = x1024^2",
     "The rate each client key shares among its sending connections, in "
     "bytes per second: an integer from 1 to 1048576m, optionally followed "
     "by k (x1024) or m (x1024^2), as nginx counts. Unset (and no "
     "TRAFFICRATE_CONFIG): the library does nothing.",
     /*default_value=*/"", /*unset_means=*/"", /*replaced_by_rules_file=*/true,
     &ReadRate},
    {kEnvKey, "--key", "K", "", "peer | peer/N | peer/N,M | local | all",
     "What makes a client: `peer` (the client's IP address; an "
     "IPv4-mapped IPv6 address counts as IPv4), `peer/24` or `peer/24,64` "
     "(the client's network, IPv4 and IPv6 prefix lengths), `local` (the "
     "server's address and port) or `all` (one bucket for every client).",
     /*default_value=*/"peer", /*unset_means=*/"",
     /*replaced_by_rules_file=*/true, &ReadKey},
    {kEnvZone, "--zone", "NAME", "", "zone name",
     "The zone's name: the zone file NAME that every process of the "
     "server (and the trafficrate command) shares, in a directory of the "
     "server's user (see ZONE in trafficrate(7)); 1 to 64 of A-Z a-z 0-9 "
     "_ . -.",
     /*default_value=*/"default", /*unset_means=*/"\"default\"",
     /*replaced_by_rules_file=*/false, &ReadZone},
    {kEnvZoneSize, "--zone-size", "S", "", "zone size, e.g. 32m",
     "The zone's size, with k, m or g, 64k to 1g; it bounds how many keys, "
     "connections and processes the zone holds (`trafficrate check` says "
     "how many). Used by the process that creates the zone.",
     /*default_value=*/"1m", /*unset_means=*/"",
     /*replaced_by_rules_file=*/false, &ReadZoneSize},
    {kEnvPorts, "--ports", "P", "",
     "only govern connections accepted on these local ports, e.g. 80,443",
     "A comma list of local ports or ranges (80,443,8000-8099) whose "
     "accepted connections are governed; other connections pass through "
     "untouched.",
     /*default_value=*/"", /*unset_means=*/"every port",
     /*replaced_by_rules_file=*/true, &ReadPorts},
    {kEnvExempt, "--exempt", "C", "",
     "never govern these clients, e.g. 10.0.0.0/8,::1",
     "A comma list of up to 64 client addresses or networks never "
     "governed (10.0.0.0/8,127.0.0.3,2001:db8::/32); an IPv4 entry also "
     "matches its IPv4-mapped IPv6 form.",
     /*default_value=*/"", /*unset_means=*/"none",
     /*replaced_by_rules_file=*/true, &ReadExempt},
    {kEnvAfter, "--after", "N", "",
     "bytes each connection sends before pacing starts, e.g. 1m",
     "Bytes each connection sends before it is paced and takes a share "
     "(nginx's limit_rate_after, but per connection, not per request), "
     "counted once they have left the socket; k, m or g, 0 to 1024g.",
     /*default_value=*/"0", /*unset_means=*/"", /*replaced_by_rules_file=*/true,
     &ReadAfter},
    {kEnvLog, "--log", "L", "", "stderr | syslog | off | /path",
     "Where the library's one-line messages go: `stderr`, `syslog` "
     "(identifier trafficrate, facility daemon; see LOGGING), `off`, or an "
     "absolute file path (appended to). A bad variable is reported on "
     "stderr, whatever this says.",
     /*default_value=*/"stderr", /*unset_means=*/"",
     /*replaced_by_rules_file=*/false, &ReadLog},
    {kEnvStrict, "--strict", "", "1",
     "a bad configuration stops the server at start-up",
     "`1`: a bad configuration or zone makes the process exit with status "
     "1 at start-up. `0`: it logs one line and runs unpaced, exactly as "
     "without the library.",
     /*default_value=*/"0", /*unset_means=*/"",
     /*replaced_by_rules_file=*/false, &ReadStrict},
    {kEnvIdle, "--idle", "D", "",
     "a connection idle this long stops taking a share, e.g. 200ms",
     "A connection that has not written for this long and has an empty "
     "send queue stops taking a share until it writes again (time in "
     "which its process got no CPU does not count): 200ms, 1s; a plain "
     "number is milliseconds; 1ms to 60s.",
     /*default_value=*/"200ms", /*unset_means=*/"",
     /*replaced_by_rules_file=*/false, &ReadIdle},
    {kEnvShare, "--share", "M", "",
     "budget: a shared byte budget per client, measured across processes, "
     "no cap while the client is under its rate; equal: rate/active per "
     "sending connection, always",
     "`budget`: a byte budget per key shared across processes and measured "
     "from what really leaves the sockets, so a connection that sends less "
     "than its share leaves the rest to the others and nothing is capped "
     "while the key is under its rate. `equal`: each sending connection is "
     "paced at rate / active, always (for comparison).",
     /*default_value=*/"budget", /*unset_means=*/"",
     /*replaced_by_rules_file=*/false, &ReadShare},
    {kEnvBurst, "--burst", "N", "",
     "budget mode: unused allowance a client may bank, e.g. 64k",
     "Budget mode only: how much unused allowance a key may bank while "
     "under its rate; k, m or g, 1k to 1g.",
     /*default_value=*/"", /*unset_means=*/"50 ms of the rate, at least 16k",
     /*replaced_by_rules_file=*/true, &ReadBurst},
    {kEnvInherited, "--no-inherited", "", "0",
     "leave alone the client connections the server inherits at start-up "
     "(inetd, systemd Accept=yes), which are governed by default",
     "`1`: connected TCP client sockets the process inherits at start-up "
     "from its launcher (inetd, xinetd, systemd Accept=yes) are governed; "
     "`0`: they are left alone.",
     /*default_value=*/"1", /*unset_means=*/"",
     /*replaced_by_rules_file=*/false, &ReadInherited},
    {kEnvShape, "--no-shape", "", "0",
     "leave every send to the kernel's own packet sizes instead of "
     "cutting slow connections' sends into small pieces (for comparison)",
     "`1`: the sends of connections paced below about 2.5 MB/s, and the "
     "first bytes of every connection, go to the kernel as small MSG_EOR "
     "pieces (about 40 a second, a different size on each connection of a "
     "client), so that the rate holds in every second and a new "
     "connection's unpaced start is about 1 KB; sendfile to such a "
     "connection goes through a bounded copy. `0`: every call goes to the "
     "kernel as the server made it.",
     /*default_value=*/"1", /*unset_means=*/"",
     /*replaced_by_rules_file=*/false, &ReadShape},
    {kEnvConfig, "--config", "FILE", "",
     "a rules file: named rules, each with its own listen ports, clients, "
     "exempt, key, rate, after and burst, in place of --rate, --key, "
     "--ports, --exempt, --after and --burst; see `trafficrate help rules`",
     "The absolute path of a rules file (RULES FILE below): several named "
     "rules, each with its own listen endpoints, clients, key, rate, after "
     "and burst, in place of TRAFFICRATE_RATE, _KEY, _PORTS, _EXEMPT, "
     "_AFTER and _BURST, which are then an error.",
     /*default_value=*/"", /*unset_means=*/"", /*replaced_by_rules_file=*/false,
     &ReadRules},
    {kEnvCluster, "--cluster", "URL", "",
     "share each client's rate with the other hosts of a fleet through "
     "Redis, e.g. redis://10.0.0.5:6379/0; see `trafficrate help fleet`",
     "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]: share each key's rate "
     "with the other hosts that use the same Redis server, cluster name "
     "and secret (FLEET below). No TLS: Debian 12's hiredis has none, so "
     "rediss:// is refused; reach Redis over a trusted network or a "
     "tunnel.",
     /*default_value=*/"", /*unset_means=*/"this host alone",
     /*replaced_by_rules_file=*/false, &ReadCluster},
    {kEnvClusterSecret, nullptr, "", "", "",
     "Required with TRAFFICRATE_CLUSTER: 16 to 256 printable characters, "
     "the same on every host of the fleet. Client keys are hashed with it "
     "(SipHash-2-4) before they go to Redis, so Redis never holds client "
     "addresses. No option sets it: a command line is visible to every "
     "user.",
     /*default_value=*/"", /*unset_means=*/"", /*replaced_by_rules_file=*/false,
     &ReadClusterSecret},
    {kEnvClusterName, "--cluster-name", "NAME", "", "the fleet's name in Redis",
     "The fleet's namespace in Redis (1 to 64 of A-Z a-z 0-9 _ . -): hosts "
     "share rates when their cluster names and secrets are the same.",
     /*default_value=*/"", /*unset_means=*/"the zone name",
     /*replaced_by_rules_file=*/false, &ReadClusterName},
    {kEnvClusterDecay, "--cluster-decay", "D", "",
     "while Redis is away, how long the last shares take to reach the "
     "full local rate, e.g. 10s",
     "While Redis cannot be reached, each key's last share moves linearly "
     "to the full local rate over this long, counted from the last "
     "exchange: 0 to 600s; 0 gives the full rate at once.",
     /*default_value=*/"10s", /*unset_means=*/"",
     /*replaced_by_rules_file=*/false, &ReadClusterDecay},
    {kEnvClusterHost, "--cluster-host", "NAME", "",
     "this host's name in the fleet, when hostnames are not unique",
     "This host's name in Redis (1 to 64 of A-Z a-z 0-9 _ . -); its id "
     "there is NAME/ZONE. Every host of a fleet needs its own: set it "
     "where machines share a hostname (cloned images, containers).",
     /*default_value=*/"", /*unset_means=*/"the hostname",
     /*replaced_by_rules_file=*/false, &ReadClusterHost},
};

}  // namespace

absl::Span<const Variable> Variables() { return kVariables; }

const Variable* FindVariable(absl::string_view name) {
  for (const Variable& variable : kVariables) {
    if (name == variable.name) return &variable;
  }
  return nullptr;
}

absl::StatusOr<Config> ParseConfig(EnvLookup env) {
  ConfigReading reading;
  for (const Variable& variable : kVariables) {
    const char* value = env(variable.name);
    if (value == nullptr) {
      if (*variable.default_value != '\0') {
        TRAFFICRATE_RETURN_IF_ERROR(
            variable.read(variable.default_value, reading));
      }
      continue;
    }
    if (variable.replaced_by_rules_file && reading.replaced == nullptr) {
      reading.replaced = variable.name;
    }
    if (absl::StartsWith(variable.name, kClusterCompanionPrefix) &&
        reading.cluster_companion_set == nullptr) {
      reading.cluster_companion_set = variable.name;
    }
    TRAFFICRATE_RETURN_IF_ERROR(variable.read(value, reading));
  }
  if (reading.config.cluster_name.empty()) {
    reading.config.cluster_name = reading.config.zone_name;
  }
  TRAFFICRATE_RETURN_IF_ERROR(CheckCluster(reading));
  return std::move(reading.config);
}

}  // namespace trafficrate
