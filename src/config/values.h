// The values of trafficrate's variables, each parser on its own: the
// configuration (config.h) reads every variable with these, the library can
// still honour TRAFFICRATE_STRICT and TRAFFICRATE_LOG when another variable
// is bad, and the CLI parses a new rate for `set` with them. Each error is
// InvalidArgument, one line, naming the variable and the accepted form. All
// are thread-safe.
//
//   absl::StatusOr<uint64_t> rate = ParseRate("500k");  // 512000

#ifndef TRAFFICRATE_SRC_CONFIG_VALUES_H_
#define TRAFFICRATE_SRC_CONFIG_VALUES_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "src/base/log.h"
#include "src/budget/budget.h"
#include "src/budget/share.h"

namespace trafficrate {

// The variables' names (their table: Variables() in config.h).
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

inline constexpr uint64_t kMinZoneSizeBytes = uint64_t{64} << 10;  // 64k
inline constexpr uint64_t kMaxZoneSizeBytes = uint64_t{1} << 30;   // 1g
inline constexpr uint64_t kMaxAfterBytes = uint64_t{1} << 40;      // 1024g
inline constexpr int64_t kMinIdleNs = 1'000'000;                   // 1ms
inline constexpr int64_t kMaxIdleNs = 60'000'000'000;              // 60s
inline constexpr size_t kMinClusterSecretBytes = 16;
inline constexpr size_t kMaxClusterSecretBytes = 256;
inline constexpr int64_t kMaxClusterDecayNs = 600'000'000'000;  // 600s
inline constexpr int64_t kDefaultClusterDecayNs = 10'000'000'000;

// "NAME: 'VALUE' PROBLEM; FORM" (or "NAME: empty; FORM"), the form of
// every variable's error.
absl::Status VariableError(absl::string_view name, absl::string_view value,
                           absl::string_view problem, absl::string_view form);
// What a name in the zone name's form may be (TRAFFICRATE_ZONE, and the
// cluster and host names).
inline constexpr char kZoneNameForm[] =
    "use 1 to 64 characters from A-Z a-z 0-9 _ . - not starting with '.'";

// TRAFFICRATE_RATE: its entry in config.cc's table.
ABSL_MUST_USE_RESULT absl::StatusOr<uint64_t> ParseRate(
    absl::string_view value);
// TRAFFICRATE_ZONE_SIZE: its entry in config.cc's table.
ABSL_MUST_USE_RESULT absl::StatusOr<uint64_t> ParseZoneSize(
    absl::string_view value);
// TRAFFICRATE_AFTER: its entry in config.cc's table. (TRAFFICRATE_PORTS and
// TRAFFICRATE_EXEMPT: ParsePorts and ParseExempt in rules.h.)
ABSL_MUST_USE_RESULT absl::StatusOr<uint64_t> ParseAfter(
    absl::string_view value);
// TRAFFICRATE_IDLE: its entry in config.cc's table. Returns nanoseconds.
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
// TRAFFICRATE_BURST: its entry in config.cc's table.
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

#endif  // TRAFFICRATE_SRC_CONFIG_VALUES_H_
