// A key's shared-budget state as it lives in the zone (KeySlotShm), and the
// per-key lease that lets one process at a time decide the key's level.
//
//   if (TryTakeLease(key, proc, now_ns)) {
//     BudgetState state = LoadBudget(key);
//     ... state = BudgetTick(state, input, settings); ...
//     StoreBudget(key, state);
//   }
//
// Hot path safe: atomics only, no allocation, errno untouched.

#ifndef TRAFFICRATE_SRC_SHM_KEY_BUDGET_H_
#define TRAFFICRATE_SRC_SHM_KEY_BUDGET_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "src/budget/budget.h"
#include "src/budget/share.h"
#include "src/shm/zone_layout.h"

namespace trafficrate {

// A lease lasts three ticks: its holder renews it every tick, and another
// process takes over within 60 ms of the holder's death or stall.
inline constexpr int64_t kLeaseMs = 3 * kBudgetTickNs / 1'000'000;

// A lease word (KeySlotShm::lease, ClusterShm::lease), as a value: the
// holder's process slot + 1 in the top 16 bits (0: free), and when the lease
// ends, in CLOCK_MONOTONIC milliseconds, in the low 48 bits.
//
//   const LeaseWord lease = LeaseWord::From(key.lease.load());
//   if (lease.held() && lease.holder() != me) ...  // another's, maybe live
//   key.lease.store(LeaseWord::Held(me, now_ms + kLeaseMs).word());
//
// Trivially copyable, one uint64_t; constexpr throughout.
class LeaseWord {
 public:
  constexpr LeaseWord() = default;  // free
  static constexpr LeaseWord From(uint64_t word) { return LeaseWord(word); }
  // REQUIRES: proc < 65535 (process slots are fewer).
  static constexpr LeaseWord Held(uint32_t proc, uint64_t expiry_ms) {
    return LeaseWord((uint64_t{proc} + 1) << 48 | (expiry_ms & kExpiryMask));
  }

  constexpr uint64_t word() const { return word_; }
  constexpr bool held() const { return (word_ >> 48) != 0; }
  // REQUIRES: held().
  constexpr uint32_t holder() const {
    return static_cast<uint32_t>(word_ >> 48) - 1;
  }
  constexpr uint64_t expiry_ms() const { return word_ & kExpiryMask; }

  friend constexpr bool operator==(LeaseWord a, LeaseWord b) {
    return a.word_ == b.word_;
  }
  friend constexpr bool operator!=(LeaseWord a, LeaseWord b) {
    return a.word_ != b.word_;
  }

 private:
  static constexpr uint64_t kExpiryMask = (uint64_t{1} << 48) - 1;

  explicit constexpr LeaseWord(uint64_t word) : word_(word) {}

  uint64_t word_ = 0;
};
static_assert(std::is_trivially_copyable_v<LeaseWord> &&
              sizeof(LeaseWord) == sizeof(uint64_t));

// Takes (or renews) the lease in `word` for `proc` for lease_ms if it is
// free, expired or its own (or ends more than lease_ms ahead, which no
// holder writes).
inline bool TryTakeLeaseWord(std::atomic<uint64_t>& word, uint32_t proc,
                             int64_t now_ns, int64_t lease_ms) {
  const uint64_t now_ms = static_cast<uint64_t>(now_ns / 1'000'000);
  uint64_t seen = word.load(std::memory_order_acquire);
  const LeaseWord lease = LeaseWord::From(seen);
  // A lease ending further ahead than any holder could have set it was not
  // written by one (a corrupt zone): it is free, or nobody would ever act.
  if (lease.held() && lease.holder() != proc && lease.expiry_ms() > now_ms &&
      lease.expiry_ms() - now_ms <= static_cast<uint64_t>(lease_ms)) {
    return false;
  }
  const LeaseWord mine =
      LeaseWord::Held(proc, now_ms + static_cast<uint64_t>(lease_ms));
  return word.compare_exchange_strong(seen, mine.word(),
                                      std::memory_order_acq_rel);
}

// Takes or renews the key's lease for process slot proc (below 65535).
// False while another live process holds it.
inline bool TryTakeLease(KeySlotShm& key, uint32_t proc, int64_t now_ns) {
  return TryTakeLeaseWord(key.lease, proc, now_ns, kLeaseMs);
}

// KeySlotShm::budget_aux, as a value: what the lease holder writes (the
// ticks in a row clearly under the rate, bits 0-7; the largest packet of the
// key's connections at the last tick, bits 8-16, in units of 256 bytes) and
// how many of the key's sending connections send less than their pacing
// allows (bits 17-31), which their owners add to and take off.
//
//   const BudgetAux aux = BudgetAux::From(key.budget_aux.load());
//   aux.under_ticks(); aux.packet_bytes(); aux.under_pace();
//
// Trivially copyable, one uint32_t; constexpr throughout.
class BudgetAux {
 public:
  // The holder's part of the word: a fetch_and with it clears the count.
  static constexpr uint32_t kHolderMask = (uint32_t{1} << 17) - 1;

