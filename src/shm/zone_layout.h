// The layout of the shared memory zone /trafficrate.<zone>.
//
// Every process of a server (and the CLI) maps the same segment, each at its
// own address, so the layout holds no pointers: slots are addressed by index.
// Every field read without the zone lock is a lock-free std::atomic; the rest
// is guarded by ZoneHeaderShm::lock. Any change here bumps kZoneLayoutVersion;
// tests/shm/zone_layout_test.cc pins the sizes and offsets.
//
//   header | bucket heads (uint32) | key slots | connection slots | proc slots
//          | handoff slots
//
// Keys:        one slot per client key, chained from a bucket array hashed with
//              SipHash and a per-zone random seed.
// Connections: one slot per governed connection, owned by one process; the
//              source of truth from which key counts can be rebuilt.
// Processes:   one slot per process that owns connections, with a robust
//              mutex its watcher thread holds for life (the liveness token).
// Handoffs:    one slot per governed socket passed to another process and
//              not yet received (an eighth of the connection slots).

#ifndef TRAFFICRATE_SRC_SHM_ZONE_LAYOUT_H_
#define TRAFFICRATE_SRC_SHM_ZONE_LAYOUT_H_

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace trafficrate {

inline constexpr uint64_t kZoneMagic = 0x6574617263667274ULL;  // "trfcrate"
inline constexpr uint32_t kZoneLayoutVersion = 11;
inline constexpr uint32_t kNoSlot = 0xFFFFFFFFu;
inline constexpr size_t kKeyBytes = 20;

struct KeySlotShm {
  uint8_t key[kKeyBytes];            // ConnKey bytes
  uint32_t next;                     // bucket chain, or free list; kNoSlot ends
  std::atomic<uint32_t> in_use;      // 1 while the slot holds a key
  std::atomic<uint32_t> refs;        // registered connections, all processes
  std::atomic<uint32_t> active;      // sending connections, all processes
  std::atomic<uint32_t> generation;  // bumped on every join and leave
  std::atomic<uint64_t> bytes_closed;  // bytes of connections already gone
  // CLOCK_MONOTONIC of the last insert, join, leave or close: while the key
  // has sending connections it is active now, else this is when it stopped.
  std::atomic<int64_t> last_active_ns;
  std::atomic<uint64_t> connections_served;  // registered since inserted
  // The shared budget (budget.h). sent_bytes is added to by each owner of
  // a connection of the key as it measures what left the socket; the rest
  // is written by the holder of the lease only, without the zone lock.
  std::atomic<uint64_t> sent_bytes;  // left the key's sockets, ever
  std::atomic<uint64_t> lease;       // a LeaseWord (key_budget.h)
  std::atomic<int64_t> budget_last_ns;
  std::atomic<uint64_t> budget_sent_bytes;
  std::atomic<int64_t> balance_bytes;         // < 0: debt
  std::atomic<uint64_t> level_bytes_per_sec;  // cap in force; 0: none yet
  std::atomic<uint64_t> measured_bytes_per_sec;
  std::atomic<uint32_t> boost;  // 16.16; UINT32_MAX: unbound
  // Low 8 bits: ticks in a row clearly under the rate; bits 8-16: the
  // largest packet of its connections at the last tick, in units of 256
  // bytes (both written by the lease holder); bits 17-31: how many of its
  // sending connections send less than their pacing allows (the host has
  // nothing queued, or the client reads slowly), as their owners last saw
  // (each adds and takes off its own). A BudgetAux (key_budget.h).
  std::atomic<uint32_t> budget_aux;
  // Budget mode: the unpaced first segments of new connections not yet
  // forgiven (each join of a connection that never sent adds them; the
  // lease holder takes off what it forgave or let lapse), when the key's
  // current run of sending began, and what it may still forgive outside
  // that run's first moments (BudgetState::start_allowance_bytes).
  std::atomic<uint64_t> start_pending;
  std::atomic<int64_t> budget_start_ns;
  std::atomic<uint64_t> start_allowance;
  // Fleet sharing (cluster_agent.h), written by the zone's cluster agent
  // only: this host's budget for the key (its max-min share of the rate
  // across hosts; 0: none, the rule's rate), and, as of the last exchange,
  // the key's sending connections on every host and the hosts they are on.
  std::atomic<uint64_t> cluster_share;
  std::atomic<uint32_t> cluster_active;
  std::atomic<uint32_t> cluster_hosts;
};

struct ConnSlotShm {
  std::atomic<uint32_t> seq;  // odd while in use; bumped on alloc/free
  std::atomic<uint32_t> key_index;
  std::atomic<uint32_t> proc_index;  // owning process slot
  std::atomic<int32_t> fd;           // fd number in the owning process
  std::atomic<uint32_t> active;      // 1 while counted in its key's active
  uint32_t next_free;                // free list; kNoSlot ends
  std::atomic<uint64_t> share_bytes_per_sec;  // last share applied
  std::atomic<uint64_t> bytes_sent;
  uint8_t peer[16];    // client address, IPv6 or v4-mapped
  uint16_t peer_port;  // host order
  // 1 while counted in its key's under_pace; written by its owner, cleared
  // by whoever takes it out of its key (zone.cc: an exchange decides who
  // takes it off the count).
  std::atomic<uint16_t> under_pace;
  // Its socket passed to another process and not yet received: the index
  // of that handoff slot + 1 (0: none). Under the zone lock.
  std::atomic<uint32_t> handoff;
  // Of bytes_sent, how many had left the socket when its owner last looked
  // (budget mode). Only the owner writes it.
  std::atomic<uint64_t> bytes_left;
  // Closed with this much still unsent: the connection keeps its place in
  // its key while the kernel drains it (budget mode). 0: not draining.
  std::atomic<uint64_t> drain_bytes;
};

// A governed connection's socket passed to another process (sendmsg with
// SCM_RIGHTS) and not yet received: the receiver finds it by the socket's
// inode and takes the registration over. All fields are written under the
// zone lock; a receiver peeks at `inode` without it. The table has a slot
// for every eighth connection slot, at least kMinHandoffSlots.
struct HandoffSlotShm {
  std::atomic<uint64_t> inode;   // the socket's st_ino; 0: free
  std::atomic<uint32_t> conn;    // connection slot
  std::atomic<uint32_t> cookie;  // its cookie when passed (Zone::CookieOf)
  std::atomic<uint32_t> proc;    // the sender's process slot
  uint32_t reserved;
  std::atomic<int64_t> since_ns;  // CLOCK_MONOTONIC when passed
};
inline constexpr uint32_t kMinHandoffSlots = 32;

// One rule of the zone (rules_file.h): its name and live settings. A key's
// rule is byte kKeyRuleByte of its key bytes. Rule 0's rate, key and burst
// are the header's own fields (rate_bytes_per_sec, key_spec, burst_bytes):
// the one rule of a server configured by TRAFFICRATE_RATE, or the first
// rule of a rules file. Rules 1.. have their settings here; a slot whose
// rate is 0 is unused. Written by the last server started and by `trafficrate
// set --rule`, without the zone lock (each field is an atomic, the name one
// relaxed byte at a time); read by anyone.
inline constexpr uint32_t kZoneRules = 16;
inline constexpr size_t kRuleNameBytes = 32;
inline constexpr size_t kKeyRuleByte = 18;
struct RuleSlotShm {
  uint8_t name[kRuleNameBytes];  // NUL-padded; empty for rule 0: "default"
  std::atomic<uint64_t> rate_bytes_per_sec;  // rules 1..; 0: unused
  std::atomic<uint64_t> burst_bytes;         // rules 1..; 0: the default
  std::atomic<uint32_t> key_spec;            // rules 1..; PackKeySpec
  uint32_t reserved0;
  uint64_t reserved1;
};

// The zone's cluster agent: the lease (one process per zone exchanges with
// the other hosts), its state and counters for stat, and its URL and host
// id as shown. Written by the lease holder only, without the zone lock
// (text one relaxed byte at a time); read by anyone.
enum ClusterState : uint32_t {
  kClusterOff = 0,  // no agent has run in this zone
  kClusterConnecting = 1,
  kClusterConnected = 2,
  kClusterFallback = 3,  // Redis away: the local policy (cluster_agent.h)
};
inline constexpr size_t kClusterTextBytes = 96;
// Key slots' cluster shares count while the agent's beat is at most this
// old: an agent that died (and no process of the zone took over) leaves
// every key its rule's rate.
inline constexpr int64_t kClusterStaleNs = 2'000'000'000;
struct ClusterShm {
  std::atomic<uint64_t> lease;  // a LeaseWord (key_budget.h)
  // CLOCK_MONOTONIC of the agent's last pass, successful or not: key slots'
  // cluster_share counts only while this is recent (Zone::KeyRate).
  std::atomic<int64_t> beat_ns;
  std::atomic<int64_t> last_exchange_ns;  // the last successful one
  std::atomic<uint32_t> state;            // ClusterState
  std::atomic<uint32_t> peers;            // other hosts at the last exchange
  std::atomic<uint32_t> rtt_us;           // its round trip
  std::atomic<int32_t> pid;               // the lease holder's
  std::atomic<uint64_t> exchanges;        // successful
  std::atomic<uint64_t> failures;         // failed (each pass)
  std::atomic<uint64_t> fallbacks;        // times it fell back
  uint8_t url[kClusterTextBytes];         // DescribeClusterUrl, NUL-padded
  uint8_t name[kClusterTextBytes];        // TRAFFICRATE_CLUSTER_NAME
  uint8_t host[kClusterTextBytes];        // this host's id in Redis
};

enum ProcState : uint32_t { kProcFree = 0, kProcLive = 1 };

// How a process took the last `trafficrate reload` (ProcSlotShm).
enum ReloadStatus : uint16_t {
  kReloadNone = 0,        // none handled yet
  kReloadOk = 1,          // read and installed
  kReloadNoFile = 2,      // it has no rules file (TRAFFICRATE_CONFIG unset)
  kReloadUnreadable = 3,  // it could not read it (rules_errno says why)
  kReloadInvalid = 4,     // the file is not a valid rules file
  kReloadBusy = 5,        // the zone lock stayed busy
};

struct ProcSlotShm {
  pthread_mutex_t liveness;     // robust; held by the owner's watcher
  std::atomic<uint32_t> state;  // ProcState
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> conns;  // connections it owns
  // Budget mode, published by its watcher about once a second: the CPU its
  // thread used in the last second, in hundredths of a percent of a core,
  // and the stretch its per-connection work is spaced out by, in
  // hundredths (100: none; cpu_budget.h).
  std::atomic<uint16_t> watcher_cpu;
  std::atomic<uint16_t> watcher_stretch;
  int64_t started_ns;  // CLOCK_MONOTONIC
  // The effective uid the process runs as (who may read its rules file).
  std::atomic<uint32_t> uid;
  // The last rules_generation its watcher handled, and how (ReloadStatus,
  // with the errno of a file it could not read): `trafficrate reload`
  // waits for them and says what each process did.
  std::atomic<uint32_t> rules_seen;
  std::atomic<uint16_t> rules_status;
  std::atomic<uint16_t> rules_errno;
  // Budget mode: when its watcher's next tick is due, in milliseconds of
  // CLOCK_MONOTONIC (low 32 bits; 0: not published, as a process of an
  // older build leaves it). A watcher past it has not counted what its
  // connections sent since (Zone::LatestWatcherLateNs).
  std::atomic<uint32_t> watcher_due_ms;
  // The packet shaper (shaper.h) in this process, since it started: the
  // host's calls it cut, the system calls it made for them, and the pieces
  // they sent.
  std::atomic<uint64_t> shaped_calls;
  std::atomic<uint64_t> shaper_syscalls;
  std::atomic<uint64_t> shaped_pieces;
};

struct ZoneHeaderShm {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t header_size;
  uint64_t zone_size;
  uint32_t key_slot_size;
  uint32_t conn_slot_size;
  uint32_t proc_slot_size;
  uint32_t bucket_count;  // a power of two
  uint32_t key_capacity;
  uint32_t conn_capacity;
  uint32_t proc_capacity;
  uint32_t key_spec;  // PackKeySpec(TRAFFICRATE_KEY)
  uint64_t buckets_offset;
  uint64_t keys_offset;
  uint64_t conns_offset;
  uint64_t procs_offset;
  uint64_t handoffs_offset;
  uint32_t handoff_capacity;
  uint32_t reserved_geometry;
  uint64_t hash_seed[2];
  std::atomic<uint32_t> ready;        // 1 once the creator filled the zone
  std::atomic<uint32_t> change_word;  // futex: bumped on every change
  std::atomic<uint64_t> rate_bytes_per_sec;   // live setting
  std::atomic<uint32_t> settings_generation;  // bumped when settings change
  std::atomic<uint32_t> watchers_waiting;     // skip futex wake when zero
  pthread_mutex_t lock;                       // robust, process-shared
  // Guarded by `lock`.
  uint32_t key_free_head;
  uint32_t conn_free_head;
  uint32_t keys_used;
  uint32_t conns_used;
  // Statistics, updated with relaxed atomics.
  std::atomic<uint64_t> table_full;
  std::atomic<uint64_t> lock_repairs;
  std::atomic<uint64_t> procs_reaped;
  std::atomic<uint64_t> conns_reaped;
  std::atomic<uint32_t> share_mode;  // ShareMode (budget.h), live setting
  // Highest process slot ever claimed, plus one; 0 in a zone made by an
  // older version, which did not keep it. Only a bound for ReapDead's scan.
  std::atomic<uint32_t> procs_high_water;
  std::atomic<uint64_t> burst_bytes;  // live setting; 0: DefaultBurstBytes
  // SipHash of the immutable part (magic to hash_seed, the bytes before
  // `ready`), written by the creator: checked at attach and by every
  // watcher once a second (Zone::HeaderIntact).
  uint64_t header_checksum;
  // Zone locks given up (waited their limit, or found the lock still held
  // after an earlier timeout); the callers passed through.
  std::atomic<uint64_t> lock_timeouts;
  // 1 once a process found the header corrupt: every process then passes
  // through, and the next server started replaces the zone.
  std::atomic<uint32_t> corrupt;
  // Bumped by `trafficrate reload`: every process re-reads its rules file
  // (TRAFFICRATE_CONFIG) for the connections it accepts from then on.
  std::atomic<uint32_t> rules_generation;
  // Handoff slots in use (a bound for the lock-free peeks: 0 skips them).
  std::atomic<uint32_t> handoffs_pending;
  uint8_t reserved1[60];
  RuleSlotShm rules[kZoneRules];
  // Fleet sharing through Redis (cluster_agent.h).
  ClusterShm cluster;
};

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint16_t>::is_always_lock_free);
static_assert(std::is_standard_layout_v<KeySlotShm> &&
              sizeof(KeySlotShm) == 168);
static_assert(std::is_standard_layout_v<ConnSlotShm> &&
              sizeof(ConnSlotShm) == 80);
static_assert(std::is_standard_layout_v<ProcSlotShm> &&
              sizeof(ProcSlotShm) == 104);
static_assert(std::is_standard_layout_v<HandoffSlotShm> &&
              sizeof(HandoffSlotShm) == 32);
static_assert(std::is_standard_layout_v<RuleSlotShm> &&
              sizeof(RuleSlotShm) == 64);
static_assert(std::is_standard_layout_v<ClusterShm> &&
              sizeof(ClusterShm) == 352);
static_assert(std::is_standard_layout_v<ZoneHeaderShm> &&
              sizeof(ZoneHeaderShm) == 1712);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_SHM_ZONE_LAYOUT_H_
