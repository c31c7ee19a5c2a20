// libFuzzer target: a zone image from the input (fuzz_util.h: a raw shm
// object to attach to, or a valid zone whose tables, or header and tables,
// are overwritten), then a script of the zone's read and write paths run on
// it, Governor-free: key lookups and inserts, connection register, join,
// leave, transfer and deregister, process claims and reaps, repair, live
// settings, the budget controller's tick on a key's stored state, and a
// snapshot. The coverage-guided counterpart of
// tests/runtime/zone_garbage_test.cc. Issue 8's rule: no crash, no undefined
// behaviour, no unbounded loop (libFuzzer's -timeout), and every index a
// function returns is a slot of the zone or kNoSlot.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/base/clock.h"
#include "src/budget/budget.h"
#include "src/budget/share.h"
#include "src/net/key.h"
#include "src/shm/key_budget.h"
#include "src/shm/snapshot.h"
#include "src/shm/zone.h"
#include "src/shm/zone_layout.h"
#include "tests/fuzz/fuzz_util.h"

namespace trafficrate {
namespace fuzz {
namespace {

// Reads the script one byte at a time; zeros once it is used up.
class Script {
 public:
  explicit Script(const uint8_t (&bytes)[kScriptBytes]) : bytes_(bytes) {}
  bool done() const { return at_ >= kScriptBytes; }
  uint8_t Next() { return at_ < kScriptBytes ? bytes_[at_++] : 0; }

 private:
  const uint8_t (&bytes_)[kScriptBytes];
  size_t at_ = 0;
};

class Runner {
 public:
  explicit Runner(Zone& zone) : zone_(zone) {}
  ~Runner() { ReleaseClaimedProcs(zone_, claimed_); }

  void Run(Script& script) {
    while (!script.done()) Step(script);
  }

 private:
  // An index from one byte: mostly a slot, sometimes one just out of range
  // or kNoSlot; 0xfd is the slot the last insert or register returned.
  static uint32_t IndexOf(uint8_t b, uint32_t capacity, uint32_t last) {
    if (b == 0xff) return kNoSlot;
    if (b == 0xfe) return capacity;
    if (b == 0xfd) return last;
    return b % capacity;
  }
  uint32_t KeyIndex(Script& s) {
    return IndexOf(s.Next(), zone_.keys().capacity(), last_key_);
  }
  uint32_t ConnIndex(Script& s) {
    return IndexOf(s.Next(), zone_.conns().capacity(), last_conn_);
  }
  uint32_t ProcIndex(Script& s) {
    return IndexOf(s.Next(), zone_.procs().capacity(), last_proc_);
  }

  // Key bytes: 127.0.0.b (v4-mapped), or a copy of a slot's key (high bit),
  // which may hit an existing chain.
  void KeyBytes(Script& s, uint8_t out[kKeyBytes]) {
    const uint8_t b = s.Next();
    if (b & 0x80) {
      const KeySlotShm& k =
          zone_.keys().slot((b & 0x7f) % zone_.keys().capacity());
      for (size_t i = 0; i < kKeyBytes; ++i) {
        out[i] = __atomic_load_n(&k.key[i], __ATOMIC_RELAXED);
      }
      return;
    }
    std::memset(out, 0, kKeyBytes);
    out[10] = out[11] = 0xff;
    out[12] = 127;
    out[15] = b;
  }

  void CheckSlot(uint32_t index, uint32_t capacity) {
    TRAFFICRATE_FUZZ_CHECK(index == kNoSlot || index < capacity);
  }

