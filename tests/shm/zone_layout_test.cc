// Pins the shared memory layout. Every process that maps a zone must agree on
// it byte for byte, so a change here must be deliberate: update the pinned
// numbers AND bump kZoneLayoutVersion (and add its fingerprint below).

#include "src/shm/zone_layout.h"

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "src/shm/zone.h"

namespace trafficrate {
namespace {

TEST(ZoneLayoutTest, VersionAndConstantsArePinned) {
  EXPECT_EQ(kZoneLayoutVersion, 11u);
  EXPECT_EQ(kMinHandoffSlots, 32u);
  EXPECT_EQ(kClusterTextBytes, 96u);
  EXPECT_EQ(kZoneRules, 16u);
  EXPECT_EQ(kRuleNameBytes, 32u);
  EXPECT_EQ(kKeyRuleByte, 18u);
  EXPECT_EQ(kZoneMagic, 0x6574617263667274ULL);
  EXPECT_EQ(kNoSlot, 0xFFFFFFFFu);
  EXPECT_EQ(kKeyBytes, 20u);
  EXPECT_EQ(kProcFree, 0u);
  EXPECT_EQ(kProcLive, 1u);
  EXPECT_EQ(sizeof(pthread_mutex_t), 40u);
}

TEST(ZoneLayoutTest, ZoneHeaderShmFieldsArePinned) {
  EXPECT_EQ(sizeof(ZoneHeaderShm), 1712u);
  EXPECT_EQ(alignof(ZoneHeaderShm), 8u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, magic), 0u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, layout_version), 8u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, header_size), 12u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, zone_size), 16u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, key_slot_size), 24u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, conn_slot_size), 28u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, proc_slot_size), 32u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, bucket_count), 36u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, key_capacity), 40u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, conn_capacity), 44u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, proc_capacity), 48u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, key_spec), 52u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, buckets_offset), 56u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, keys_offset), 64u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, conns_offset), 72u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, procs_offset), 80u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, handoffs_offset), 88u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, handoff_capacity), 96u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, reserved_geometry), 100u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, hash_seed), 104u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, ready), 120u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, change_word), 124u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, rate_bytes_per_sec), 128u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, settings_generation), 136u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, watchers_waiting), 140u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, lock), 144u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, key_free_head), 184u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, conn_free_head), 188u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, keys_used), 192u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, conns_used), 196u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, table_full), 200u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, lock_repairs), 208u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, procs_reaped), 216u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, conns_reaped), 224u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, share_mode), 232u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, procs_high_water), 236u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, burst_bytes), 240u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, header_checksum), 248u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, lock_timeouts), 256u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, corrupt), 264u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, rules_generation), 268u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, handoffs_pending), 272u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, reserved1), 276u);
  EXPECT_EQ(sizeof(ZoneHeaderShm::reserved1), 60u);
  EXPECT_EQ(offsetof(ZoneHeaderShm, rules), 336u);
  EXPECT_EQ(sizeof(ZoneHeaderShm::rules), 64u * kZoneRules);
  EXPECT_EQ(offsetof(ZoneHeaderShm, cluster), 1360u);
}

TEST(ZoneLayoutTest, ClusterShmFieldsArePinned) {
  EXPECT_EQ(sizeof(ClusterShm), 352u);
  EXPECT_EQ(offsetof(ClusterShm, lease), 0u);
  EXPECT_EQ(offsetof(ClusterShm, beat_ns), 8u);
  EXPECT_EQ(offsetof(ClusterShm, last_exchange_ns), 16u);
  EXPECT_EQ(offsetof(ClusterShm, state), 24u);
  EXPECT_EQ(offsetof(ClusterShm, peers), 28u);
  EXPECT_EQ(offsetof(ClusterShm, rtt_us), 32u);
  EXPECT_EQ(offsetof(ClusterShm, pid), 36u);
  EXPECT_EQ(offsetof(ClusterShm, exchanges), 40u);
  EXPECT_EQ(offsetof(ClusterShm, failures), 48u);
  EXPECT_EQ(offsetof(ClusterShm, fallbacks), 56u);
  EXPECT_EQ(offsetof(ClusterShm, url), 64u);
  EXPECT_EQ(offsetof(ClusterShm, name), 160u);
  EXPECT_EQ(offsetof(ClusterShm, host), 256u);
  EXPECT_EQ(kClusterOff, 0u);
  EXPECT_EQ(kClusterConnecting, 1u);
  EXPECT_EQ(kClusterConnected, 2u);
  EXPECT_EQ(kClusterFallback, 3u);
}

