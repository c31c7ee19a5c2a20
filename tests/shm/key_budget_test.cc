// The words of a key's shared budget (key_budget.h): the lease word's and
// budget_aux's encode and decode, tested here once, and who may take a
// lease.

#include "src/shm/key_budget.h"

#include <atomic>
#include <cstdint>

#include "gtest/gtest.h"
#include "src/base/clock.h"

namespace trafficrate {
namespace {

TEST(LeaseWordTest, RoundTripsTheHolderHighAndTheExpiryLow) {
  struct Case {
    uint32_t proc;
    uint64_t expiry_ms;
  };
  for (const Case c : {Case{0, 0}, Case{0, 1}, Case{7, 123456789},
                       Case{65534, (uint64_t{1} << 48) - 1}}) {
    const LeaseWord lease = LeaseWord::Held(c.proc, c.expiry_ms);
    EXPECT_EQ(lease.word(), (uint64_t{c.proc} + 1) << 48 | c.expiry_ms);
    EXPECT_TRUE(lease.held());
    EXPECT_EQ(lease.holder(), c.proc);
    EXPECT_EQ(lease.expiry_ms(), c.expiry_ms);
    EXPECT_EQ(LeaseWord::From(lease.word()), lease);
  }
}

TEST(LeaseWordTest, ZeroIsFreeAndTheExpiryKeepsFortyEightBits) {
  EXPECT_EQ(LeaseWord().word(), 0u);
  EXPECT_FALSE(LeaseWord().held());
  EXPECT_FALSE(LeaseWord::From(12345).held()) << "an expiry without a holder";
  EXPECT_EQ(LeaseWord::From(12345).expiry_ms(), 12345u);
  const LeaseWord wrapped = LeaseWord::Held(3, (uint64_t{1} << 48) + 5);
  EXPECT_EQ(wrapped.holder(), 3u) << "the expiry never reaches the holder";
  EXPECT_EQ(wrapped.expiry_ms(), 5u);
}

TEST(LeaseWordTest, ALeaseIsTakenWhenFreeExpiredOrOwnOnly) {
  constexpr int64_t kLeaseMsHere = 60;
  const int64_t now_ns = 1'000 * kNsPerSec;
  const uint64_t now_ms = static_cast<uint64_t>(now_ns / kNsPerMs);
  std::atomic<uint64_t> word{0};
  ASSERT_TRUE(TryTakeLeaseWord(word, 4, now_ns, kLeaseMsHere)) << "free";
  EXPECT_EQ(LeaseWord::From(word.load()),
            LeaseWord::Held(4, now_ms + kLeaseMsHere));
  EXPECT_FALSE(TryTakeLeaseWord(word, 5, now_ns, kLeaseMsHere)) << "4's";
  EXPECT_TRUE(TryTakeLeaseWord(word, 4, now_ns + kNsPerMs, kLeaseMsHere))
      << "renewed by its holder";
  EXPECT_TRUE(TryTakeLeaseWord(word, 5, now_ns + 61 * kNsPerMs, kLeaseMsHere))
      << "expired";
  EXPECT_EQ(LeaseWord::From(word.load()).holder(), 5u);
  // Ending further ahead than any holder sets it: written by none.
  word.store(LeaseWord::Held(4, now_ms + kLeaseMsHere + 1).word());
  EXPECT_TRUE(TryTakeLeaseWord(word, 5, now_ns, kLeaseMsHere));
}

TEST(BudgetAuxTest, RoundTripsTheHoldersFieldsAndTheCount) {
  const BudgetAux holder = BudgetAux::Holder(7, 65536);
  EXPECT_EQ(holder.word(), 7u | 256u << 8);
  EXPECT_EQ(holder.under_ticks(), 7u);
  EXPECT_EQ(holder.packet_bytes(), 65536u);
  EXPECT_EQ(holder.under_pace(), 0u);
  const BudgetAux aux = BudgetAux::From(holder.word() | 3u << 17);
  EXPECT_EQ(aux.under_ticks(), 7u);
  EXPECT_EQ(aux.packet_bytes(), 65536u);
  EXPECT_EQ(aux.under_pace(), 3u);
  EXPECT_EQ(BudgetAux::From(aux.word()), aux);
  EXPECT_EQ(BudgetAux::kHolderMask, 0x1ffffu);
}

TEST(BudgetAuxTest, TheHoldersFieldsAreHeldAtTheirLargest) {
  const BudgetAux most = BudgetAux::Holder(1000, 1 << 30);
  EXPECT_EQ(most.under_ticks(), 255u);
  EXPECT_EQ(most.packet_bytes(), 511u * 256);
  EXPECT_EQ(most.under_pace(), 0u) << "never spills into the count";
  EXPECT_EQ(BudgetAux::Holder(0, 511).packet_bytes(), 256u) << "rounded down";
}

TEST(BudgetAuxTest, TheCountAndTheHoldersPartChangeApart) {
  BudgetAux aux = BudgetAux::Holder(9, 1024);
  aux = aux.PlusUnderPace().PlusUnderPace();
  EXPECT_EQ(aux.under_pace(), 2u);
  EXPECT_EQ(aux.under_ticks(), 9u);
  aux = aux.WithHolder(BudgetAux::Holder(1, 512));
  EXPECT_EQ(aux.under_pace(), 2u) << "the holder keeps the count";
  EXPECT_EQ(aux.under_ticks(), 1u);
  EXPECT_EQ(aux.packet_bytes(), 512u);
  aux = aux.MinusUnderPace();
  EXPECT_EQ(aux.under_pace(), 1u);
  EXPECT_EQ(aux.packet_bytes(), 512u);
  EXPECT_FALSE(aux.under_pace_full());
  const BudgetAux full = BudgetAux::From(~uint32_t{0});
  EXPECT_TRUE(full.under_pace_full());
  EXPECT_EQ(full.under_pace(), 0x7fffu);
  EXPECT_FALSE(full.MinusUnderPace().under_pace_full());
}

}  // namespace
}  // namespace trafficrate