  void Step(Script& s) {
    const uint8_t op = s.Next() % kZoneOpCount;
    switch (op) {
      case kFindKey:
      case kFindOrInsertKey: {
        uint8_t key[kKeyBytes];
        KeyBytes(s, key);
        ZoneLock lock(zone_);
        if (!lock.ok()) return;
        const uint32_t k = op == kFindKey
                               ? zone_.keys().FindLocked(key)
                               : zone_.keys().FindOrInsertLocked(key, now_ns_);
        CheckSlot(k, zone_.keys().capacity());
        if (k != kNoSlot) last_key_ = k;
        return;
      }
      case kRegisterConn: {
        const uint32_t k = KeyIndex(s);
        const uint32_t p = ProcIndex(s);
        const int fd = s.Next();
        uint8_t peer[16] = {};
        peer[10] = peer[11] = 0xff;
        peer[15] = s.Next();
        ZoneLock lock(zone_);
        if (!lock.ok()) return;
        const uint32_t c = zone_.conns().RegisterLocked(k, p, fd, peer, 40000);
        CheckSlot(c, zone_.conns().capacity());
        if (c != kNoSlot) last_conn_ = c;
        return;
      }
      case kJoin:
      case kLeave:
      case kDeregister: {
        const uint32_t c = ConnIndex(s);
        ZoneLock lock(zone_);
        if (!lock.ok()) return;
        if (op == kJoin) {
          (void)zone_.conns().JoinLocked(c);
        } else if (op == kLeave) {
          (void)zone_.conns().LeaveLocked(c);
        } else {
          (void)zone_.conns().DeregisterLocked(c);
        }
        return;
      }
      case kTransfer: {
        const uint32_t c = ConnIndex(s);
        const uint32_t p = ProcIndex(s);
        const int fd = s.Next();
        ZoneLock lock(zone_);
        if (!lock.ok()) return;
        zone_.conns().TransferLocked(c, p, fd);
        return;
      }
      case kSetUnderPace: {
        const uint32_t c = ConnIndex(s);
        zone_.conns().SetUnderPace(c, s.Next() & 1);
        return;
      }
      case kReleaseKey: {
        const uint32_t k = KeyIndex(s);
        ZoneLock lock(zone_);
        if (!lock.ok()) return;
        zone_.keys().ReleaseIfUnusedLocked(k);
        return;
      }
      case kClaimProc: {
        const int32_t pid = 1000 + s.Next();
        ZoneLock lock(zone_);
        if (!lock.ok()) return;
        const uint32_t p = zone_.procs().ClaimLocked(pid, now_ns_);
        CheckSlot(p, zone_.procs().capacity());
        if (p != kNoSlot) {
          claimed_.push_back(p);
          last_proc_ = p;
        }
        return;
      }
      case kReapIfDead: {
        const uint32_t p = ProcIndex(s);
        ZoneLock lock(zone_);
        if (!lock.ok()) return;
        uint32_t conns = 0;
        (void)zone_.procs().ReapIfDeadLocked(p, &conns);
        TRAFFICRATE_FUZZ_CHECK(conns <= zone_.conns().capacity());
        return;
      }
      case kReapDead: {
        uint32_t procs = 0;
        const uint32_t conns = zone_.ReapDead(&procs);
        TRAFFICRATE_FUZZ_CHECK(conns <= zone_.conns().capacity());
        TRAFFICRATE_FUZZ_CHECK(procs <= zone_.procs().capacity());
        return;
      }
      case kRepair: {
        ZoneLock lock(zone_);
        if (!lock.ok()) return;
        zone_.RepairLocked();
        return;
      }
      case kSetShare: {
        const uint8_t b = s.Next();
        zone_.settings().SetShare(
            b & 1 ? ShareMode::kBudget : ShareMode::kEqual,
            b & 2 ? uint64_t{b} << 12 : 0);
        return;
      }
      case kSetRate:
        zone_.settings().SetRate((uint64_t{s.Next()} << 16) + 1);
        return;
      case kSnapshot: {
        absl::StatusOr<ZoneSnapshot> snap = TakeSnapshot(zone_);
        if (snap.ok()) {
          TRAFFICRATE_FUZZ_CHECK(snap->keys.size() <= zone_.keys().capacity());
          TRAFFICRATE_FUZZ_CHECK(snap->connections.size() <=
                                 zone_.conns().capacity());
          TRAFFICRATE_FUZZ_CHECK(snap->processes.size() <=
                                 zone_.procs().capacity());
        }
        return;
      }
      case kReads: {
        const KeySpec spec = zone_.settings().key_spec();
        (void)DescribeKeySpec(spec);
        const BudgetSettings settings = zone_.settings().budget_settings();
        (void)settings;
        (void)zone_.settings().share_mode();
        (void)zone_.settings().burst_bytes();
        (void)zone_.changes().Current();
        uint8_t key[kKeyBytes];
        KeyBytes(s, key);
        TRAFFICRATE_FUZZ_CHECK(zone_.keys().BucketOf(key) <
                               ComputeZoneGeometry(kFuzzZoneSize).bucket_count);
        (void)ProcTable::MaybeDead(
            zone_.procs().slot(ProcIndex(s) % zone_.procs().capacity()));
        now_ns_ += kNsPerMs * s.Next();
        return;
      }
      case kBudgetTick:
        BudgetTickOf(KeyIndex(s), s.Next(), s.Next());
        return;
      case kHandoff: {
        const uint8_t what = s.Next() % 5;
        const uint64_t inode = s.Next();
        const uint32_t c = ConnIndex(s);
        const uint32_t p = ProcIndex(s);
        const uint32_t cookie = s.Next();
        if (what == 4) {
          (void)zone_.handoffs().MayHave(inode);
          (void)zone_.handoffs().HasOld(p, now_ns_);
          (void)zone_.handoffs().MayBeHandedOff(c, cookie);
          return;
        }
        ZoneLock lock(zone_);
        if (!lock.ok()) return;
        if (what == 0) {
          (void)zone_.handoffs().PublishLocked(inode, c, cookie, p, now_ns_);
        } else if (what == 1) {
          uint32_t got = 0;
          CheckSlot(zone_.handoffs().TakeLocked(inode, &got),
                    zone_.conns().capacity());
        } else if (what == 2) {
          zone_.handoffs().WithdrawLocked(inode, p);
        } else {
          uint64_t out[kMinHandoffSlots];
          TRAFFICRATE_FUZZ_CHECK(zone_.handoffs().ExpireLocked(
                                     p, now_ns_, out, kMinHandoffSlots) <=
                                 kMinHandoffSlots);
        }
        return;
      }
      default:
        return;
    }
  }