TEST(ZoneLayoutTest, RuleSlotShmFieldsArePinned) {
  EXPECT_EQ(sizeof(RuleSlotShm), 64u);
  EXPECT_EQ(offsetof(RuleSlotShm, name), 0u);
  EXPECT_EQ(offsetof(RuleSlotShm, rate_bytes_per_sec), 32u);
  EXPECT_EQ(offsetof(RuleSlotShm, burst_bytes), 40u);
  EXPECT_EQ(offsetof(RuleSlotShm, key_spec), 48u);
  EXPECT_EQ(offsetof(RuleSlotShm, reserved1), 56u);
}

TEST(ZoneLayoutTest, HandoffSlotShmFieldsArePinned) {
  EXPECT_EQ(sizeof(HandoffSlotShm), 32u);
  EXPECT_EQ(offsetof(HandoffSlotShm, inode), 0u);
  EXPECT_EQ(offsetof(HandoffSlotShm, conn), 8u);
  EXPECT_EQ(offsetof(HandoffSlotShm, cookie), 12u);
  EXPECT_EQ(offsetof(HandoffSlotShm, proc), 16u);
  EXPECT_EQ(offsetof(HandoffSlotShm, reserved), 20u);
  EXPECT_EQ(offsetof(HandoffSlotShm, since_ns), 24u);
}

TEST(ZoneLayoutTest, KeySlotShmFieldsArePinned) {
  EXPECT_EQ(sizeof(KeySlotShm), 168u);
  EXPECT_EQ(alignof(KeySlotShm), 8u);
  EXPECT_EQ(offsetof(KeySlotShm, key), 0u);
  EXPECT_EQ(sizeof(KeySlotShm::key), 20u);
  EXPECT_EQ(offsetof(KeySlotShm, next), 20u);
  EXPECT_EQ(offsetof(KeySlotShm, in_use), 24u);
  EXPECT_EQ(offsetof(KeySlotShm, refs), 28u);
  EXPECT_EQ(offsetof(KeySlotShm, active), 32u);
  EXPECT_EQ(offsetof(KeySlotShm, generation), 36u);
  EXPECT_EQ(offsetof(KeySlotShm, bytes_closed), 40u);
  EXPECT_EQ(offsetof(KeySlotShm, last_active_ns), 48u);
  EXPECT_EQ(offsetof(KeySlotShm, connections_served), 56u);
  EXPECT_EQ(offsetof(KeySlotShm, sent_bytes), 64u);
  EXPECT_EQ(offsetof(KeySlotShm, lease), 72u);
  EXPECT_EQ(offsetof(KeySlotShm, budget_last_ns), 80u);
  EXPECT_EQ(offsetof(KeySlotShm, budget_sent_bytes), 88u);
  EXPECT_EQ(offsetof(KeySlotShm, balance_bytes), 96u);
  EXPECT_EQ(offsetof(KeySlotShm, level_bytes_per_sec), 104u);
  EXPECT_EQ(offsetof(KeySlotShm, measured_bytes_per_sec), 112u);
  EXPECT_EQ(offsetof(KeySlotShm, boost), 120u);
  EXPECT_EQ(offsetof(KeySlotShm, budget_aux), 124u);
  EXPECT_EQ(offsetof(KeySlotShm, start_pending), 128u);
  EXPECT_EQ(offsetof(KeySlotShm, budget_start_ns), 136u);
  EXPECT_EQ(offsetof(KeySlotShm, start_allowance), 144u);
  EXPECT_EQ(offsetof(KeySlotShm, cluster_share), 152u);
  EXPECT_EQ(offsetof(KeySlotShm, cluster_active), 160u);
  EXPECT_EQ(offsetof(KeySlotShm, cluster_hosts), 164u);
}