  constexpr BudgetAux() = default;
  static constexpr BudgetAux From(uint32_t word) { return BudgetAux(word); }
  // The holder's part alone (a count of 0), each field held at its largest:
  // 255 ticks, 511 x 256 bytes (a packet's size is rounded down to 256).
  static constexpr BudgetAux Holder(uint32_t under_ticks,
                                    uint32_t packet_bytes) {
    return BudgetAux(std::min(under_ticks, kUnderTicksMax) |
                     std::min(packet_bytes / 256, kPacketUnitsMax)
                         << kPacketShift);
  }

  constexpr uint32_t word() const { return word_; }
  constexpr uint32_t under_ticks() const { return word_ & kUnderTicksMax; }
  constexpr uint32_t packet_bytes() const {
    return ((word_ & kHolderMask) >> kPacketShift) * 256;
  }
  constexpr uint32_t under_pace() const { return word_ >> kUnderPaceShift; }
  // Whether the count is at its largest (AddUnderPace then adds no more).
  constexpr bool under_pace_full() const {
    return under_pace() >= kUnderPaceMax;
  }

  // This word with the holder's part of `holder`, the count kept.
  constexpr BudgetAux WithHolder(BudgetAux holder) const {
    return BudgetAux((word_ & ~kHolderMask) | (holder.word_ & kHolderMask));
  }
  // One more in the count. REQUIRES: !under_pace_full().
  constexpr BudgetAux PlusUnderPace() const {
    return BudgetAux(word_ + (uint32_t{1} << kUnderPaceShift));
  }
  // One fewer in the count. REQUIRES: under_pace() > 0.
  constexpr BudgetAux MinusUnderPace() const {
    return BudgetAux(word_ - (uint32_t{1} << kUnderPaceShift));
  }

  friend constexpr bool operator==(BudgetAux a, BudgetAux b) {
    return a.word_ == b.word_;
  }
  friend constexpr bool operator!=(BudgetAux a, BudgetAux b) {
    return a.word_ != b.word_;
  }

 private:
  static constexpr uint32_t kUnderTicksMax = 0xff;  // 8 bits
  static constexpr int kPacketShift = 8;
  static constexpr uint32_t kPacketUnitsMax = 0x1ff;  // 9 bits, x 256 bytes
  static constexpr int kUnderPaceShift = 17;
  static constexpr uint32_t kUnderPaceMax = UINT32_MAX >> kUnderPaceShift;

  explicit constexpr BudgetAux(uint32_t word) : word_(word) {}

