#include "src/snapshot.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "src/share.h"
#include "src/zone.h"

namespace trafficrate {
namespace {

std::string FormatPeer(const uint8_t addr[16], uint16_t port) {
  static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0,    0,
                                          0, 0, 0, 0, 0xff, 0xff};
  char text[INET6_ADDRSTRLEN] = "";
  if (std::memcmp(addr, kMapped, sizeof(kMapped)) == 0) {
    inet_ntop(AF_INET, addr + 12, text, sizeof(text));
    return absl::StrFormat("%s:%u", text, port);
  }
  inet_ntop(AF_INET6, addr, text, sizeof(text));
  return absl::StrFormat("[%s]:%u", text, port);
}

ConnKey KeyOf(const KeySlotShm& slot) {
  ConnKey key;
  std::memcpy(key.bytes, slot.key, sizeof(key.bytes));
  return key;
}

}  // namespace

absl::StatusOr<ZoneSnapshot> TakeSnapshot(Zone& zone) {
  const ZoneHeaderShm& h = zone.header();
  ZoneSnapshot snap;
  snap.name = zone.name();
  snap.size_bytes = h.zone_size;
  snap.key_spec = zone.key_spec();
  snap.key_capacity = h.key_capacity;
  snap.conn_capacity = h.conn_capacity;
  snap.proc_capacity = h.proc_capacity;
  std::vector<uint32_t> key_slot_to_row(h.key_capacity, kNoSlot);
  {
    ZoneLock lock(zone);
    if (!lock.ok()) {
      return absl::UnavailableError(
          absl::StrFormat("cannot lock zone %s", ZoneShmName(zone.name())));
    }
    snap.rate_bytes_per_sec = h.rate_bytes_per_sec.load();
    snap.table_full = h.table_full.load();
    snap.lock_repairs = h.lock_repairs.load();
    snap.procs_reaped = h.procs_reaped.load();
    snap.conns_reaped = h.conns_reaped.load();
    for (uint32_t i = 0; i < h.key_capacity; ++i) {
      const KeySlotShm& k = zone.key(i);
      if (!k.in_use.load()) continue;
      key_slot_to_row[i] = static_cast<uint32_t>(snap.keys.size());
      KeySnapshot row;
      row.key = FormatConnKey(KeyOf(k), snap.key_spec);
      row.active = k.active.load();
      row.connections = k.refs.load();
      row.share_bytes_per_sec =
          ShareBytesPerSec(snap.rate_bytes_per_sec, row.active);
      row.bytes_sent = k.bytes_closed.load();
      snap.keys.push_back(std::move(row));
    }
    for (uint32_t i = 0; i < h.proc_capacity; ++i) {
      const ProcSlotShm& p = zone.proc(i);
      if (p.state.load() != kProcLive) continue;
      snap.processes.push_back(ProcSnapshot{i, p.pid.load(), p.conns.load(),
                                            !Zone::ProcMaybeDead(p)});
    }
    for (uint32_t i = 0; i < h.conn_capacity; ++i) {
      const ConnSlotShm& c = zone.conn(i);
      if ((c.seq.load() & 1) == 0) continue;
      const uint32_t k = c.key_index.load();
      const uint32_t p = c.proc_index.load();
      ConnSnapshot row;
      row.index = i;
      if (k < h.key_capacity && key_slot_to_row[k] != kNoSlot) {
        KeySnapshot& key = snap.keys[key_slot_to_row[k]];
        row.key = key.key;
        key.bytes_sent += c.bytes_sent.load();
      }
      row.peer = FormatPeer(c.peer, c.peer_port);
      row.pid = p < h.proc_capacity ? zone.proc(p).pid.load() : 0;
      row.fd = c.fd.load();
      row.active = c.active.load() != 0;
      row.share_bytes_per_sec = c.share_bytes_per_sec.load();
      row.bytes_sent = c.bytes_sent.load();
      snap.connections.push_back(std::move(row));
    }
  }
  std::sort(
      snap.keys.begin(), snap.keys.end(),
      [](const KeySnapshot& a, const KeySnapshot& b) { return a.key < b.key; });
  return snap;
}

}  // namespace trafficrate