TEST(ZoneLayoutTest, ConnSlotShmFieldsArePinned) {
  EXPECT_EQ(sizeof(ConnSlotShm), 80u);
  EXPECT_EQ(alignof(ConnSlotShm), 8u);
  EXPECT_EQ(offsetof(ConnSlotShm, seq), 0u);
  EXPECT_EQ(offsetof(ConnSlotShm, key_index), 4u);
  EXPECT_EQ(offsetof(ConnSlotShm, proc_index), 8u);
  EXPECT_EQ(offsetof(ConnSlotShm, fd), 12u);
  EXPECT_EQ(offsetof(ConnSlotShm, active), 16u);
  EXPECT_EQ(offsetof(ConnSlotShm, next_free), 20u);
  EXPECT_EQ(offsetof(ConnSlotShm, share_bytes_per_sec), 24u);
  EXPECT_EQ(offsetof(ConnSlotShm, bytes_sent), 32u);
  EXPECT_EQ(offsetof(ConnSlotShm, peer), 40u);
  EXPECT_EQ(sizeof(ConnSlotShm::peer), 16u);
  EXPECT_EQ(offsetof(ConnSlotShm, peer_port), 56u);
  EXPECT_EQ(offsetof(ConnSlotShm, under_pace), 58u);
  EXPECT_EQ(offsetof(ConnSlotShm, handoff), 60u);
  EXPECT_EQ(offsetof(ConnSlotShm, bytes_left), 64u);
  EXPECT_EQ(offsetof(ConnSlotShm, drain_bytes), 72u);
}

TEST(ZoneLayoutTest, ProcSlotShmFieldsArePinned) {
  EXPECT_EQ(sizeof(ProcSlotShm), 104u);
  EXPECT_EQ(alignof(ProcSlotShm), 8u);
  EXPECT_EQ(offsetof(ProcSlotShm, liveness), 0u);
  EXPECT_EQ(offsetof(ProcSlotShm, state), 40u);
  EXPECT_EQ(offsetof(ProcSlotShm, pid), 44u);
  EXPECT_EQ(offsetof(ProcSlotShm, conns), 48u);
  EXPECT_EQ(offsetof(ProcSlotShm, watcher_cpu), 52u);
  EXPECT_EQ(offsetof(ProcSlotShm, watcher_stretch), 54u);
  EXPECT_EQ(offsetof(ProcSlotShm, started_ns), 56u);
  EXPECT_EQ(offsetof(ProcSlotShm, uid), 64u);
  EXPECT_EQ(offsetof(ProcSlotShm, rules_seen), 68u);
  EXPECT_EQ(offsetof(ProcSlotShm, rules_status), 72u);
  EXPECT_EQ(offsetof(ProcSlotShm, rules_errno), 74u);
  EXPECT_EQ(offsetof(ProcSlotShm, watcher_due_ms), 76u);
  EXPECT_EQ(offsetof(ProcSlotShm, shaped_calls), 80u);
  EXPECT_EQ(offsetof(ProcSlotShm, shaper_syscalls), 88u);
  EXPECT_EQ(offsetof(ProcSlotShm, shaped_pieces), 96u);
  EXPECT_EQ(kReloadNone, 0u);
  EXPECT_EQ(kReloadOk, 1u);
  EXPECT_EQ(kReloadNoFile, 2u);
  EXPECT_EQ(kReloadUnreadable, 3u);
  EXPECT_EQ(kReloadInvalid, 4u);
  EXPECT_EQ(kReloadBusy, 5u);
}

TEST(ZoneLayoutTest, SlotTypesAreTriviallyCopyableStandardLayout) {
  EXPECT_TRUE(std::is_standard_layout_v<ZoneHeaderShm>);
  EXPECT_TRUE(std::is_standard_layout_v<KeySlotShm>);
  EXPECT_TRUE(std::is_standard_layout_v<ConnSlotShm>);
  EXPECT_TRUE(std::is_standard_layout_v<ProcSlotShm>);
  EXPECT_TRUE(std::is_trivially_destructible_v<KeySlotShm>);
  EXPECT_TRUE(std::is_trivially_destructible_v<ConnSlotShm>);
  EXPECT_TRUE(std::is_trivially_destructible_v<ProcSlotShm>);
  EXPECT_TRUE(std::is_trivially_destructible_v<ZoneHeaderShm>);
}

// FNV-1a over every field's size and offset, in declaration order.
class Fingerprint {
 public:
  void Add(uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      hash_ ^= (v >> (8 * i)) & 0xff;
      hash_ *= 0x100000001b3ULL;
    }
  }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ULL;
};

#define TRAFFICRATE_ADD_FIELD(fp, type, field) \
  do {                                         \
    (fp).Add(offsetof(type, field));           \
    (fp).Add(sizeof(type::field));             \
  } while (0)