  uint32_t word_ = 0;
};
static_assert(std::is_trivially_copyable_v<BudgetAux> &&
              sizeof(BudgetAux) == sizeof(uint32_t));

// Of the key's sending connections, how many send less than their pacing
// allows (BudgetInput::under).
inline uint32_t UnderPaceOf(const KeySlotShm& key) {
  return BudgetAux::From(key.budget_aux.load(std::memory_order_relaxed))
      .under_pace();
}

// Adds one to that count; false (and nothing added) once it is full.
inline bool AddUnderPace(KeySlotShm& key) {
  uint32_t seen = key.budget_aux.load(std::memory_order_relaxed);
  do {
    if (BudgetAux::From(seen).under_pace_full()) return false;
  } while (!key.budget_aux.compare_exchange_weak(
      seen, BudgetAux::From(seen).PlusUnderPace().word(),
      std::memory_order_relaxed));
  return true;
}

// Takes one off it (never below 0).
inline void DropUnderPace(KeySlotShm& key) {
  uint32_t seen = key.budget_aux.load(std::memory_order_relaxed);
  while (BudgetAux::From(seen).under_pace() > 0 &&
         !key.budget_aux.compare_exchange_weak(
             seen, BudgetAux::From(seen).MinusUnderPace().word(),
             std::memory_order_relaxed)) {
  }
}

inline void ClearUnderPace(KeySlotShm& key) {
  key.budget_aux.fetch_and(BudgetAux::kHolderMask, std::memory_order_relaxed);
}

inline BudgetState LoadBudget(const KeySlotShm& key) {
  BudgetState s;
  s.last_ns = key.budget_last_ns.load(std::memory_order_relaxed);
  s.sent_bytes = key.budget_sent_bytes.load(std::memory_order_relaxed);
  s.balance_bytes = key.balance_bytes.load(std::memory_order_relaxed);
  s.level_bytes_per_sec =
      key.level_bytes_per_sec.load(std::memory_order_relaxed);
  s.measured_bytes_per_sec =
      key.measured_bytes_per_sec.load(std::memory_order_relaxed);
  const uint32_t boost = key.boost.load(std::memory_order_relaxed);
  s.boost = boost != 0 ? boost : kBoostOne;
  const BudgetAux aux =
      BudgetAux::From(key.budget_aux.load(std::memory_order_relaxed));
  s.under_ticks = aux.under_ticks();
  s.packet_bytes = aux.packet_bytes();
  s.start_ns = key.budget_start_ns.load(std::memory_order_relaxed);
  s.start_allowance_bytes = key.start_allowance.load(std::memory_order_relaxed);
  return s;
}

inline void StoreBudget(KeySlotShm& key, const BudgetState& s) {
  key.budget_last_ns.store(s.last_ns, std::memory_order_relaxed);
  key.budget_sent_bytes.store(s.sent_bytes, std::memory_order_relaxed);
  key.balance_bytes.store(s.balance_bytes, std::memory_order_relaxed);
  key.level_bytes_per_sec.store(s.level_bytes_per_sec,
                                std::memory_order_relaxed);
  key.measured_bytes_per_sec.store(s.measured_bytes_per_sec,
                                   std::memory_order_relaxed);
  key.boost.store(s.boost, std::memory_order_relaxed);
  key.budget_start_ns.store(s.start_ns, std::memory_order_relaxed);
  key.start_allowance.store(s.start_allowance_bytes, std::memory_order_relaxed);
  const BudgetAux mine = BudgetAux::Holder(s.under_ticks, s.packet_bytes);
  // The count of connections under their pace is kept as it is.
  uint32_t seen = key.budget_aux.load(std::memory_order_relaxed);
  while (!key.budget_aux.compare_exchange_weak(
      seen, BudgetAux::From(seen).WithHolder(mine).word(),
      std::memory_order_relaxed)) {
  }
}

// The pacing rate of each sending connection of a key in budget mode: its
// level, at most the rate; before the key has a level, an equal split.
inline uint64_t LevelInForce(uint64_t level_bytes_per_sec,
                             uint64_t rate_bytes_per_sec, uint32_t active) {
  if (level_bytes_per_sec == 0) {
    return ShareBytesPerSec(rate_bytes_per_sec, active);
  }
  return std::max<uint64_t>(1,
                            std::min(level_bytes_per_sec, rate_bytes_per_sec));
}

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_SHM_KEY_BUDGET_H_