  // What the lease holder's watcher does for a key (Governor::DecideKey),
  // without the lease: the controller on the state the zone holds.
  void BudgetTickOf(uint32_t key_index, uint8_t packet, uint8_t advance_ms) {
    if (key_index >= zone_.keys().capacity()) return;
    now_ns_ += kNsPerMs * advance_ms;
    KeySlotShm& key = zone_.keys().slot(key_index);
    BudgetState state = LoadBudget(key);
    const uint64_t published = state.level_bytes_per_sec;
    const uint64_t pending = key.start_pending.load(std::memory_order_relaxed);
    const uint32_t active = key.active.load(std::memory_order_relaxed);
    const BudgetSettings settings = zone_.settings().budget_settings();
    const BudgetInput input = {
        now_ns_,          key.sent_bytes.load(std::memory_order_relaxed),
        active,           uint32_t{packet} << 8,
        UnderPaceOf(key), pending,
        kBudgetCountLagNs};
    state = BudgetTick(state, input, settings);
    TRAFFICRATE_FUZZ_CHECK(state.start_pending_bytes <= pending);
    key.start_pending.fetch_sub(pending - state.start_pending_bytes,
                                std::memory_order_relaxed);
    if (!LevelWorthApplying(
            published, state.level_bytes_per_sec,
            ShareBytesPerSec(settings.rate_bytes_per_sec, active))) {
      state.level_bytes_per_sec = published;
    }
    StoreBudget(key, state);
  }

  Zone& zone_;
  std::vector<uint32_t> claimed_;
  uint32_t last_key_ = 0;
  uint32_t last_conn_ = 0;
  uint32_t last_proc_ = 0;
  int64_t now_ns_ = 1000 * kNsPerSec;
};

int FuzzOne(const uint8_t* data, size_t size) {
  static const std::string name = FuzzZoneName("zone");
  const ZoneInput in = ParseZoneInput(data, size);
  std::unique_ptr<Zone> zone = BuildZone(in, name);
  if (zone == nullptr) return 0;
  // Whatever the image said, the geometry in use is the one validated at
  // attach (every zone that attaches here is kFuzzZoneSize bytes).
  const ZoneGeometry g = ComputeZoneGeometry(kFuzzZoneSize);
  TRAFFICRATE_FUZZ_CHECK(zone->keys().capacity() == g.key_capacity);
  TRAFFICRATE_FUZZ_CHECK(zone->conns().capacity() == g.conn_capacity);
  TRAFFICRATE_FUZZ_CHECK(zone->procs().capacity() == g.proc_capacity);
  Script script(in.script);
  Runner(*zone).Run(script);
  return 0;
}

}  // namespace
}  // namespace fuzz
}  // namespace trafficrate

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return trafficrate::fuzz::FuzzOne(data, size);
}