uint64_t LayoutFingerprint() {
  Fingerprint fp;
  fp.Add(sizeof(ZoneHeaderShm));
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, magic);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, layout_version);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, header_size);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, zone_size);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, key_slot_size);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, conn_slot_size);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, proc_slot_size);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, bucket_count);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, key_capacity);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, conn_capacity);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, proc_capacity);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, key_spec);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, buckets_offset);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, keys_offset);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, conns_offset);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, procs_offset);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, handoffs_offset);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, handoff_capacity);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, hash_seed);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, ready);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, change_word);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, rate_bytes_per_sec);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, settings_generation);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, watchers_waiting);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, lock);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, key_free_head);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, conn_free_head);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, keys_used);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, conns_used);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, table_full);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, lock_repairs);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, procs_reaped);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, conns_reaped);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, share_mode);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, burst_bytes);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, header_checksum);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, lock_timeouts);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, corrupt);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, rules_generation);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, handoffs_pending);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, rules);
  TRAFFICRATE_ADD_FIELD(fp, ZoneHeaderShm, cluster);
  fp.Add(sizeof(ClusterShm));
  TRAFFICRATE_ADD_FIELD(fp, ClusterShm, lease);
  TRAFFICRATE_ADD_FIELD(fp, ClusterShm, beat_ns);
  TRAFFICRATE_ADD_FIELD(fp, ClusterShm, last_exchange_ns);
  TRAFFICRATE_ADD_FIELD(fp, ClusterShm, state);
  TRAFFICRATE_ADD_FIELD(fp, ClusterShm, peers);
  TRAFFICRATE_ADD_FIELD(fp, ClusterShm, rtt_us);
  TRAFFICRATE_ADD_FIELD(fp, ClusterShm, pid);
  TRAFFICRATE_ADD_FIELD(fp, ClusterShm, exchanges);
  TRAFFICRATE_ADD_FIELD(fp, ClusterShm, failures);
  TRAFFICRATE_ADD_FIELD(fp, ClusterShm, fallbacks);
  TRAFFICRATE_ADD_FIELD(fp, ClusterShm, url);
  TRAFFICRATE_ADD_FIELD(fp, ClusterShm, name);
  TRAFFICRATE_ADD_FIELD(fp, ClusterShm, host);
  fp.Add(sizeof(RuleSlotShm));
  TRAFFICRATE_ADD_FIELD(fp, RuleSlotShm, name);
  TRAFFICRATE_ADD_FIELD(fp, RuleSlotShm, rate_bytes_per_sec);
  TRAFFICRATE_ADD_FIELD(fp, RuleSlotShm, burst_bytes);
  TRAFFICRATE_ADD_FIELD(fp, RuleSlotShm, key_spec);
  fp.Add(sizeof(HandoffSlotShm));
  TRAFFICRATE_ADD_FIELD(fp, HandoffSlotShm, inode);
  TRAFFICRATE_ADD_FIELD(fp, HandoffSlotShm, conn);
  TRAFFICRATE_ADD_FIELD(fp, HandoffSlotShm, cookie);
  TRAFFICRATE_ADD_FIELD(fp, HandoffSlotShm, proc);
  TRAFFICRATE_ADD_FIELD(fp, HandoffSlotShm, since_ns);
  fp.Add(sizeof(KeySlotShm));
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, key);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, next);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, in_use);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, refs);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, active);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, generation);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, bytes_closed);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, last_active_ns);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, connections_served);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, sent_bytes);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, lease);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, budget_last_ns);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, budget_sent_bytes);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, balance_bytes);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, level_bytes_per_sec);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, measured_bytes_per_sec);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, boost);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, budget_aux);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, start_pending);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, budget_start_ns);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, start_allowance);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, cluster_share);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, cluster_active);
  TRAFFICRATE_ADD_FIELD(fp, KeySlotShm, cluster_hosts);
  fp.Add(sizeof(ConnSlotShm));
  TRAFFICRATE_ADD_FIELD(fp, ConnSlotShm, seq);
  TRAFFICRATE_ADD_FIELD(fp, ConnSlotShm, key_index);
  TRAFFICRATE_ADD_FIELD(fp, ConnSlotShm, proc_index);
  TRAFFICRATE_ADD_FIELD(fp, ConnSlotShm, fd);
  TRAFFICRATE_ADD_FIELD(fp, ConnSlotShm, active);
  TRAFFICRATE_ADD_FIELD(fp, ConnSlotShm, next_free);
  TRAFFICRATE_ADD_FIELD(fp, ConnSlotShm, share_bytes_per_sec);
  TRAFFICRATE_ADD_FIELD(fp, ConnSlotShm, bytes_sent);
  TRAFFICRATE_ADD_FIELD(fp, ConnSlotShm, peer);
  TRAFFICRATE_ADD_FIELD(fp, ConnSlotShm, peer_port);
  TRAFFICRATE_ADD_FIELD(fp, ConnSlotShm, under_pace);
  TRAFFICRATE_ADD_FIELD(fp, ConnSlotShm, handoff);
  TRAFFICRATE_ADD_FIELD(fp, ConnSlotShm, bytes_left);
  TRAFFICRATE_ADD_FIELD(fp, ConnSlotShm, drain_bytes);
  fp.Add(sizeof(ProcSlotShm));
  TRAFFICRATE_ADD_FIELD(fp, ProcSlotShm, liveness);
  TRAFFICRATE_ADD_FIELD(fp, ProcSlotShm, state);
  TRAFFICRATE_ADD_FIELD(fp, ProcSlotShm, pid);
  TRAFFICRATE_ADD_FIELD(fp, ProcSlotShm, conns);
  TRAFFICRATE_ADD_FIELD(fp, ProcSlotShm, watcher_cpu);
  TRAFFICRATE_ADD_FIELD(fp, ProcSlotShm, watcher_stretch);
  TRAFFICRATE_ADD_FIELD(fp, ProcSlotShm, started_ns);
  TRAFFICRATE_ADD_FIELD(fp, ProcSlotShm, uid);
  TRAFFICRATE_ADD_FIELD(fp, ProcSlotShm, rules_seen);
  TRAFFICRATE_ADD_FIELD(fp, ProcSlotShm, rules_status);
  TRAFFICRATE_ADD_FIELD(fp, ProcSlotShm, rules_errno);
  if (kZoneLayoutVersion >= 11) {
    TRAFFICRATE_ADD_FIELD(fp, ProcSlotShm, shaped_calls);
    TRAFFICRATE_ADD_FIELD(fp, ProcSlotShm, shaper_syscalls);
    TRAFFICRATE_ADD_FIELD(fp, ProcSlotShm, shaped_pieces);
  }
  return fp.value();
}

