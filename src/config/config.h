// trafficrate's whole configuration, read from TRAFFICRATE_* environment
// variables in one place at start-up (nginx wipes its workers' environment, so
// there is no second chance to read it).
//
//   absl::StatusOr<Config> config = ParseConfig(
//       [](const char* name) -> const char* { return getenv(name); });
//   if (!config.ok()) {
//     // One line naming the bad variable: print it, then pass through.
//   } else if (config->enabled) { ... }
//
// The variables are:
//   TRAFFICRATE_RATE       bytes/s per key, k/m units, 1 .. 1048576m (1 TiB/s,
//                          far above any NIC: the cap only keeps the share
//                          math away from overflow). Unset: library inactive.
//   TRAFFICRATE_KEY        peer | peer/N | peer/N,M | local | all (key.h)
//   TRAFFICRATE_ZONE       shared memory zone name (see ParseZoneName)
//   TRAFFICRATE_ZONE_SIZE  zone size, k/m/g units, 64k .. 1g
//   TRAFFICRATE_PORTS      local ports whose accepted connections are
//                          governed: "80,443,8000-8099" (rules.h). Unset:
//                          all ports.
//   TRAFFICRATE_EXEMPT     client addresses and networks never governed, at
//                          most 64: "10.0.0.0/8,127.0.0.3,2001:db8::/32,::1"
//                          (rules.h). Unset: none.
//   TRAFFICRATE_AFTER      bytes a connection sends before it is paced, as
//                          nginx's limit_rate_after: k/m/g units, 0 .. 1024g,
//                          default 0. Counted per connection, not per HTTP
//                          request: a keep-alive connection's later
//                          responses are paced from their first byte.
//   TRAFFICRATE_LOG        stderr | syslog | off | /absolute/file/path
//   TRAFFICRATE_STRICT     0 | 1
//   TRAFFICRATE_IDLE       how long a connection may go without writing before
//                          it stops taking a share; 1ms .. 60s, default 200ms
//   TRAFFICRATE_SHARE      budget | equal (budget.h): how a key's sending
//                          connections share its rate. budget (the
//                          default): a shared byte budget, measured,
//                          max-min fair, no cap while the key is clearly
//                          under its rate; equal: rate/active each, always.
//   TRAFFICRATE_BURST      budget mode: unused allowance a key may bank,
//                          k/m/g units, 1k .. 1g; unset: 50 ms of the rate,
//                          at least 16k
//   TRAFFICRATE_SHAPE      1 | 0: the packet shaper (shaper.h) cuts the
//                          sends of slow connections, and every
//                          connection's first bytes, into small MSG_EOR
//                          pieces; 0 leaves them to the kernel. Default 1.
//   TRAFFICRATE_CONFIG     an absolute path to a rules file (rules_file.h):
//                          named rules, each with its own ports, clients,
//                          key, rate, after and burst, in place of
//                          TRAFFICRATE_RATE, _KEY, _PORTS, _EXEMPT, _AFTER
//                          and _BURST (set together with it, they are an
//                          error)
//   TRAFFICRATE_CLUSTER    redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]
//                          (cluster.h): share each key's rate with the other
//                          hosts of a fleet through that Redis server
//                          (cluster_agent.h). Unset: this host alone.
//   TRAFFICRATE_CLUSTER_SECRET  required with TRAFFICRATE_CLUSTER: 16 to 256
//                          characters, the same on every host; client keys
//                          are hashed with it before they go to Redis
//   TRAFFICRATE_CLUSTER_NAME    the fleet's namespace in Redis (the zone's
//                          name rule); default: the zone name
//   TRAFFICRATE_CLUSTER_DECAY   while Redis is away, how long the last
//                          shares take to move to the full local rate;
//                          0 .. 600s, default 10s
//   TRAFFICRATE_CLUSTER_HOST    this host's name in Redis (the zone's name
//                          rule); its id there is HOST/ZONE. Default: the
//                          machine's hostname
// A variable that is set but empty is an error, not "use the default": an
// empty value is usually a shell variable that was meant to hold something.

#ifndef TRAFFICRATE_SRC_CONFIG_CONFIG_H_
#define TRAFFICRATE_SRC_CONFIG_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "src/base/log.h"
#include "src/budget/budget.h"
#include "src/budget/share.h"
#include "src/config/cluster_url.h"
#include "src/config/rules.h"
#include "src/config/rules_file.h"
#include "src/net/key.h"

