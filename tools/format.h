// Output of the trafficrate CLI: human-readable figures, and `stat` as a
// table, as JSON and as Prometheus text exposition.
//
//   HumanRate(512000)         -> "500 KiB/s"
//   HumanBytes(1288490189)    -> "1.2 GiB"
//   HumanAgo(12 * kNsPerSec)  -> "12s ago"
//   std::string text = FormatStatTable(snapshot, options);

#ifndef TRAFFICRATE_TOOLS_FORMAT_H_
#define TRAFFICRATE_TOOLS_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "src/shm/snapshot.h"

namespace trafficrate {

// Binary units, one decimal below 100 ("1.2 GiB", "500 KiB", "512 B").
std::string HumanBytes(uint64_t bytes);
std::string HumanRate(uint64_t bytes_per_sec);
// "now" below a second, else "12s ago", "5m ago", "3h ago", "2d ago".
std::string HumanAgo(int64_t ns);

// A JSON string literal (quotes included), control characters escaped.
std::string JsonString(absl::string_view text);
// A Prometheus sample value: integers exactly, others with 3 decimals.
std::string PrometheusValue(double value);
// A Prometheus label value (no quotes): \, " and newline escaped.
std::string PrometheusLabel(absl::string_view text);

enum class SortBy { kActive, kBytes };

struct StatOptions {
  size_t top = 0;  // 0: every key
  SortBy sort = SortBy::kActive;
};

// The keys to show: sorted (most active or most bytes first, then by key)
// and cut to options.top.
std::vector<KeySnapshot> SelectKeys(const ZoneSnapshot& snap,
                                    const StatOptions& options);

// Seconds since the key last had a sending connection; 0 while it has one.
double IdleSeconds(const KeySnapshot& key, int64_t now_ns);

// "cluster URL (name N, host H): STATE, pid P, 1 peer, last exchange ...\n":
// the zone's fleet exchange, for stat and top.
std::string ClusterLine(const ClusterSnapshot& cluster);

std::string FormatStatTable(const ZoneSnapshot& snap,
                            const StatOptions& options);
std::string FormatStatJson(const ZoneSnapshot& snap,
                           const StatOptions& options);
std::string FormatStatPrometheus(const ZoneSnapshot& snap,
                                 const StatOptions& options);

}  // namespace trafficrate

#endif  // TRAFFICRATE_TOOLS_FORMAT_H_
