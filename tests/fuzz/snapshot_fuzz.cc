// libFuzzer target: what `trafficrate stat` and `top` read, on a zone image
// from the input (fuzz_util.h: a raw shm object to attach to, or a valid
// zone whose tables, or header and tables, are overwritten after attach).
// TakeSnapshot reads without the lock, so the zone may hold anything; then
// the snapshot is shown as the table, JSON and Prometheus text and as a
// `top` frame, as the CLI does. No crash, no undefined behaviour, and the
// snapshot never holds more rows than the zone has slots.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/base/clock.h"
#include "src/shm/snapshot.h"
#include "src/shm/zone.h"
#include "tests/fuzz/fuzz_util.h"
#include "tools/format.h"
#include "tools/top.h"

namespace trafficrate {
namespace fuzz {
namespace {

void CheckSnapshot(const Zone& zone, const ZoneSnapshot& snap) {
  TRAFFICRATE_FUZZ_CHECK(snap.keys.size() <= zone.keys().capacity());
  TRAFFICRATE_FUZZ_CHECK(snap.connections.size() <= zone.conns().capacity());
  TRAFFICRATE_FUZZ_CHECK(snap.processes.size() <= zone.procs().capacity());
  TRAFFICRATE_FUZZ_CHECK(LiveProcesses(snap) <= snap.processes.size());
  TRAFFICRATE_FUZZ_CHECK(ActiveConnections(snap) <= snap.connections.size());
  for (const ConnSnapshot& c : snap.connections) {
    TRAFFICRATE_FUZZ_CHECK(c.index < zone.conns().capacity());
  }
  for (const ProcSnapshot& p : snap.processes) {
    TRAFFICRATE_FUZZ_CHECK(p.index < zone.procs().capacity());
  }
}

// The script: [0] --top (0: all), [1] --sort, [2..3] terminal columns and
// rows for `top`, [4] which output.
void Show(const ZoneSnapshot& snap, const ZoneSnapshot* before,
          const uint8_t* script) {
  StatOptions options;
  options.top = script[0] % 8;
  options.sort = script[1] & 1 ? SortBy::kBytes : SortBy::kActive;
  const std::vector<KeySnapshot> keys = SelectKeys(snap, options);
  TRAFFICRATE_FUZZ_CHECK(options.top == 0 || keys.size() <= options.top);
  for (const KeySnapshot& k : keys) {
    TRAFFICRATE_FUZZ_CHECK(IdleSeconds(k, snap.taken_ns) >= 0);
  }
  std::string out;
  switch (script[4] % 3) {
    case 0:
      out = FormatStatTable(snap, options);
      break;
    case 1:
      out = FormatStatJson(snap, options);
      break;
    default:
      out = FormatStatPrometheus(snap, options);
      break;
  }
  TRAFFICRATE_FUZZ_CHECK(!out.empty());
  const ZoneSnapshot* earlier = before;
  const std::vector<TopRow> rows = TopRows(snap, earlier, options.top);
  TRAFFICRATE_FUZZ_CHECK(rows.size() <= options.top);
  (void)FormatTopFrame(snap, earlier, script[2], script[3]);
}

int FuzzOne(const uint8_t* data, size_t size) {
  static const std::string name = FuzzZoneName("snapshot");
  const ZoneInput in = ParseZoneInput(data, size);
  std::unique_ptr<Zone> zone = BuildZone(in, name);
  if (zone == nullptr) return 0;
  absl::StatusOr<ZoneSnapshot> first = TakeSnapshot(*zone);
  if (!first.ok()) {
    TRAFFICRATE_FUZZ_CHECK(!first.status().message().empty());
    return 0;
  }
  CheckSnapshot(*zone, *first);
  Show(*first, nullptr, in.script);
  // A second look, as `top` takes one per refresh: rates over the interval.
  absl::StatusOr<ZoneSnapshot> second = TakeSnapshot(*zone);
  TRAFFICRATE_FUZZ_CHECK(second.ok());
  second->taken_ns = first->taken_ns + kNsPerSec;
  Show(*second, &*first, in.script + 8);
  return 0;
}

}  // namespace
}  // namespace fuzz
}  // namespace trafficrate

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return trafficrate::fuzz::FuzzOne(data, size);
}