// One fingerprint per layout version ever shipped. Changing a field without
// bumping kZoneLayoutVersion breaks this test; bumping it means adding a row.
TEST(ZoneLayoutTest, FingerprintBelongsToTheLayoutVersion) {
  struct Known {
    uint32_t version;
    uint64_t fingerprint;
  };
  constexpr Known kKnown[] = {
      {1, 0x01e422efd798a62cULL},
      {2, 0x678770207850bf9cULL},  // key last_active_ns, connections_served
      {3, 0x969fd228117d097cULL},  // shared budget: key, conn, header fields
      {4, 0x4af1178a17ce20ccULL},  // connections under their pace: key
                                   // budget_aux, conn
      {5, 0x7864305c3c913aceULL},  // process watcher_cpu, watcher_stretch
      {6, 0xa8eba82a77627faaULL},  // header checksum, lock_timeouts, corrupt
      {7, 0xcb5af2b0618510c5ULL},  // header handoffs (passed sockets)
      {8,
       0x65408ca54945c10aULL},  // header rules, rules_generation (rules file)
      {9, 0xcbeea5b6051cc8dbULL},  // header cluster, key cluster share (fleet)
      {10,
       0xd5e7103c786eca9eULL},  // zone files, handoffs sized, reload answers
      {11, 0x45bbd71baf536b46ULL},  // process shaper counters
  };
  const uint64_t fingerprint = LayoutFingerprint();
  bool found = false;
  for (const Known& known : kKnown) {
    if (known.version != kZoneLayoutVersion) continue;
    found = true;
    EXPECT_EQ(known.fingerprint, fingerprint)
        << "the layout changed without a new kZoneLayoutVersion; fingerprint "
        << std::hex << fingerprint;
  }
  EXPECT_TRUE(found) << "add {" << kZoneLayoutVersion << ", 0x" << std::hex
                     << fingerprint << "ULL} to kKnown";
}

