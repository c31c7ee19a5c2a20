#include "src/config/values.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "src/base/units.h"

namespace trafficrate {
namespace {

// Well below NAME_MAX (255) once "/trafficrate." is prepended, and short
// enough to show in `trafficrate stat` columns.
constexpr size_t kMaxZoneNameBytes = 64;

constexpr char kStrictForm[] = "use 0 or 1";
constexpr char kLogForm[] = "use stderr, syslog, off or an absolute file path";
constexpr char kShareForm[] = "use budget or equal";

bool IsZoneNameChar(char c) {
  return absl::ascii_isalnum(static_cast<uint8_t>(c)) || c == '_' || c == '.' ||
         c == '-';
}

}  // namespace

absl::Status VariableError(absl::string_view name, absl::string_view value,
                           absl::string_view problem, absl::string_view form) {
  return absl::InvalidArgumentError(
      value.empty() ? absl::StrCat(name, ": empty; ", form)
                    : absl::StrCat(name, ": ", QuoteForMessage(value), " ",
                                   problem, "; ", form));
}

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
    return VariableError(kEnvZone, value, "is not a zone name", kZoneNameForm);
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

}  // namespace trafficrate