namespace trafficrate {

inline constexpr const char* kEnvRate = "TRAFFICRATE_RATE";
inline constexpr const char* kEnvKey = "TRAFFICRATE_KEY";
inline constexpr const char* kEnvZone = "TRAFFICRATE_ZONE";
inline constexpr const char* kEnvZoneSize = "TRAFFICRATE_ZONE_SIZE";
inline constexpr const char* kEnvPorts = "TRAFFICRATE_PORTS";
inline constexpr const char* kEnvExempt = "TRAFFICRATE_EXEMPT";
inline constexpr const char* kEnvAfter = "TRAFFICRATE_AFTER";
inline constexpr const char* kEnvLog = "TRAFFICRATE_LOG";
inline constexpr const char* kEnvStrict = "TRAFFICRATE_STRICT";
inline constexpr const char* kEnvIdle = "TRAFFICRATE_IDLE";
inline constexpr const char* kEnvShare = "TRAFFICRATE_SHARE";
inline constexpr const char* kEnvBurst = "TRAFFICRATE_BURST";
inline constexpr const char* kEnvInherited = "TRAFFICRATE_INHERITED";
inline constexpr const char* kEnvShape = "TRAFFICRATE_SHAPE";
inline constexpr const char* kEnvConfig = "TRAFFICRATE_CONFIG";
inline constexpr const char* kEnvCluster = "TRAFFICRATE_CLUSTER";
inline constexpr const char* kEnvClusterSecret = "TRAFFICRATE_CLUSTER_SECRET";
inline constexpr const char* kEnvClusterName = "TRAFFICRATE_CLUSTER_NAME";
inline constexpr const char* kEnvClusterDecay = "TRAFFICRATE_CLUSTER_DECAY";
inline constexpr const char* kEnvClusterHost = "TRAFFICRATE_CLUSTER_HOST";
// Every variable ParseConfig reads, in the order it reads them.
inline constexpr const char* kEnvNames[] = {
    kEnvRate,          kEnvKey,         kEnvZone,         kEnvZoneSize,
    kEnvPorts,         kEnvExempt,      kEnvAfter,        kEnvLog,
    kEnvStrict,        kEnvIdle,        kEnvShare,        kEnvBurst,
    kEnvInherited,     kEnvShape,       kEnvConfig,       kEnvCluster,
    kEnvClusterSecret, kEnvClusterName, kEnvClusterDecay, kEnvClusterHost};

inline constexpr uint64_t kMinZoneSizeBytes = uint64_t{64} << 10;  // 64k
inline constexpr uint64_t kMaxZoneSizeBytes = uint64_t{1} << 30;   // 1g
inline constexpr uint64_t kMaxAfterBytes = uint64_t{1} << 40;      // 1024g
inline constexpr int64_t kMinIdleNs = 1'000'000;                   // 1ms
inline constexpr int64_t kMaxIdleNs = 60'000'000'000;              // 60s
inline constexpr size_t kMinClusterSecretBytes = 16;
inline constexpr size_t kMaxClusterSecretBytes = 256;
inline constexpr int64_t kMaxClusterDecayNs = 600'000'000'000;  // 600s
inline constexpr int64_t kDefaultClusterDecayNs = 10'000'000'000;

struct Config {
  bool enabled = false;  // false when TRAFFICRATE_RATE is unset
  uint64_t rate_bytes_per_sec = 0;
  KeySpec key;
  std::string zone_name = "default";
  uint64_t zone_size_bytes = uint64_t{1} << 20;
  std::vector<PortRange> ports;  // sorted, merged; empty: every port
  std::vector<Cidr> exempt;      // empty: nobody is exempt
  uint64_t after_bytes = 0;
  LogTarget log = LogTarget::kStderr;
  std::string log_path;  // set when log == LogTarget::kFile
  bool strict = false;
  int64_t idle_ns = 200'000'000;
  ShareMode share = ShareMode::kBudget;
  uint64_t burst_bytes = 0;  // 0: DefaultBurstBytes(rate)
  // TRAFFICRATE_INHERITED: at start-up, govern the client connections the
  // process inherited (inetd, systemd Accept=yes): Governor::AdoptInherited.
  bool inherited = true;
  // TRAFFICRATE_SHAPE: the packet shaper (shaper.h) on.
  bool shape = true;
  // TRAFFICRATE_CONFIG: the rules file's rules, in order (empty without
  // one). With a file, rate_bytes_per_sec, key and burst_bytes are those
  // of its first rule that has a rate (the zone's rule 0), ports and
  // exempt are empty, and enabled is false when no rule has a rate (every
  // rule unlimited: nothing to govern).
  std::string rules_path;
  std::vector<Rule> rules;
  // TRAFFICRATE_CLUSTER and its companions (cluster_agent.h); cluster
  // false without it.
  bool cluster = false;
  ClusterUrl cluster_url;
  std::string cluster_secret;
  std::string cluster_name;  // the zone name unless set
  int64_t cluster_decay_ns = kDefaultClusterDecayNs;
  std::string cluster_host;  // empty: the machine's hostname
};

// Looks a variable up; returns nullptr when it is unset. The returned string
// need only live until the next call. Production passes getenv; tests, a map.
using EnvLookup = absl::FunctionRef<const char*(const char*)>;

// Reads each variable of kEnvNames exactly once, in that order, and returns
// the first error: InvalidArgument, one line, naming the variable and the
// accepted form. With TRAFFICRATE_RATE unset the result has enabled == false
// and the other variables are still validated and filled in, so `trafficrate
// check` and a later `set` see the same zone and key settings.
// Thread-safe if `env` is (getenv races with setenv).
ABSL_MUST_USE_RESULT absl::StatusOr<Config> ParseConfig(EnvLookup env);

// Each variable's parser on its own, so the library can still honour
// TRAFFICRATE_STRICT and TRAFFICRATE_LOG when another variable is bad, and
// the CLI can parse a new rate for `set`. Errors as for ParseConfig. All are
// thread-safe.

// TRAFFICRATE_RATE: see the file comment.
ABSL_MUST_USE_RESULT absl::StatusOr<uint64_t> ParseRate(
    absl::string_view value);
// TRAFFICRATE_ZONE_SIZE: see the file comment.
ABSL_MUST_USE_RESULT absl::StatusOr<uint64_t> ParseZoneSize(
    absl::string_view value);
// TRAFFICRATE_AFTER: see the file comment. (TRAFFICRATE_PORTS and
// TRAFFICRATE_EXEMPT: ParsePorts and ParseExempt in rules.h.)
ABSL_MUST_USE_RESULT absl::StatusOr<uint64_t> ParseAfter(
    absl::string_view value);
// TRAFFICRATE_IDLE: see the file comment. Returns nanoseconds.
ABSL_MUST_USE_RESULT absl::StatusOr<int64_t> ParseIdleNs(
    absl::string_view value);
// TRAFFICRATE_STRICT: exactly "0" or "1"; "true" or "yes" are refused rather
// than guessed at, since a wrong guess either kills the server or does not.
ABSL_MUST_USE_RESULT absl::StatusOr<bool> ParseStrict(absl::string_view value);
ABSL_MUST_USE_RESULT absl::StatusOr<bool> ParseInherited(
    absl::string_view value);
// TRAFFICRATE_SHAPE: exactly "0" or "1".
ABSL_MUST_USE_RESULT absl::StatusOr<bool> ParseShape(absl::string_view value);
// TRAFFICRATE_SHARE: exactly "budget" or "equal".
ABSL_MUST_USE_RESULT absl::StatusOr<ShareMode> ParseShare(
    absl::string_view value);
// TRAFFICRATE_BURST: see the file comment.
ABSL_MUST_USE_RESULT absl::StatusOr<uint64_t> ParseBurst(
    absl::string_view value);
// TRAFFICRATE_CLUSTER_SECRET: kMinClusterSecretBytes to
// kMaxClusterSecretBytes printable characters; never echoed in errors.
ABSL_MUST_USE_RESULT absl::StatusOr<std::string> ParseClusterSecret(
    absl::string_view value);
// TRAFFICRATE_CLUSTER_DECAY: a duration, 0 .. 600s. Returns nanoseconds.
ABSL_MUST_USE_RESULT absl::StatusOr<int64_t> ParseClusterDecayNs(
    absl::string_view value);
// "budget" or "equal", as TRAFFICRATE_SHARE takes it.
absl::string_view ShareModeName(ShareMode mode);
// TRAFFICRATE_LOG: "stderr", "syslog", "off", or an absolute path (starting
// with '/', because the server may chdir). Sets *path to the path for
// LogTarget::kFile and clears it otherwise. REQUIRES: path != nullptr.
ABSL_MUST_USE_RESULT absl::StatusOr<LogTarget> ParseLogTarget(
    absl::string_view value, std::string* path);
// TRAFFICRATE_ZONE: 1 to 64 characters of [A-Za-z0-9_.-], not starting with
// '.'. The zone becomes the shm object "/trafficrate.<zone>", so '/' is
// refused and the length stays well inside NAME_MAX.
ABSL_MUST_USE_RESULT absl::StatusOr<std::string> ParseZoneName(
    absl::string_view value);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_CONFIG_CONFIG_H_
