#include "src/base/units.h"

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace trafficrate {
namespace {

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

constexpr int64_t kNsPerUs = 1000;
constexpr int64_t kNsPerMs = 1000 * kNsPerUs;
constexpr int64_t kNsPerSec = 1000 * kNsPerMs;

// Longer values are cut in messages: enough to recognise a typo, too short to
// flood a log with a pasted file.
constexpr size_t kMaxQuotedBytes = 64;

// A value split into its leading run of ASCII digits and whatever follows.
struct DigitsAndSuffix {
  absl::string_view digits;
  absl::string_view suffix;
};

DigitsAndSuffix SplitDigits(absl::string_view text) {
  size_t n = 0;
  while (n < text.size() &&
         absl::ascii_isdigit(static_cast<uint8_t>(text[n]))) {
    ++n;
  }
  return {text.substr(0, n), text.substr(n)};
}

// Returns false instead of wrapping when the number does not fit, because a
// wrapped "99999999999999999999m" would silently become a small rate.
// REQUIRES: `digits` holds only '0'..'9'.
bool DigitsToUint64(absl::string_view digits, uint64_t* value) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  uint64_t result = 0;
  for (const char c : digits) {
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (result > (kMax - digit) / 10) return false;
    result = result * 10 + digit;
  }
  *value = result;
  return true;
}

// Returns the multiplier for a byte-count suffix, or 0 if it is not accepted.
uint64_t ByteUnit(absl::string_view suffix, bool allow_g) {
  if (suffix.empty()) return 1;
  if (suffix == "k" || suffix == "K") return kKiB;
  if (suffix == "m" || suffix == "M") return kMiB;
  if (allow_g && (suffix == "g" || suffix == "G")) return kGiB;
  return 0;
}

// Returns the duration unit in ns, or 0 if the suffix is not accepted.
int64_t DurationUnitNs(absl::string_view suffix) {
  if (suffix.empty() || suffix == "ms") return kNsPerMs;
  if (suffix == "s") return kNsPerSec;
  if (suffix == "us") return kNsPerUs;
  return 0;
}

std::string ByteCountForm(bool allow_g, uint64_t min, uint64_t max) {
  return absl::StrCat("use an integer from ", FormatByteCount(min, allow_g),
                      " to ", FormatByteCount(max, allow_g),
                      ", optionally followed by ",
                      allow_g ? "k (x1024), m (x1024^2) or g (x1024^3)"
                              : "k (x1024) or m (x1024^2)");
}

std::string DurationForm(int64_t min_ns, int64_t max_ns) {
  return absl::StrCat("use an integer from ", FormatDurationNs(min_ns), " to ",
                      FormatDurationNs(max_ns),
                      ", in milliseconds or followed by us, ms or s");
}

// All parse errors share one shape so users learn to read them:
// "<name>: <what is wrong>; <accepted form>".
absl::Status ParseError(absl::string_view name, absl::string_view problem,
                        absl::string_view form) {
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": ", problem, "; ", form));
}

}  // namespace

absl::StatusOr<uint64_t> ParseByteCount(absl::string_view name,
                                        absl::string_view value, bool allow_g,
                                        uint64_t min, uint64_t max) {
  const std::string form = ByteCountForm(allow_g, min, max);
  if (value.empty()) return ParseError(name, "empty", form);
  const std::string quoted = QuoteForMessage(value);
  const DigitsAndSuffix parts = SplitDigits(value);
  const uint64_t unit = ByteUnit(parts.suffix, allow_g);
  if (parts.digits.empty() || unit == 0) {
    return ParseError(name, absl::StrCat(quoted, " is not a byte count"), form);
  }
  uint64_t count = 0;
  if (!DigitsToUint64(parts.digits, &count) ||
      count > std::numeric_limits<uint64_t>::max() / unit ||
      count * unit > max) {
    return ParseError(name,
                      absl::StrCat(quoted, " is above the maximum ",
                                   FormatByteCount(max, allow_g)),
                      form);
  }
  count *= unit;
  if (count < min) {
    return ParseError(name,
                      absl::StrCat(quoted, " is below the minimum ",
                                   FormatByteCount(min, allow_g)),
                      form);
  }
  return count;
}

absl::StatusOr<int64_t> ParseDurationNs(absl::string_view name,
                                        absl::string_view value, int64_t min_ns,
                                        int64_t max_ns) {
  const std::string form = DurationForm(min_ns, max_ns);
  if (value.empty()) return ParseError(name, "empty", form);
  const std::string quoted = QuoteForMessage(value);
  const DigitsAndSuffix parts = SplitDigits(value);
  const int64_t unit_ns = DurationUnitNs(parts.suffix);
  if (parts.digits.empty() || unit_ns == 0) {
    return ParseError(name, absl::StrCat(quoted, " is not a duration"), form);
  }
  uint64_t count = 0;
  const uint64_t max_count =
      static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / unit_ns);
  if (!DigitsToUint64(parts.digits, &count) || count > max_count ||
      static_cast<int64_t>(count) * unit_ns > max_ns) {
    return ParseError(name,
                      absl::StrCat(quoted, " is above the maximum ",
                                   FormatDurationNs(max_ns)),
                      form);
  }
  const int64_t ns = static_cast<int64_t>(count) * unit_ns;
  if (ns < min_ns) {
    return ParseError(name,
                      absl::StrCat(quoted, " is below the minimum ",
                                   FormatDurationNs(min_ns)),
                      form);
  }
  return ns;
}

std::string FormatByteCount(uint64_t bytes, bool allow_g) {
  if (bytes == 0) return "0";
  if (allow_g && bytes % kGiB == 0) return absl::StrCat(bytes / kGiB, "g");
  if (bytes % kMiB == 0) return absl::StrCat(bytes / kMiB, "m");
  if (bytes % kKiB == 0) return absl::StrCat(bytes / kKiB, "k");
  return absl::StrCat(bytes);
}

std::string FormatDurationNs(int64_t ns) {
  if (ns == 0) return "0ms";
  if (ns % kNsPerSec == 0) return absl::StrCat(ns / kNsPerSec, "s");
  if (ns % kNsPerMs == 0) return absl::StrCat(ns / kNsPerMs, "ms");
  if (ns % kNsPerUs == 0) return absl::StrCat(ns / kNsPerUs, "us");
  return absl::StrCat(ns, "ns");
}

std::string QuoteForMessage(absl::string_view value) {
  const bool cut = value.size() > kMaxQuotedBytes;
  return absl::StrCat("\"", absl::CHexEscape(value.substr(0, kMaxQuotedBytes)),
                      "\"", cut ? "..." : "");
}

}  // namespace trafficrate
