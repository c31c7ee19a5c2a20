// The frames of `trafficrate top`, separated from the terminal handling so
// that they can be tested.

#ifndef TRAFFICRATE_TOOLS_TOP_H_
#define TRAFFICRATE_TOOLS_TOP_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "src/shm/snapshot.h"

namespace trafficrate {

struct TopRow {
  KeySnapshot key;
  uint64_t bytes_per_sec;  // over the interval since the previous snapshot
};

// Keys by rate since `before` (null: rate 0), busiest first, at most limit.
std::vector<TopRow> TopRows(const ZoneSnapshot& now, const ZoneSnapshot* before,
                            size_t limit);
// "[#####.....]": bytes_per_sec against limit, width characters inside.
std::string TopBar(uint64_t bytes_per_sec, uint64_t limit, int width);
// One screen for a terminal of columns x rows.
std::string FormatTopFrame(const ZoneSnapshot& now, const ZoneSnapshot* before,
                           int columns, int rows);

}  // namespace trafficrate

#endif  // TRAFFICRATE_TOOLS_TOP_H_
