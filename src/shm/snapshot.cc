#include "src/shm/snapshot.h"

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "src/base/clock.h"
#include "src/budget/share.h"
#include "src/net/address.h"
#include "src/shm/key_budget.h"
#include "src/shm/zone.h"

namespace trafficrate {
namespace {

ConnKey KeyOf(const uint8_t (&bytes)[kKeyBytes]) {
  ConnKey key;
  std::memcpy(key.bytes, bytes, sizeof(key.bytes));
  return key;
}

// A NUL-padded text field of the zone, each byte read atomically; bytes no
// writer of ours stores (control bytes, non-ASCII) shown as '?'.
std::string ZoneText(const uint8_t (&field)[kClusterTextBytes]) {
  std::string text;
  for (size_t i = 0; i < kClusterTextBytes; ++i) {
    const uint8_t c = __atomic_load_n(&field[i], __ATOMIC_RELAXED);
    if (c == 0) break;
    text += c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?';
  }
  return text;
}

const char* ClusterStateName(uint32_t state, int64_t beat_ns, int64_t now_ns) {
  if (beat_ns == 0 || now_ns - beat_ns > kClusterStaleNs ||
      beat_ns - now_ns > kClusterStaleNs) {
    return "stale";
  }
  switch (state) {
    case kClusterConnecting:
      return "connecting";
    case kClusterConnected:
      return "connected";
    case kClusterFallback:
      return "fallback";
    default:
      return "stale";
  }
}

// False if no agent has run in the zone.
bool TakeClusterSnapshot(const ClusterShm& c, int64_t now_ns,
                         ClusterSnapshot* out) {
  const uint32_t state = c.state.load(std::memory_order_relaxed);
  if (state == kClusterOff) return false;
  out->state = ClusterStateName(
      state, c.beat_ns.load(std::memory_order_relaxed), now_ns);
  out->url = ZoneText(c.url);
  out->name = ZoneText(c.name);
  out->host = ZoneText(c.host);
  out->pid = c.pid.load(std::memory_order_relaxed);
  out->peers = c.peers.load(std::memory_order_relaxed);
  out->rtt_us = c.rtt_us.load(std::memory_order_relaxed);
  const int64_t last = c.last_exchange_ns.load(std::memory_order_relaxed);
  out->last_exchange_age_ns = last > 0 && last <= now_ns ? now_ns - last : -1;
  out->exchanges = c.exchanges.load(std::memory_order_relaxed);
  out->failures = c.failures.load(std::memory_order_relaxed);
  out->fallbacks = c.fallbacks.load(std::memory_order_relaxed);
  return true;
}

}  // namespace

absl::StatusOr<ZoneSnapshot> TakeSnapshot(const Zone& zone) {
  const ZoneHeaderShm& h = zone.header();
  if (h.magic != kZoneMagic || h.layout_version != kZoneLayoutVersion ||
      !zone.segment().HeaderIntact()) {
    return zone.segment().CorruptStatus("its header changed");
  }
  ZoneSnapshot snap;
  snap.name = zone.name();
  snap.path = zone.path();
  snap.size_bytes = h.zone_size;
  snap.key_spec = zone.settings().key_spec();
  snap.key_capacity = zone.keys().capacity();
  snap.conn_capacity = zone.conns().capacity();
  snap.proc_capacity = zone.procs().capacity();
  snap.rate_bytes_per_sec = h.rate_bytes_per_sec.load();
  snap.share_mode = zone.settings().share_mode();
  snap.burst_bytes = zone.settings().burst_bytes();
  snap.table_full = h.table_full.load();
  snap.lock_repairs = h.lock_repairs.load();
  snap.lock_timeouts = h.lock_timeouts.load();
  snap.procs_reaped = h.procs_reaped.load();
  snap.conns_reaped = h.conns_reaped.load();
  snap.taken_ns = zone.clock().NowNs();
  snap.has_cluster =
      TakeClusterSnapshot(h.cluster, snap.taken_ns, &snap.cluster);
  for (uint32_t rule = 0; rule < kZoneRules; ++rule) {
    const uint64_t rate = zone.settings().RuleRate(rule);
    if (rule > 0 && rate == 0) continue;
    snap.rules.push_back(RuleSnapshot{rule, zone.settings().RuleName(rule),
                                      rate, zone.settings().RuleBurst(rule),
                                      zone.settings().RuleKeySpec(rule)});
  }
  std::vector<uint32_t> key_row(snap.key_capacity, kNoSlot);
  for (uint32_t i = 0; i < snap.key_capacity; ++i) {
    const KeySlotShm& k = zone.keys().slot(i);
    if (!k.in_use.load(std::memory_order_acquire)) continue;
    key_row[i] = static_cast<uint32_t>(snap.keys.size());
    KeySnapshot row;
    uint8_t bytes[kKeyBytes];
    for (size_t b = 0; b < kKeyBytes; ++b) {
      bytes[b] = __atomic_load_n(&k.key[b], __ATOMIC_RELAXED);
    }
    row.rule_index = ZoneSettings::RuleOfKeyBytes(bytes);
    row.rule = zone.settings().RuleName(row.rule_index);
    row.rate_bytes_per_sec = zone.settings().RuleRate(row.rule_index);
    // This host's budget for the key: its fleet share, or the rule's rate.
    const uint64_t rate = zone.settings().KeyRate(k);
    if (snap.has_cluster) {
      row.cluster_active = k.cluster_active.load();
      row.cluster_hosts = k.cluster_hosts.load();
      row.host_share_bytes_per_sec = rate;
    }
    row.key = FormatConnKey(KeyOf(bytes),
                            zone.settings().RuleKeySpec(row.rule_index));
    row.active = k.active.load();
    row.connections = k.refs.load();
    row.share_bytes_per_sec = ShareBytesPerSec(rate, row.active);
    if (snap.share_mode == ShareMode::kBudget) {
      const BudgetState budget = LoadBudget(k);
      row.measured_bytes_per_sec = budget.measured_bytes_per_sec;
      row.level_bytes_per_sec = std::min(budget.level_bytes_per_sec, rate);
      row.debt_bytes = BudgetDebtBytes(budget);
      row.boost = budget.boost == kBoostUnbound
                      ? -1
                      : static_cast<double>(budget.boost) / kBoostOne;
      row.packet_bytes = budget.packet_bytes;
      row.under_pace = UnderPaceOf(k);
      row.share_bytes_per_sec =
          LevelInForce(budget.level_bytes_per_sec, rate, row.active);
    }
    row.bytes_sent = k.bytes_closed.load();
    row.connections_served = k.connections_served.load();
    row.last_active_ns = k.last_active_ns.load();
    snap.keys.push_back(std::move(row));
  }
  for (uint32_t i = 0; i < snap.proc_capacity; ++i) {
    const ProcSlotShm& p = zone.procs().slot(i);
    if (p.state.load() != kProcLive) continue;
    ProcSnapshot row{i, p.pid.load(), p.conns.load(), !ProcTable::MaybeDead(p)};
    row.watcher_cpu_pct = p.watcher_cpu.load() / 100.0;
    row.watcher_stretch = p.watcher_stretch.load() / 100.0;
    row.shaped_calls = p.shaped_calls.load();
    row.shaper_syscalls = p.shaper_syscalls.load();
    row.shaped_pieces = p.shaped_pieces.load();
    snap.processes.push_back(row);
  }
  for (uint32_t i = 0; i < snap.conn_capacity; ++i) {
    const ConnSlotShm& c = zone.conns().slot(i);
    if ((c.seq.load(std::memory_order_acquire) & 1) == 0) continue;
    const uint32_t k = c.key_index.load();
    const uint32_t p = c.proc_index.load();
    ConnSnapshot row;
    row.index = i;
    if (k < snap.key_capacity && key_row[k] != kNoSlot) {
      KeySnapshot& key = snap.keys[key_row[k]];
      row.key = key.key;
      key.bytes_sent += c.bytes_sent.load();
    }
    uint8_t peer[16];
    for (size_t b = 0; b < sizeof(peer); ++b) {
      peer[b] = __atomic_load_n(&c.peer[b], __ATOMIC_RELAXED);
    }
    row.peer = FormatAddressPort(
        peer, __atomic_load_n(&c.peer_port, __ATOMIC_RELAXED));
    row.pid = p < snap.proc_capacity ? zone.procs().slot(p).pid.load() : 0;
    row.fd = c.fd.load();
    row.active = c.active.load() != 0;
    row.share_bytes_per_sec = c.share_bytes_per_sec.load();
    row.draining = c.drain_bytes.load() != 0;
    row.bytes_sent = c.bytes_sent.load();
    snap.connections.push_back(std::move(row));
  }
  std::sort(
      snap.keys.begin(), snap.keys.end(),
      [](const KeySnapshot& a, const KeySnapshot& b) { return a.key < b.key; });
  return snap;
}

size_t LiveProcesses(const ZoneSnapshot& snap) {
  return static_cast<size_t>(
      std::count_if(snap.processes.begin(), snap.processes.end(),
                    [](const ProcSnapshot& p) { return p.alive; }));
}

size_t ActiveConnections(const ZoneSnapshot& snap) {
  return static_cast<size_t>(
      std::count_if(snap.connections.begin(), snap.connections.end(),
                    [](const ConnSnapshot& c) { return c.active; }));
}

}  // namespace trafficrate
