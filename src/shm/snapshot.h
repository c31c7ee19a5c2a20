// A copy of a zone's tables, for `trafficrate stat`/`top` and tests.
//
//   TRAFFICRATE_ASSIGN_OR_RETURN(ZoneSnapshot snap, TakeSnapshot(zone));
//   for (const KeySnapshot& k : snap.keys) ... k.active ... k.share ...
//
// Read without the zone lock, so that looking never blocks a server: every
// field is read atomically and every index is bounds-checked, so a zone that
// changes meanwhile (or is corrupt) gives a snapshot that may be slightly
// inconsistent between keys and connections, never a crash. Not for the hot
// path: it allocates.

#ifndef TRAFFICRATE_SRC_SHM_SNAPSHOT_H_
#define TRAFFICRATE_SRC_SHM_SNAPSHOT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/budget/budget.h"
#include "src/net/key.h"

namespace trafficrate {

class Zone;

struct KeySnapshot {
  std::string key;   // FormatConnKey under its rule's key spec
  std::string rule;  // its rule's name (ZoneSettings::RuleName)
  uint32_t rule_index = 0;
  uint64_t rate_bytes_per_sec = 0;  // its rule's live rate
  uint32_t active = 0;              // sending connections
  uint32_t connections = 0;         // registered connections (sending or idle)
  // What each sending connection may send: max(1, rate / active) in equal
  // mode, the level in budget mode.
  uint64_t share_bytes_per_sec = 0;
  // Budget mode (0 in equal mode): the key's rate of bytes that left its
  // sockets, smoothed over ~0.2 s; the per-connection cap in force; bytes
  // sent over the budget, still to be repaid.
  uint64_t measured_bytes_per_sec = 0;
  uint64_t level_bytes_per_sec = 0;
  uint64_t debt_bytes = 0;
  // Budget mode: the level over the equal share (budget.h), -1 while the
  // key is not held back at all (and in equal mode); the largest packet
  // its connections send, as measured.
  double boost = -1;
  uint32_t packet_bytes = 0;
  // Budget mode: of its sending connections, how many send less than their
  // pacing allows (their owners' last look).
  uint32_t under_pace = 0;
  uint64_t bytes_sent = 0;  // live connections plus those already closed
  uint64_t connections_served = 0;  // registered since the key was inserted
  // CLOCK_MONOTONIC when the key last had a connection join, leave or close;
  // while active > 0 it is sending now.
  int64_t last_active_ns = 0;
  // Fleet sharing (TRAFFICRATE_CLUSTER), once the zone's agent has run:
  // the key's sending connections on every host and the hosts they are on,
  // at the last exchange (0 before the key's first), and this host's budget
  // for the key (ZoneSettings::KeyRate: its share of the rule's rate across the
  // fleet, the rule's rate while it has none).
  uint32_t cluster_active = 0;
  uint32_t cluster_hosts = 0;
  uint64_t host_share_bytes_per_sec = 0;
};

struct ConnSnapshot {
  uint32_t index = 0;
  std::string key;
  std::string peer;  // "127.0.0.2:41234", "[::1]:41234"
  int32_t pid = 0;   // owning process
  int32_t fd = -1;   // fd number in that process
  bool active = false;
  bool draining = false;  // closed, its unsent data still counted (budget)
  uint64_t share_bytes_per_sec = 0;  // pacing last applied
  uint64_t bytes_sent = 0;
};

struct ProcSnapshot {
  uint32_t index = 0;
  int32_t pid = 0;
  uint32_t connections = 0;
  bool alive = true;  // false: dead, not yet reaped
  // Budget mode: its watcher's CPU in the last second, in % of a core, and
  // the stretch its per-connection work is spaced out by (1: none); both 0
  // until published (equal mode, or the first second).
  double watcher_cpu_pct = 0;
  double watcher_stretch = 0;
  // The packet shaper in it (shaper.h): the host's calls it cut, the
  // system calls it made for them, and the pieces they sent.
  uint64_t shaped_calls = 0;
  uint64_t shaper_syscalls = 0;
  uint64_t shaped_pieces = 0;
};

// The zone's fleet exchange (ClusterShm), as its agent last wrote it.
struct ClusterSnapshot {
  // "connecting", "connected", "fallback", or "stale": no agent has
  // exchanged (or tried to) for over kClusterStaleNs, so every key has its
  // rule's full rate here.
  std::string state;
  std::string url;   // the password as ***
  std::string name;  // TRAFFICRATE_CLUSTER_NAME
  std::string host;  // this host's id in Redis
  int32_t pid = 0;   // the process that holds the exchange
  uint32_t peers = 0;
  uint32_t rtt_us = 0;  // the last successful exchange's round trip
  // Since the last successful exchange; -1 before the first.
  int64_t last_exchange_age_ns = -1;
  uint64_t exchanges = 0;
  uint64_t failures = 0;
  uint64_t fallbacks = 0;
};

// A rule in use (rule 0 always, others while their rate is set).
struct RuleSnapshot {
  uint32_t index = 0;
  std::string name;
  uint64_t rate_bytes_per_sec = 0;
  uint64_t burst_bytes = 0;  // in force (budget mode)
  KeySpec key_spec;
};

struct ZoneSnapshot {
  std::string name;
  std::string path;  // its file (Zone::path)
  uint64_t size_bytes = 0;
  uint64_t rate_bytes_per_sec = 0;
  ShareMode share_mode = ShareMode::kEqual;
  uint64_t burst_bytes = 0;  // in force (budget mode)
  KeySpec key_spec;
  uint32_t key_capacity = 0;
  uint32_t conn_capacity = 0;
  uint32_t proc_capacity = 0;
  uint64_t table_full = 0;
  uint64_t lock_repairs = 0;
  uint64_t lock_timeouts = 0;  // zone locks given up, callers passed through
  uint64_t procs_reaped = 0;
  uint64_t conns_reaped = 0;
  int64_t taken_ns = 0;             // CLOCK_MONOTONIC when taken
  std::vector<RuleSnapshot> rules;  // by index
  // Set once a cluster agent has run in the zone (TRAFFICRATE_CLUSTER).
  bool has_cluster = false;
  ClusterSnapshot cluster;
  std::vector<KeySnapshot> keys;
  std::vector<ConnSnapshot> connections;
  std::vector<ProcSnapshot> processes;
};

// Copies the zone's tables without taking its lock. DataLossError if the
// zone's header no longer describes a valid zone (it was overwritten).
absl::StatusOr<ZoneSnapshot> TakeSnapshot(const Zone& zone);

// Live processes (not dead, not yet reaped) registered in the snapshot.
size_t LiveProcesses(const ZoneSnapshot& snap);
// Connections counted as sending.
size_t ActiveConnections(const ZoneSnapshot& snap);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_SHM_SNAPSHOT_H_