// Checks that every region of g lies inside size_bytes, in order, aligned and
// without overlap.
void ExpectGeometryFits(uint64_t size_bytes) {
  SCOPED_TRACE(::testing::Message() << "size " << size_bytes);
  const ZoneGeometry g = ComputeZoneGeometry(size_bytes);
  ASSERT_GT(g.key_capacity, 0u);
  ASSERT_GT(g.conn_capacity, 0u);
  EXPECT_GE(g.proc_capacity, 16u);
  EXPECT_GE(g.bucket_count, g.key_capacity);
  EXPECT_EQ(g.bucket_count & (g.bucket_count - 1), 0u) << "power of two";
  EXPECT_GE(g.buckets_offset, sizeof(ZoneHeaderShm));
  EXPECT_GE(g.keys_offset, g.buckets_offset + 4ULL * g.bucket_count);
  EXPECT_GE(g.conns_offset,
            g.keys_offset + sizeof(KeySlotShm) * g.key_capacity);
  EXPECT_GE(g.procs_offset,
            g.conns_offset + sizeof(ConnSlotShm) * g.conn_capacity);
  const uint64_t end = g.procs_offset + sizeof(ProcSlotShm) * g.proc_capacity;
  EXPECT_LE(end, size_bytes);
  // Slots share cache lines with nothing else; mutexes stay aligned.
  EXPECT_EQ(g.keys_offset % 64, 0u);
  EXPECT_EQ(g.conns_offset % 64, 0u);
  EXPECT_EQ(g.procs_offset % 64, 0u);
  EXPECT_EQ(g.buckets_offset % 8, 0u);
  // The division does not waste the zone.
  EXPECT_GE(end, size_bytes / 100 * 95);
}

TEST(ZoneLayoutTest, GeometryFitsForTypicalSizes) {
  for (const uint64_t size :
       {kMinZoneSize, uint64_t{1} << 20, uint64_t{32} << 20, kMaxZoneSize}) {
    ExpectGeometryFits(size);
  }
}

TEST(ZoneLayoutTest, GeometryFitsForOddSizes) {
  // Sizes that are not powers of two, across the whole accepted range.
  for (uint64_t size = kMinZoneSize; size <= kMaxZoneSize;
       size = size * 5 / 4 + 4097) {
    ExpectGeometryFits(size);
  }
  ExpectGeometryFits(kMinZoneSize + 1);
  ExpectGeometryFits(kMaxZoneSize - 1);
}

TEST(ZoneLayoutTest, CapacitiesGrowWithSize) {
  const uint64_t sizes[] = {kMinZoneSize, uint64_t{1} << 20, uint64_t{32} << 20,
                            kMaxZoneSize};
  ZoneGeometry previous = ComputeZoneGeometry(sizes[0]);
  for (size_t i = 1; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
    const ZoneGeometry g = ComputeZoneGeometry(sizes[i]);
    EXPECT_GT(g.key_capacity, previous.key_capacity) << sizes[i];
    EXPECT_GT(g.conn_capacity, previous.conn_capacity) << sizes[i];
    EXPECT_GE(g.proc_capacity, previous.proc_capacity) << sizes[i];
    previous = g;
  }
}

TEST(ZoneLayoutTest, GeometryIsAPureFunctionOfTheSize) {
  const ZoneGeometry a = ComputeZoneGeometry(3 << 20);
  const ZoneGeometry b = ComputeZoneGeometry(3 << 20);
  EXPECT_EQ(a.key_capacity, b.key_capacity);
  EXPECT_EQ(a.conn_capacity, b.conn_capacity);
  EXPECT_EQ(a.proc_capacity, b.proc_capacity);
  EXPECT_EQ(a.bucket_count, b.bucket_count);
  EXPECT_EQ(a.procs_offset, b.procs_offset);
}

// The default TRAFFICRATE_ZONE_SIZE (1m): docs/operations.md ("Memory")
// states these numbers.
TEST(ZoneLayoutTest, OneMegabyteZoneHoldsStatedCapacities) {
  const ZoneGeometry g = ComputeZoneGeometry(1 << 20);
  EXPECT_EQ(g.key_capacity, 3660u);
  EXPECT_EQ(g.conn_capacity, 3660u);
  EXPECT_EQ(g.proc_capacity, 915u);
  EXPECT_EQ(g.handoff_capacity, 457u);
  EXPECT_EQ(g.bucket_count, 4096u);
  EXPECT_EQ(g.buckets_offset, 1728u);
  EXPECT_EQ(g.keys_offset, 18112u);
}

TEST(ZoneLayoutTest, SmallestZoneHoldsStatedCapacities) {
  const ZoneGeometry g = ComputeZoneGeometry(kMinZoneSize);
  EXPECT_EQ(g.key_capacity, 223u);
  EXPECT_EQ(g.conn_capacity, 223u);
  EXPECT_EQ(g.proc_capacity, 55u);
  EXPECT_EQ(g.handoff_capacity, kMinHandoffSlots);
  EXPECT_EQ(g.bucket_count, 256u);
}

}  // namespace
}  // namespace trafficrate
