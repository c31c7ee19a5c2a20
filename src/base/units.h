// Parsing of the numbers in trafficrate's environment variables: byte counts
// with nginx's units ("500k", "32m") and durations ("200ms", "2s").
//
//   absl::StatusOr<uint64_t> rate = ParseByteCount(
//       "TRAFFICRATE_RATE", "500k", /*allow_g=*/false, 1, uint64_t{1} << 40);
//   // *rate == 512000
//
// The values come from users, often through a service manager whose stderr
// nobody reads closely, so every error is a single line that names the
// variable, quotes what was given and says what would have been accepted.
// Nothing here is meant for the hot path: the functions allocate.

#ifndef TRAFFICRATE_SRC_BASE_UNITS_H_
#define TRAFFICRATE_SRC_BASE_UNITS_H_

#include <cstdint>
#include <string>

#include "absl/base/attributes.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trafficrate {

// Parses a byte count "<digits>[suffix]" with nginx's units: k or K is x1024,
// m or M is x1024^2 and, only when `allow_g`, g or G is x1024^3. No sign, no
// spaces, no fraction and no other suffix ("500kb" is refused, as nginx would).
// Leading zeros are allowed. The result must lie in [min, max]; a value too
// large for uint64_t is reported as above the maximum, never wrapped.
//
// Errors are InvalidArgument, one line, starting with `name`, e.g.
//   TRAFFICRATE_RATE: "12x" is not a byte count; use an integer from 1 to
//   1048576m, optionally followed by k (x1024) or m (x1024^2)
// REQUIRES: min <= max. Thread-safe.
ABSL_MUST_USE_RESULT absl::StatusOr<uint64_t> ParseByteCount(
    absl::string_view name, absl::string_view value, bool allow_g, uint64_t min,
    uint64_t max);

// Parses a duration: "<digits>" is milliseconds (nginx's default unit), and
// "<digits><unit>" takes the unit us, ms or s (lower case only). Returns
// nanoseconds in [min_ns, max_ns]; errors as for ParseByteCount.
// REQUIRES: min_ns <= max_ns. Thread-safe.
ABSL_MUST_USE_RESULT absl::StatusOr<int64_t> ParseDurationNs(
    absl::string_view name, absl::string_view value, int64_t min_ns,
    int64_t max_ns);

// Formats `bytes` in the largest unit that divides it exactly, so that the
// text parses back to the same value: 1048576 -> "1m", 1536 -> "1536" (not
// "1.5k", which ParseByteCount refuses). The g unit is used only when
// `allow_g`, matching what the variable accepts. For messages and the CLI.
std::string FormatByteCount(uint64_t bytes, bool allow_g);

// Formats a duration in the largest of s, ms and us that divides it exactly
// ("200ms", "60s"); falls back to "<n>ns", which ParseDurationNs does not
// accept, only when no accepted unit is exact.
std::string FormatDurationNs(int64_t ns);

// Quotes a user-supplied value for a one-line error message: C-escaped (so a
// newline in an environment variable cannot split the message), in double
// quotes, and cut after 64 bytes with a trailing "..." so a huge value cannot
// flood the log.
std::string QuoteForMessage(absl::string_view value);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_BASE_UNITS_H_
