#include "src/config/config.h"

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "src/base/status_macros.h"
#include "src/base/units.h"
#include "src/config/rules.h"
#include "src/net/key.h"

namespace trafficrate {
namespace {

// Well below NAME_MAX (255) once "/trafficrate." is prepended, and short
// enough to show in `trafficrate stat` columns.
constexpr size_t kMaxZoneNameBytes = 64;

constexpr char kStrictForm[] = "use 0 or 1";
constexpr char kLogForm[] = "use stderr, syslog, off or an absolute file path";
constexpr char kShareForm[] = "use budget or equal";
constexpr char kConfigForm[] =
    "use the absolute path of a rules file, e.g. /etc/trafficrate/rules.conf";
constexpr char kZoneForm[] =
    "use 1 to 64 characters from A-Z a-z 0-9 _ . - not starting with '.'";

absl::Status VariableError(absl::string_view name, absl::string_view value,
                           absl::string_view problem, absl::string_view form) {
  return absl::InvalidArgumentError(
      value.empty() ? absl::StrCat(name, ": empty; ", form)
                    : absl::StrCat(name, ": ", QuoteForMessage(value), " ",
                                   problem, "; ", form));
}

bool IsZoneNameChar(char c) {
  return absl::ascii_isalnum(static_cast<uint8_t>(c)) || c == '_' || c == '.' ||
         c == '-';
}

// TRAFFICRATE_CONFIG: reads the rules file into *config. `also_set` is
// the first of the variables a rule replaces that is set too, or null.
absl::Status ApplyRulesFile(absl::string_view value, const char* also_set,
                            Config* config) {
  if (value.empty() || value.front() != '/') {
    return VariableError(kEnvConfig, value, "is not an absolute path",
                         kConfigForm);
  }
  if (also_set != nullptr) {
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
// host): *name is left alone when value is null (unset).
absl::Status ParseNamed(const char* variable, const char* value,
                        absl::string_view what, std::string* name) {
  if (value == nullptr) return absl::OkStatus();
  absl::StatusOr<std::string> parsed = ParseZoneName(value);
  if (!parsed.ok()) {
    return VariableError(variable, value,
                         absl::StrCat("is not a ", what, " name"), kZoneForm);
  }
  *name = *std::move(parsed);
  return absl::OkStatus();
}

// TRAFFICRATE_CLUSTER and its companions, which mean nothing without it.
absl::Status ParseClusterVariables(EnvLookup env, Config* config) {
  const char* url = env(kEnvCluster);
  if (url != nullptr) {
    TRAFFICRATE_ASSIGN_OR_RETURN(config->cluster_url, ParseClusterUrl(url));
    config->cluster = true;
  }
  const char* secret = env(kEnvClusterSecret);
  if (secret != nullptr) {
    TRAFFICRATE_ASSIGN_OR_RETURN(config->cluster_secret,
                                 ParseClusterSecret(secret));
  }
  config->cluster_name = config->zone_name;
  const char* name_value = env(kEnvClusterName);
  TRAFFICRATE_RETURN_IF_ERROR(ParseNamed(kEnvClusterName, name_value, "cluster",
                                         &config->cluster_name));
  const char* decay_value = env(kEnvClusterDecay);
  if (const char* value = decay_value; value != nullptr) {
    TRAFFICRATE_ASSIGN_OR_RETURN(config->cluster_decay_ns,
                                 ParseClusterDecayNs(value));
  }
  const char* host_value = env(kEnvClusterHost);
  TRAFFICRATE_RETURN_IF_ERROR(
      ParseNamed(kEnvClusterHost, host_value, "host", &config->cluster_host));
  if (config->cluster && secret == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        kEnvClusterSecret, ": unset, but ", kEnvCluster, " is set; use ",
        kMinClusterSecretBytes, " to ", kMaxClusterSecretBytes,
        " printable characters without spaces, the same on every host "
        "(client keys are hashed with it before they go to Redis)"));
  }
  if (!config->cluster) {
    const std::pair<const char*, const char*> companions[] = {
        {kEnvClusterSecret, secret},
        {kEnvClusterName, name_value},
        {kEnvClusterDecay, decay_value},
        {kEnvClusterHost, host_value}};
    for (const auto& [companion, value] : companions) {
      if (value != nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            companion, ": set, but ", kEnvCluster, " is not; use it with ",
            kEnvCluster, "=redis://HOST[:PORT][/DB], or unset ", companion));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint64_t> ParseRate(absl::string_view value) {
  return ParseByteCount(kEnvRate, value, /*allow_g=*/false, kMinRateBytesPerSec,
                        kMaxRateBytesPerSec);
}

absl::StatusOr<uint64_t> ParseZoneSize(absl::string_view value) {
  return ParseByteCount(kEnvZoneSize, value, /*allow_g=*/true,
                        kMinZoneSizeBytes, kMaxZoneSizeBytes);
}

absl::StatusOr<uint64_t> ParseAfter(absl::string_view value) {
  return ParseByteCount(kEnvAfter, value, /*allow_g=*/true, 0, kMaxAfterBytes);
}

absl::StatusOr<int64_t> ParseIdleNs(absl::string_view value) {
  return ParseDurationNs(kEnvIdle, value, kMinIdleNs, kMaxIdleNs);
}

absl::StatusOr<bool> ParseStrict(absl::string_view value) {
  if (value == "0") return false;
  if (value == "1") return true;
  return VariableError(kEnvStrict, value, "is not 0 or 1", kStrictForm);
}

absl::StatusOr<bool> ParseInherited(absl::string_view value) {
  if (value == "0") return false;
  if (value == "1") return true;
  return VariableError(kEnvInherited, value, "is not 0 or 1", kStrictForm);
}

absl::StatusOr<bool> ParseShape(absl::string_view value) {
  if (value == "0") return false;
  if (value == "1") return true;
  return VariableError(kEnvShape, value, "is not 0 or 1", kStrictForm);
}

absl::StatusOr<LogTarget> ParseLogTarget(absl::string_view value,
                                         std::string* path) {
  path->clear();
  if (value == "stderr") return LogTarget::kStderr;
  if (value == "syslog") return LogTarget::kSyslog;
  if (value == "off") return LogTarget::kOff;
  if (absl::StartsWith(value, "/")) {
    path->assign(value.data(), value.size());
    return LogTarget::kFile;
  }
  return VariableError(kEnvLog, value, "is not a log target", kLogForm);
}

absl::StatusOr<std::string> ParseZoneName(absl::string_view value) {
  bool ok = !value.empty() && value.size() <= kMaxZoneNameBytes &&
            value.front() != '.';
  for (const char c : value) ok = ok && IsZoneNameChar(c);
  if (!ok) {
    return VariableError(kEnvZone, value, "is not a zone name", kZoneForm);
  }
  return std::string(value);
}

absl::StatusOr<ShareMode> ParseShare(absl::string_view value) {
  if (value == "budget") return ShareMode::kBudget;
  if (value == "equal") return ShareMode::kEqual;
  return VariableError(kEnvShare, value, "is not a share mode", kShareForm);
}

absl::StatusOr<uint64_t> ParseBurst(absl::string_view value) {
  return ParseByteCount(kEnvBurst, value, /*allow_g=*/true, kMinBurstBytes,
                        kMaxBurstBytes);
}

absl::StatusOr<std::string> ParseClusterSecret(absl::string_view value) {
  bool printable = true;
  for (const char c : value) {
    printable = printable && absl::ascii_isgraph(static_cast<uint8_t>(c));
  }
  if (value.size() < kMinClusterSecretBytes ||
      value.size() > kMaxClusterSecretBytes || !printable) {
    // The secret itself is never shown.
    return absl::InvalidArgumentError(absl::StrCat(
        kEnvClusterSecret, ": ", value.empty() ? "empty" : "not accepted",
        "; use ", kMinClusterSecretBytes, " to ", kMaxClusterSecretBytes,
        " printable characters without spaces, the same on every host"));
  }
  return std::string(value);
}

absl::StatusOr<int64_t> ParseClusterDecayNs(absl::string_view value) {
  return ParseDurationNs(kEnvClusterDecay, value, 0, kMaxClusterDecayNs);
}

absl::string_view ShareModeName(ShareMode mode) {
  return mode == ShareMode::kEqual ? "equal" : "budget";
}

absl::StatusOr<Config> ParseConfig(EnvLookup env) {
  Config config;
  // The first variable set that a rules file replaces (TRAFFICRATE_CONFIG).
  const char* replaced = nullptr;
  const auto note = [&replaced](const char* name) {
    if (replaced == nullptr) replaced = name;
  };
  if (const char* value = env(kEnvRate); value != nullptr) {
    note(kEnvRate);
    TRAFFICRATE_ASSIGN_OR_RETURN(config.rate_bytes_per_sec, ParseRate(value));
    config.enabled = true;
  }
  if (const char* value = env(kEnvKey); value != nullptr) {
    note(kEnvKey);
    TRAFFICRATE_ASSIGN_OR_RETURN(config.key, ParseKeySpec(value));
  }
  if (const char* value = env(kEnvZone); value != nullptr) {
    TRAFFICRATE_ASSIGN_OR_RETURN(config.zone_name, ParseZoneName(value));
  }
  if (const char* value = env(kEnvZoneSize); value != nullptr) {
    TRAFFICRATE_ASSIGN_OR_RETURN(config.zone_size_bytes, ParseZoneSize(value));
  }
  if (const char* value = env(kEnvPorts); value != nullptr) {
    note(kEnvPorts);
    TRAFFICRATE_ASSIGN_OR_RETURN(config.ports, ParsePorts(value));
  }
  if (const char* value = env(kEnvExempt); value != nullptr) {
    note(kEnvExempt);
    TRAFFICRATE_ASSIGN_OR_RETURN(config.exempt, ParseExempt(value));
  }
  if (const char* value = env(kEnvAfter); value != nullptr) {
    note(kEnvAfter);
    TRAFFICRATE_ASSIGN_OR_RETURN(config.after_bytes, ParseAfter(value));
  }
  if (const char* value = env(kEnvLog); value != nullptr) {
    TRAFFICRATE_ASSIGN_OR_RETURN(config.log,
                                 ParseLogTarget(value, &config.log_path));
  }
  if (const char* value = env(kEnvStrict); value != nullptr) {
    TRAFFICRATE_ASSIGN_OR_RETURN(config.strict, ParseStrict(value));
  }
  if (const char* value = env(kEnvIdle); value != nullptr) {
    TRAFFICRATE_ASSIGN_OR_RETURN(config.idle_ns, ParseIdleNs(value));
  }
  if (const char* value = env(kEnvShare); value != nullptr) {
    TRAFFICRATE_ASSIGN_OR_RETURN(config.share, ParseShare(value));
  }
  if (const char* value = env(kEnvBurst); value != nullptr) {
    note(kEnvBurst);
    TRAFFICRATE_ASSIGN_OR_RETURN(config.burst_bytes, ParseBurst(value));
  }
  if (const char* value = env(kEnvInherited); value != nullptr) {
    TRAFFICRATE_ASSIGN_OR_RETURN(config.inherited, ParseInherited(value));
  }
  if (const char* value = env(kEnvShape); value != nullptr) {
    TRAFFICRATE_ASSIGN_OR_RETURN(config.shape, ParseShape(value));
  }
  if (const char* value = env(kEnvConfig); value != nullptr) {
    TRAFFICRATE_RETURN_IF_ERROR(ApplyRulesFile(value, replaced, &config));
  }
  TRAFFICRATE_RETURN_IF_ERROR(ParseClusterVariables(env, &config));
  return config;
}

}  // namespace trafficrate
