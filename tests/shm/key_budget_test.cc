// The words of a key's shared budget (key_budget.h): the lease word's
// encode and decode, tested here once, and who may take a lease.

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

}  // namespace
}  // namespace trafficrate
